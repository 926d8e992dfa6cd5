package dataplane

// Out of a TX ring: the per-packet path from a guest's TX vring to its
// destinations. A worker serves the TX vring of each queue pair it owns,
// in bursts of up to burstSize chains, in three phases:
//
//  1. gather (virtq.GatherTX): the burst's heads and descriptors are read
//     back to back; a chain real drivers post (one or two descriptors, no
//     offload metadata, in one guest memory region) becomes a frame in
//     the source guest's memory, anything else is left to the walker;
//  2. classify: per frame, read its addresses once and decide where it
//     goes (a pair's MAC cache, the last destination remembered), the
//     flow hash only where a port has several pairs;
//  3. switch, in ring order: a run of frames to one guest is delivered
//     with one hold of its RX vring, one look at its avail index and its
//     buffers taken back to back (unicastRun, or spanRun for buffers
//     smaller than the frames), one copy per frame from the source
//     guest's buffer into the destination's (a flood that reaches one
//     port runs the same way); other frames go one by one
//     (txDirect: the first of a run, floods; txWalk: chains for the
//     walker, offload metadata, DHCP, the uplink). A frame whose
//     destination is full is held (hold.go): the burst ends there and the
//     chains after it are given back untaken.
//
// The burst ends with one used-index publish (one fence) and one
// interrupt decision per RX vring held, and the TX chains are returned
// with one publish. Locking follows netdev.Vring: a TX vring, then at most
// one RX vring at a time (a held RX vring is released before another is
// taken). Nothing here allocates.
//
// Where a frame goes from here:
//
//	deliver.go    into a guest's RX ring (the burst's hold of it, put, forward, deliver)
//	offloads.go   a frame with offload metadata: passed whole, completed or segmented
//	dhcp.go       a DHCP client frame, answered by the dataplane itself
//	uplink_io.go  to the uplink
//	hold.go       a frame whose destination ring is full, kept in its TX ring
//	fault.go      a fault in guest memory or a broken ring cutting a burst short

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/dhcp"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

const (
	burstSize = 32
	ethHeader = 14
	vlanTag   = 4
)

// scratch is a worker's per-burst state, allocated once.
type scratch struct {
	peek    [virtio.NetHdrSize + snapMax]byte // a walked frame's head (at least vswitch.HeaderPeek bytes), checked and delivered from here
	hdr     [virtio.NetHdrSize]byte
	minLen  int            // the shortest frame forward may deliver (offloads.go; else 0)
	off     offloadScratch // offloads.go
	used    [maxMergeBufs]usedElem
	touched [maxTouched]*netdev.Vring
	nt      int
	rx      rxHold
	b       txBurst // the burst being served
	// The chains a burst gathered (virtq.GatherTX), what classify planned
	// for each, and the destinations the plans name (one entry per
	// destination and gather: no pointer is stored per frame).
	frames [burstSize]virtq.TXFrame
	plan   [burstSize]txPlan
	// chk[i] and src6[i] are what port security read of gathered frame i
	// (plan[i].patch, security.go).
	chk  [burstSize]checked
	src6 [burstSize][16]byte
	// pp is the plan of the frame txDirect delivers when port security
	// checked it: put writes the checked fields over its copy (ppAt is
	// its index in the gather); nil otherwise.
	pp   *txPlan
	ppAt int
	dsts [burstSize]*port
	nd   int
	rxb  [4 * burstSize]virtq.RXBuf // the RX buffers a run of frames to one guest took (unicastRun)
	// The gather being served: frames[cur] is the chain in hand, the k-1-cur
	// after it are taken and not yet served (given back after a fault);
	// frames[0] was at avail index base.
	cur, k int
	base   uint16
	// inRX says that the guest memory being touched is the held RX
	// vring's (rx.v): a fault now is blamed on it, else on the TX vring
	// being served. A flag, not a pointer, because it changes per frame.
	inRX   bool
	blamed *netdev.Vring // the ring endBurst blamed for a panic that ended the burst
	start  int64         // wall clock at the start of the last burst that had work
	a      *assignment   // the pair whose TX ring is being served (hold.go)
	txq    *virtq.Queue  // its queue
	first  uint16        // its LastAvail when the burst began: the held frame, if any, is the chain there
	held   bool          // forward held the frame in hand: give the chain back, end the burst
}

// init prepares the header every delivered frame starts with.
func (s *scratch) init() { s.hdr = plainHdr }

// plainHdr is the virtio-net header of a frame without offload metadata:
// num_buffers 1 (rewritten in place when a frame spans several buffers).
var plainHdr = [virtio.NetHdrSize]byte{10: 1}

// txBurst is what stays the same for a whole burst from one TX vring,
// decided once, and the burst's counts.
type txBurst struct {
	a         *assignment
	src       *port
	v         *netdev.Vring
	q         *virtq.Queue
	hdrLen    int
	maxFrame  int
	now       int64
	discard   bool // the ring is started but disabled: its frames are dropped
	direct    bool // frames of direct chains may take the direct path
	multiPair bool // src has several pairs: flows are recorded
	alone     bool // src is its network's only port, and there is no uplink: nowhere to flood
	// floodOne is the one port a flood reaches (src's network holds it
	// and src only, and no uplink), nil otherwise; floodAt is its index in
	// scratch.dsts once classify named it there, -1 before.
	floodOne *port
	floodAt  int8
	dhcp     bool   // src's DHCP client frames are answered here
	lastSmac uint64 // the source last learned (a Key; never a real one at first)
	lastDst  uint64 // the destination last looked up (a Key), its port and its index in scratch.dsts
	lastTo   *port
	lastIdx  uint8
	limit    int64     // bytes the burst may move (fair share, egress limit)
	guard    guardMode // src's port security
	mac      uint64    // the source address src's frames must carry (a Key); noKey: none claimed yet
	ip4      uint32    // src's one allowed IPv4 source (guardIP) as a little-endian load reads it, 0 when it has none or several: checked inline

	pkts, bytes, runts, oversize, nodest, disabled, badOffload, spoofed uint64
}

// noKey is no address's Key: a burst's first source is always learned.
const noKey = ^uint64(0)

// frameOutcome is how a frame's trip ended for the burst.
type frameOutcome int

const (
	frameDone   frameOutcome = iota // switched, dropped or counted: next frame
	frameHeld                       // held for a full destination: the burst ends (hold.go)
	frameBroken                     // the TX ring broke: the burst ends
	frameSpent                      // the burst moved its fair share or what the egress limit allows: the rest waits
)

// fairQuantum is how many bytes a TX ring may move per pass when others
// on its worker have work too (deficit round robin): 32 frames of 1500
// bytes fit, a guest sending 64 KiB GSO frames or jumbo frames moves
// about one quantum's worth per pass instead of 32 frames, and what a
// burst takes beyond it (up to one gather) is owed from its next turns.
const fairQuantum = 64 << 10

// serveTX forwards one burst from a TX vring and reports whether there was
// work. Per frame: take the chain; a direct chain (virtq/direct.go)
// without offload metadata is switched by txDirect straight from the
// guest's buffer, anything else walks (txWalk). The burst ends with one
// publish and one interrupt decision per ring.
func (w *worker) serveTX(a *assignment) bool {
	v := a.tx
	v.Lock()
	defer w.endBurst(v)
	q := v.Queue()
	discard := false
	if q == nil {
		if q = v.StartedDisabled(); q == nil {
			if a.hold.rv != nil {
				a.clearHold() // its ring stopped under it
			}
			return false
		}
		discard = true
	}
	n, err := q.Pending()
	if err != nil {
		w.breakVring(v, err)
		return false
	}
	if n == 0 {
		return false
	}
	n = min(n, burstSize)
	s := &w.s
	b := &s.b
	src := a.port
	now := time.Now().UnixNano()
	budget, egress := w.egressBudget(a, src, now) // bandwidth.go; -1: no limit
	if budget == 0 {
		return false // shaped: the chains wait in the ring
	}
	// Fair share (deficit round robin in bytes): the burst may move a
	// quantum less what earlier bursts took beyond theirs.
	limit := a.deficit + fairQuantum
	if limit <= 0 {
		a.deficit = limit
		return true // its turn comes back next pass
	}
	shaping := budget > 0 && budget < limit
	if shaping {
		limit = budget
	}
	ports := *src.net.ports.Load()
	*b = txBurst{a: a, src: src, v: v, q: q, hdrLen: v.HdrLen(),
		maxFrame: src.dev.MTU() + ethHeader + vlanTag, now: now,
		discard: discard, direct: !discard && src.net.up == nil,
		multiPair: len(src.rxReady) > 1, dhcp: src.dhcp != nil, lastSmac: noKey, lastDst: noKey,
		alone: len(ports) <= 1 && src.net.up == nil, limit: limit}
	if len(ports) == 2 && src.net.up == nil {
		b.floodOne = ports[0]
		if b.floodOne == src {
			b.floodOne = ports[1]
		}
	}
	if b.guard = src.guard.mode; b.guard != guardOff {
		b.mac = src.guard.burstMAC(src.dev.Connects())
		if len(src.guard.v4) == 1 {
			b.ip4 = bits.ReverseBytes32(src.guard.v4[0]) // as a little-endian load reads it
		}
	}
	s.start = b.now
	a.macs.Sync(src.net.macs)
	// A frame held for a full destination (hold.go) is the first chain of
	// the next burst; it ends the burst it was held in.
	s.a, s.txq, s.first = a, q, q.LastAvail()
	wasHolding := a.hold.rv != nil
	out := frameDone
	for left := n; left > 0 && out == frameDone; {
		// as many frames as the limit surely holds, at least one
		take := left
		if rest := limit - int64(b.bytes); rest < int64(left*b.maxFrame) {
			take = min(left, max(1, int(rest/int64(b.maxFrame))))
		}
		k, broken := q.GatherTX(b.hdrLen, s.frames[:take])
		if k > 0 {
			w.classify(b, k)
			if w.classified != nil {
				w.classified()
			}
			out = w.switchGathered(b, k)
			left -= k
		}
		if broken && out == frameDone {
			w.breakVring(v, virtq.ErrHeadOutOfRange)
			break
		}
		if int64(b.bytes) >= limit && left > 0 && out == frameDone {
			out = frameSpent
		}
	}
	if out == frameSpent && shaping {
		w.shape(a, egress, now)
	}
	if egress != nil && b.bytes > 0 {
		egress.spend(b.bytes, now)
	}
	a.deficit = min(0, a.deficit+fairQuantum-int64(b.bytes))
	heldFirst := out == frameHeld && s.inHandFirst()
	s.a, s.txq = nil, nil
	if s.held {
		s.held = false
	} else if wasHolding {
		a.clearHold()
	}
	w.releaseRX(true)
	q.Publish()
	v.Call()
	c := &v.Counters
	c.Packets.Add(b.pkts)
	c.Bytes.Add(b.bytes)
	if b.runts|b.oversize|b.nodest|b.disabled|b.badOffload|b.spoofed != 0 {
		// each a locked add (other paths count some of them too): only
		// those that moved
		addNonZero(&c.DropSpoofed, b.spoofed)
		addNonZero(&c.DropOffload, b.badOffload)
		addNonZero(&c.DropRunt, b.runts)
		addNonZero(&c.DropMTU, b.oversize)
		addNonZero(&c.DropNoDest, b.nodest)
		addNonZero(&c.DropDisable, b.disabled)
	}
	b.a, b.src, b.v, b.q, b.lastTo = nil, nil, nil, nil, nil
	clear(s.dsts[:s.nd])
	w.callTouched()
	return !heldFirst // a burst that only held its first frame moved nothing
}

// addNonZero adds n to c unless n is 0.
func addNonZero(c *atomic.Uint64, n uint64) {
	if n != 0 {
		c.Add(n)
	}
}

// txAct is what classify decided for a gathered frame.
type txAct uint8

const (
	actWalk     txAct = iota // the walker serves it (txWalk)
	actRunt                  // shorter than an Ethernet header: dropped
	actOversize              // longer than the MTU allows: dropped
	actNoDest                // switched, but nowhere to go: counted
	actSpoofed               // refused by port security: dropped, counted
	actFlood                 // unknown or multicast destination
	actFloodOne              // actFlood where the flood reaches one port (txBurst.floodOne, scratch.dsts[dst]): runs like actUnicast, drops like actFlood
	actUnicast               // to scratch.dsts[dst]
)

// txPlan is classify's decision for one gathered frame, with the values
// of the frame it was made from (read once: the guest may rewrite them).
type txPlan struct {
	smac uint64 // the source address (a Key)
	hash uint32 // the flow hash, where a port has several pairs
	// dst: the destination's index in scratch.dsts (low byte) and the RX
	// pair the frame is steered to (high byte: pickRX) when it has
	// several pairs, noPair when none is ready or the frame is flooded to
	// a port with several; one compare tells a run's frames (unicastRun).
	dst uint16
	act txAct
	// patch says what port security checked (scratch.chk, security.go):
	// the destinations get those values, not what the guest's buffer
	// holds by the time of the copy.
	patch patchKind
}

// classify plans the k gathered frames, reading their headers back to
// back: a direct chain without offload metadata is switched from the
// guest's buffer (txDirect), anything else walks (txWalk). Frames of a
// burst mostly go to one destination: it is looked up once (through the
// pair's cache) until another one comes.
func (w *worker) classify(b *txBurst, k int) {
	s := &w.s
	q, src := b.q, b.src
	s.nd, b.lastDst, b.floodAt = 0, noKey, -1
	plan, frames := s.plan[:k], s.frames[:k]
	if !b.direct {
		for i := range plan {
			plan[i].act = actWalk
		}
		return
	}
	maxFrame, dhcpHere, multiPair, alone := b.maxFrame, b.dhcp, b.multiPair, b.alone
	for i := range plan {
		f, p := &frames[i], &plan[i]
		if f.Kind != virtq.Direct {
			p.act = actWalk
			continue
		}
		frame := q.Frame(f)
		if n := len(frame); n < ethHeader || n > maxFrame {
			p.act = actRunt
			if n >= ethHeader {
				p.act = actOversize
			}
			continue
		}
		dst := vswitch.Key(frame[0:6])
		p.patch = patchNone
		if b.guard == guardOff {
			p.smac = vswitch.Key(frame[6:12])
		} else {
			// Port security, inline for IPv4 (security.go): each field
			// read once, and the destinations get the values read.
			c := &s.chk[i]
			c.head = binary.LittleEndian.Uint64(frame[6:14]) // the source MAC and the type, as they lie
			w0 := bits.ReverseBytes64(c.head)
			p.smac = w0 >> 16
			if p.smac != b.mac && !w.claimMAC(b, p.smac) {
				p.act = actSpoofed
				continue
			}
			switch etype := uint16(w0); {
			case etype == etherIPv4 && b.guard == guardMAC:
				p.patch = patchEth
			case etype == etherIPv4 && len(frame) >= 34 && b.ip4 != 0 && binary.LittleEndian.Uint32(frame[26:30]) == b.ip4:
				p.patch, c.ip4 = patchIPv4, b.ip4
			default:
				if v := src.guard.direct(p, c, etype, frame, &s.src6[i]); v != guardPass {
					p.act = actSpoofed
					if v == guardWalk {
						p.act = actWalk // ARP, NDP: checked on the walker's copy
					}
					continue
				}
			}
		}
		if dhcpHere && dhcp.IsClientFrame(frame) {
			p.act = actWalk // answered here (dhcp.go)
			continue
		}
		if dst != b.lastDst {
			var to *port
			if !vswitch.KeyIsMulticast(dst) {
				to, _ = b.a.macs.Lookup(src.net.macs, dst)
			}
			if to != nil && to.up != nil {
				p.act = actWalk // the uplink, attached since the burst began: its frames walk
				continue
			}
			b.lastDst, b.lastTo = dst, to
			if to != nil {
				s.dsts[s.nd], b.lastIdx = to, uint8(s.nd)
				s.nd++
			}
		}
		to := b.lastTo
		// The flow hash picks among a destination's pairs and records the
		// source's; a port with one pair needs neither.
		p.hash = 0
		if multiPair || (to != nil && len(to.rxReady) > 1) {
			p.hash = vswitch.FlowHash(frame)
		}
		switch {
		case to == src || (to == nil && alone):
			p.act = actNoDest // a hairpin we do not do, or no other port
		case to == nil && b.floodOne != nil:
			if b.floodAt < 0 {
				s.dsts[s.nd], b.floodAt = b.floodOne, int8(s.nd)
				s.nd++
			}
			p.act, p.dst = actFloodOne, uint16(b.floodAt)
			if len(b.floodOne.rxReady) > 1 {
				p.dst |= noPair << 8 // put steers each (the hash may not be known)
			}
		case to == nil:
			p.act = actFlood
		default:
			p.act, p.dst = actUnicast, uint16(b.lastIdx)
			if len(to.rxReady) > 1 {
				// steered here, so that a run takes the frames that go
				// to one RX ring (unicastRun)
				p.dst |= uint16(uint8(to.pickRX(p.hash))) << 8
			}
		}
	}
}

// switchGathered serves the k planned frames in ring order. A frame held
// for a full destination ends the burst: it and the chains after it are
// given back untaken.
func (w *worker) switchGathered(b *txBurst, k int) frameOutcome {
	s := &w.s
	q := b.q
	// s.k is cleared on the normal returns only: after a fault,
	// settleAfterFault finds the chains in hand through it.
	s.base, s.k = q.LastAvail()-uint16(k), k
	runs := true // a run that found no buffer to take is not tried again
	frames, plan := s.frames[:k], s.plan[:k]
	for i := 0; i < len(plan); i++ {
		s.cur = i
		f, p := &frames[i], &plan[i]
		switch p.act {
		case actNoDest:
			b.nodest++
		case actUnicast, actFloodOne:
			if runs {
				n, tried := w.unicastRun(b, i, k)
				if n > 0 {
					i += n - 1
					continue
				}
				runs = !tried
			}
			fallthrough
		case actFlood:
			if out := w.txDirect(b, f, p); out != frameDone {
				q.Unpop(k - 1 - i)
				s.k = 0
				return out
			}
		case actWalk:
			out := w.txWalk(b, f.Head)
			if out == frameDone && int64(b.bytes) >= b.limit && i+1 < len(plan) {
				out = frameSpent // a walked frame may be a 64 KiB GSO frame: the limit is checked after each
			}
			if out != frameDone {
				q.Unpop(k - 1 - i)
				s.k = 0
				return out
			}
			continue
		default: // a runt, oversize or spoofed frame
			q.Push(f.Head, 0)
			switch p.act {
			case actRunt:
				b.runts++
			case actOversize:
				b.oversize++
			default:
				b.spoofed++
			}
			continue
		}
		// The source's part, written out here and in the runs: as a
		// helper (inlined or not) it cost 2 to 20 instructions per frame.
		q.Push(f.Head, 0)
		if p.smac != b.lastSmac {
			b.learnMAC(w, p.smac)
		}
		if b.multiPair {
			b.src.flows.Record(p.hash, b.a.pair, b.now)
		}
		b.pkts++
		b.bytes += uint64(f.Len)
	}
	s.k = 0
	return frameDone
}

// endRun accounts a run of n frames (bytes long) that filled used of the
// got RX buffers it gathered; the others go back to the guest's ring.
func (w *worker) endRun(b *txBurst, to *port, got, used, n int, bytes uint64) {
	h := &w.s.rx
	h.q.Unpop(got - used)
	h.avail -= used
	h.frames += uint64(n)
	h.bytes += bytes
	b.pkts += uint64(n)
	b.bytes += bytes
	if n > 0 && b.a.hold.stalled != nil {
		b.a.delivered(to)
	}
}

// noPair is txPlan.dst's pair for a frame no run takes.
const noPair = 0xff // above vhostuser.MaxQueuePairs

// unicastRun delivers frames from i on that go to the RX ring the burst's
// RX hold holds: to its port (unicast, or a flood that reaches that port
// alone: one a full ring drops, as flood does, once the run ends and
// txDirect takes it), steered to that ring where the port has several
// pairs (classify steered them): one look at how many
// buffers its guest posted, the buffers taken back to back
// (virtq.GatherRX), then one copy per frame. It stops at the first frame
// that goes elsewhere, and at a buffer that is not one descriptor big
// enough for the run's longest frame (the per-frame path, txDirect, takes
// the rest), and returns how many frames it delivered and whether it
// looked at the guest's buffers.
func (w *worker) unicastRun(b *txBurst, i, k int) (n int, tried bool) {
	s := &w.s
	h := &s.rx
	d := s.plan[i].dst
	to := s.dsts[uint8(d)]
	if h.port != to || h.avail == 0 {
		return 0, false // put holds (and refills) first
	}
	if pair := int(d >> 8); len(to.rxReady) != 1 && (pair >= len(to.rxReady) || h.v != to.dev.Vrings()[2*pair]) {
		return 0, false // the frame is steered to another of its rings
	}
	j, longest := i+1, s.frames[i].Len
	act := s.plan[i].act // actUnicast or actFloodOne
	for j < k && s.plan[j].act == act && s.plan[j].dst == d {
		longest = max(longest, s.frames[j].Len)
		j++
	}
	// A limited destination polices the run once, up front (bandwidth.go):
	// the run ends before the first frame refused, which put then counts,
	// and what the run does not deliver is given back below.
	in := to.ingress.Load()
	if in != nil {
		if j = i + in.takeRun(s.frames[i:j], w.burstNow()); j == i {
			return 0, false
		}
	}
	tq, rq, dhdr := b.q, h.q, h.hdrLen
	s.inRX = true
	// Only buffers that hold the run's longest frame are taken: a guest
	// posting smaller ones gets frames spanning several (put).
	got := rq.GatherRX(dhdr+int(longest), s.rxb[:min(j-i, h.avail)])
	if got == 0 && h.mergeable {
		n = w.spanRun(b, i, j)
		s.inRX = false
		if in != nil && i+n < j {
			in.refund(s.frames[i+n : j])
		}
		return n, true
	}
	bytes := uint64(0)
	for ; n < got; n++ {
		s.cur = i + n
		f, p, r := &s.frames[i+n], &s.plan[i+n], &s.rxb[n]
		frame, buf := tq.Frame(f), rq.Buf(r)
		if len(buf) < dhdr+len(frame) {
			break
		}
		copy(buf[dhdr:], frame)
		if p.patch != patchNone {
			s.applyPatch(buf[dhdr:], p, i+n)
		}
		s.putHdr(buf, dhdr)
		if h.logging { // live migration: the frontend resends what we wrote
			rq.LogWritten(buf[:dhdr+len(frame)])
		}
		rq.Push(r.Head, uint32(dhdr+len(frame)))
		tq.Push(f.Head, 0)
		if p.smac != b.lastSmac {
			b.learnMAC(w, p.smac)
		}
		if b.multiPair {
			b.src.flows.Record(p.hash, b.a.pair, b.now)
		}
		bytes += uint64(f.Len)
	}
	// Cleared on a normal return only: after a fault in the destination's
	// memory serveSafely must blame it, not the source ring.
	s.inRX = false
	w.endRun(b, to, got, n, n, bytes)
	if in != nil && i+n < j {
		in.refund(s.frames[i+n : j])
	}
	return n, true
}

// spanRun is unicastRun for a guest whose buffers are smaller than the
// frames (MRG_RXBUF): each frame fills as many of the buffers taken back
// to back as it needs, and its header says how many (num_buffers). It
// stops at a frame the buffers taken cannot hold (put takes that one).
func (w *worker) spanRun(b *txBurst, i, j int) (n int) {
	s := &w.s
	h := &s.rx
	tq, rq, dhdr := b.q, h.q, h.hdrLen
	got := rq.GatherRX(1, s.rxb[:min(h.avail, len(s.rxb))])
	bufs := s.rxb[:got]
	used, bytes := 0, uint64(0)
	for ; i+n < j; n++ {
		s.cur = i + n
		f, p := &s.frames[i+n], &s.plan[i+n]
		frame := tq.Frame(f)
		// the buffers this frame needs: the first holds the header
		c, room := 0, -dhdr
		for room < len(frame) && used+c < len(bufs) && c < maxMergeBufs {
			room += int(bufs[used+c].Len)
			c++
		}
		if room < len(frame) || c == 0 || int(bufs[used].Len) < dhdr {
			break
		}
		first := rq.Buf(&bufs[used])
		if p.patch != patchNone && len(first) < dhdr+patchLen {
			break // put (putSpan) takes it from a checked copy
		}
		k := copy(first[dhdr:], frame)
		if p.patch != patchNone {
			s.applyPatch(first[dhdr:], p, i+n)
		}
		if h.logging {
			rq.LogWritten(first[:dhdr+k])
		}
		rq.Push(bufs[used].Head, uint32(dhdr+k))
		for x := 1; x < c; x++ {
			buf := rq.Buf(&bufs[used+x])
			m := copy(buf, frame[k:])
			if h.logging {
				rq.LogWritten(buf[:m])
			}
			rq.Push(bufs[used+x].Head, uint32(m))
			k += m
		}
		s.putHdr(first, dhdr)
		if dhdr >= 12 {
			putNumBuffers(first, c)
		}
		used += c
		tq.Push(f.Head, 0)
		if p.smac != b.lastSmac {
			b.learnMAC(w, p.smac)
		}
		if b.multiPair {
			b.src.flows.Record(p.hash, b.a.pair, b.now)
		}
		bytes += uint64(f.Len)
	}
	w.endRun(b, s.dsts[uint8(s.plan[i].dst)], got, used, n, bytes)
	return n
}

// inHandFirst reports whether the chain in hand is the burst's first.
func (s *scratch) inHandFirst() bool { return s.base+uint16(s.cur) == s.first }

// txDirect delivers one frame of a direct TX chain as classify planned it
// (to one port or flooded), straight from the source guest's buffer.
func (w *worker) txDirect(b *txBurst, f *virtq.TXFrame, p *txPlan) frameOutcome {
	q := b.q
	s := &w.s
	if p.patch != patchNone {
		s.pp, s.ppAt = p, s.cur // cleared here and by endBurst
	}
	if p.act != actUnicast { // actFlood, actFloodOne
		w.flood(b.src, q.Frame(f), p.hash, b.multiPair)
		s.pp = nil
		return frameDone
	}
	to := s.dsts[uint8(p.dst)]
	rv, res := w.put(to, q.Frame(f), p.hash)
	s.pp = nil
	switch {
	case res == fillDone:
		if b.a.hold.stalled != nil {
			b.a.delivered(to)
		}
	case res == fillNoRoom && w.hold(rv, to):
		q.Unpop(1)
		return frameHeld
	case res == fillNoRoom:
		rv.Counters.DropNoBuf.Add(1)
	}
	return frameDone
}

// flood copies a frame from src's guest into every other port of its
// network; a full ring drops its copy. With several pairs at src the hash
// is already known; else it is computed for the first destination that
// has several pairs.
func (w *worker) flood(src *port, frame []byte, hash uint32, hashed bool) {
	for _, p := range *src.net.ports.Load() {
		if p == src {
			continue
		}
		if !hashed && len(p.rxReady) > 1 {
			hash, hashed = vswitch.FlowHash(frame), true
		}
		if rv, res := w.put(p, frame, hash); res == fillNoRoom {
			rv.Counters.DropNoBuf.Add(1)
		}
	}
}

// learnMAC learns the source of a frame that passed the checks, once per
// address and burst (a repeat at the same time would change nothing);
// the caller compares with lastSmac first.
func (b *txBurst) learnMAC(w *worker, smac uint64) {
	src := b.src
	mac := vswitch.MACOf(smac)
	b.lastSmac = smac
	if b.guard != guardOff {
		src.net.macs.Pin(mac, src, b.now) // its own: checked in classify or txWalk
	} else if !w.dp.reserved(smac) {
		src.net.macs.Learn(mac, src, b.now)
	} else {
		return // the node's own address is never learned behind a guest
	}
	if src.net.up != nil {
		w.guestMAC(mac) // uplink.go: af_xdp steers it to us
	}
}

// txWalk switches one frame through the bounded walker: any chain the
// direct path does not serve, frames with offload metadata, DHCP to the
// local responder, frames to or flooded to the uplink, and a disabled
// ring's frames (only checked, then dropped).
func (w *worker) txWalk(b *txBurst, head uint16) frameOutcome {
	s := &w.s
	q, v, src, hdrLen, maxFrame := b.q, b.v, b.src, b.hdrLen, b.maxFrame
	r := q.NewReader(head)
	got := r.Read(s.peek[:])
	if b.discard || got < hdrLen+ethHeader {
		// nothing to switch; the walk still checks the whole chain
		r.Skip(maxFrame + hdrLen + 1 - got)
		if err := r.Err(); err != nil {
			q.Unpop(1)
			w.breakVring(v, err)
			return frameBroken
		}
		q.Push(head, 0)
		if b.discard {
			b.disabled++
		} else {
			b.runts++
		}
		return frameDone
	}
	frame := s.peek[hdrLen:got]
	if b.guard != guardOff {
		if smac := vswitch.Key(frame[6:12]); (smac != b.mac && !w.claimMAC(b, smac)) || !src.guard.checks(frame, smac) {
			r.Skip(maxFrame + hdrLen + 1 - got) // the walk still checks the whole chain
			if err := r.Err(); err != nil {
				q.Unpop(1)
				w.breakVring(v, err)
				return frameBroken
			}
			q.Push(head, 0)
			b.spoofed++
			return frameDone
		}
	}
	dst := vswitch.Key(frame[0:6])
	// DHCP from a guest whose lease the dataplane holds is answered
	// here (dhcp.go), never switched.
	local := b.dhcp && dhcp.IsClientFrame(frame)
	var to *port
	if !vswitch.KeyIsMulticast(dst) && !local {
		to, _ = b.a.macs.Lookup(src.net.macs, dst)
	}
	var hash uint32
	if b.multiPair || to == nil || len(to.rxReady) > 1 {
		hash = vswitch.FlowHash(frame)
	}
	// Offload metadata (a partial checksum, a GSO frame): passed
	// whole to a guest that takes it, else the frame is read into
	// scratch and completed or segmented there (offload.go).
	meta := s.peek[0]|s.peek[1] != 0
	limit := maxFrame
	linear := false
	var frameLen int
	if meta {
		var mode offloadMode
		limit, mode = w.offloadTX(hdrLen, frame, maxFrame, to, to != nil && to != src && to.up == nil && !local)
		switch mode {
		case offloadPass:
			frameLen = w.forwardMeta(to, &r, frame, limit, hash)
			if s.held {
				q.Unpop(1)
				return frameHeld
			}
		case offloadLinear:
			frameLen = w.linearize(&r, frame, limit)
		default: // refused: the walk still checks the whole chain
			frameLen = len(frame) + r.Skip(limit+1-len(frame))
		}
		if mode == offloadBad || mode == offloadMTU || (mode == offloadPass && frameLen < s.off.in.MinLen) {
			if err := r.Err(); err != nil {
				q.Unpop(1)
				w.breakVring(v, err)
				return frameBroken
			}
			q.Push(head, 0)
			if mode == offloadMTU {
				b.oversize++
			} else {
				b.badOffload++
			}
			return frameDone
		}
		linear = mode == offloadLinear
	} else {
		switch {
		case to != nil && to.up != nil:
			frameLen = w.forwardUplink(src.net, &r, frame, maxFrame) // uplink_io.go
		case to != nil && to != src:
			frameLen = w.forward(to, &r, frame, maxFrame, hash)
			if s.held {
				q.Unpop(1)
				return frameHeld
			}
		default:
			frameLen = len(frame) + r.Skip(maxFrame+1-len(frame))
		}
	}
	if err := r.Err(); err != nil {
		q.Unpop(1)
		w.breakVring(v, err)
		return frameBroken
	}
	q.Push(head, 0)
	if frameLen > limit {
		b.oversize++
		return frameDone
	}
	if linear {
		if !w.offloadCheck(frameLen) {
			b.badOffload++
			return frameDone
		}
		if w.offloadOversize(maxFrame) {
			b.oversize++
			return frameDone
		}
	}
	if smac := vswitch.Key(frame[6:12]); smac != b.lastSmac {
		b.learnMAC(w, smac)
	}
	if b.multiPair {
		src.flows.Record(hash, b.a.pair, b.now)
	}
	// Every frame that passed the checks counts as transmitted; a frame
	// that finds no room at its destination is counted there
	// (rxNoBuffer/rxDisabled), one with no destination at all here.
	b.pkts++
	b.bytes += uint64(frameLen)
	switch {
	case local:
		w.releaseRX(false) // answerDHCP locks an RX vring itself
		if linear {
			w.answerDHCPMeta(src, s.off.lin[:frameLen])
		} else {
			w.answerDHCP(src, q, head, hdrLen, frameLen)
		}
	case to == src:
		b.nodest++ // addressed to its own port: a hairpin we do not do
	case linear:
		if !w.deliverLinear(src, to, s.off.lin[:frameLen], hash) { // offloads.go
			b.nodest++
		}
	case to != nil:
		// delivered (or counted at the destination) above
	default:
		flooded := false
		for _, p := range *src.net.ports.Load() {
			if p != src {
				w.deliver(p, q, head, hdrLen, frame, frameLen, hash)
				flooded = true
			}
		}
		if src.net.up != nil {
			w.floodUplink(src.net, q, head, hdrLen, frame, frameLen) // uplink_io.go
			flooded = true
		}
		if !flooded {
			b.nodest++
		}
	}
	return frameDone
}

// endBurst releases the burst's locks. On the normal path the held RX
// vring was already released. After a panic (a fault in guest memory, or
// a bug) it finds the ring to blame while it still holds the rings the
// burst touched (culprit), releases them, and passes the panic on to
// serveSafely, which stops the culprit.
func (w *worker) endBurst(tx *netdev.Vring) {
	defer tx.Unlock()
	w.s.pp = nil
	r := recover()
	if r == nil {
		if w.s.rx.v != nil {
			w.releaseRX(false)
		}
		return
	}
	w.s.blamed = w.culprit(r, tx)
	w.releaseAfterFault(w.s.blamed)
	panic(r)
}
