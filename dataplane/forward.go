package dataplane

// The per-packet path. A worker serves the TX vring of each queue pair it
// owns, in bursts of up to burstSize chains, in three phases:
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
//     guest's buffer into the destination's; other frames go one by one
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

import (
	"encoding/binary"
	"math/bits"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/dhcp"
	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

const (
	burstSize = 32
	// maxMergeBufs bounds how many RX chains one frame may span with
	// MRG_RXBUF; a 9702-byte frame needs 7 chains of Linux's smallest
	// mergeable buffers.
	maxMergeBufs = 64
	// maxTouched bounds the RX vrings one burst remembers to interrupt;
	// beyond it, interrupts are sent at once.
	maxTouched = 64
	ethHeader  = 14
	vlanTag    = 4
)

type usedElem struct {
	head uint16
	len  uint32
}

// rxHold is the destination RX vring a burst holds locked, so that
// consecutive frames to it share one lock, one avail-index read and one
// used-index publish.
type rxHold struct {
	v         *netdev.Vring
	q         *virtq.Queue
	port      *port  // v's port: a stopped ring is no longer offered to flows
	hdrLen    int    // v's virtio-net header length
	mergeable bool   // v's guest takes frames spanning several chains
	logging   bool   // v's queue marks what is written into it (live migration)
	avail     int    // chains known to be available and not yet taken; re-read at 0
	frames    uint64 // frames pushed and not yet published
	bytes     uint64
	// pub is the ring's used index when the hold began: what a fault in
	// the source's memory rolls the hold back to (releaseAfterFault)
	pub uint16
}

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
	discard   bool   // the ring is started but disabled: its frames are dropped
	direct    bool   // frames of direct chains may take the direct path
	multiPair bool   // src has several pairs: flows are recorded
	alone     bool   // src is its network's only port, and there is no uplink: nowhere to flood
	dhcp      bool   // src's DHCP client frames are answered here
	lastSmac  uint64 // the source last learned (a Key; never a real one at first)
	lastDst   uint64 // the destination last looked up (a Key), its port and its index in scratch.dsts
	lastTo    *port
	lastIdx   uint8
	limit     int64     // bytes the burst may move (fair share, egress limit)
	guard     guardMode // src's port security
	mac       uint64    // the source address src's frames must carry (a Key); noKey: none claimed yet
	ip4       uint32    // src's one allowed IPv4 source (guardIP) as a little-endian load reads it, 0 when it has none or several: checked inline

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
	*b = txBurst{a: a, src: src, v: v, q: q, hdrLen: v.HdrLen(),
		maxFrame: src.dev.MTU() + ethHeader + vlanTag, now: now,
		discard: discard, direct: !discard && src.net.up == nil,
		multiPair: len(src.rxReady) > 1, dhcp: src.dhcp != nil, lastSmac: noKey, lastDst: noKey,
		alone: len(*src.net.ports.Load()) <= 1 && src.net.up == nil, limit: limit}
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
		c.DropSpoofed.Add(b.spoofed)
		c.DropOffload.Add(b.badOffload)
		c.DropRunt.Add(b.runts)
		c.DropMTU.Add(b.oversize)
		c.DropNoDest.Add(b.nodest)
		c.DropDisable.Add(b.disabled)
	}
	b.a, b.src, b.v, b.q, b.lastTo = nil, nil, nil, nil, nil
	clear(s.dsts[:s.nd])
	w.callTouched()
	return !heldFirst // a burst that only held its first frame moved nothing
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
	actUnicast               // to scratch.dsts[dst]
)

// txPlan is classify's decision for one gathered frame, with the values
// of the frame it was made from (read once: the guest may rewrite them).
type txPlan struct {
	smac uint64 // the source address (a Key)
	hash uint32 // the flow hash, where a port has several pairs
	dst  uint8
	act  txAct
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
	s.nd, b.lastDst = 0, noKey
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
			p.act = actWalk // answered here (local.go)
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
		case to == nil:
			p.act = actFlood
		default:
			p.act, p.dst = actUnicast, b.lastIdx
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
		case actUnicast:
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
			b.src.flows.Record(p.hash, b.a.pair)
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

// unicastRun delivers frames from i on that go to the port that the
// burst's RX hold holds, when it has one pair: one look at how many
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
	to := s.dsts[d]
	if h.port != to || len(to.rxReady) != 1 || h.avail == 0 {
		return 0, false // put holds (and refills) first
	}
	j, longest := i+1, s.frames[i].Len
	for j < k && s.plan[j].act == actUnicast && s.plan[j].dst == d {
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
			b.src.flows.Record(p.hash, b.a.pair)
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
			first[10], first[11] = byte(c), byte(c>>8) // num_buffers
		}
		used += c
		tq.Push(f.Head, 0)
		if p.smac != b.lastSmac {
			b.learnMAC(w, p.smac)
		}
		if b.multiPair {
			b.src.flows.Record(p.hash, b.a.pair)
		}
		bytes += uint64(f.Len)
	}
	w.endRun(b, s.dsts[s.plan[i].dst], got, used, n, bytes)
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
	if p.act == actFlood {
		w.flood(b.src, q.Frame(f), p.hash, b.multiPair)
		s.pp = nil
		return frameDone
	}
	to := s.dsts[p.dst]
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
	// here (local.go), never switched.
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
			frameLen = w.forwardUplink(src.net, &r, frame, maxFrame) // uplink.go
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
		src.flows.Record(hash, b.a.pair)
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
			w.floodUplink(src.net, q, head, hdrLen, frame, frameLen) // uplink.go
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

// culprit is the ring a panic while serving tx is blamed on: for a memory
// fault, the one of tx and the held RX ring whose port's mappings hold
// the faulting address (a frame from tx's guest into another guest's
// ring may fault in either's memory); otherwise, or when neither holds
// it, the held RX ring if its memory was being touched, else tx. Caller
// holds both rings.
func (w *worker) culprit(r any, tx *netdev.Vring) *netdev.Vring {
	held := w.s.rx.v
	if f := guestmem.AsFault(r); f != nil {
		switch {
		case held != nil && held.Holds(f.Addr):
			return held
		case tx.Holds(f.Addr):
			return tx
		}
	}
	if w.s.inRX && held != nil {
		return held
	}
	return tx
}

// releaseAfterFault releases the held RX ring after a fault. The culprit's
// is dropped as it stands (its memory is not touched again). Any other
// (the fault was in the source's memory) is rolled back to where the hold
// began: the frames the source put there and not yet published are taken
// back (a frame spanning several buffers is pushed before it is copied
// whole: publishing it could hand the guest half a frame and a stale
// header), and every chain taken since is given back (rings complete in
// order). Only the faulting source's frames are lost. Neither touches
// guest memory: the roll-back moves the queue's own indexes, and nothing
// is published.
func (w *worker) releaseAfterFault(culprit *netdev.Vring) {
	h := &w.s.rx
	if h.v == nil {
		return
	}
	w.s.inRX = false
	if h.v == culprit || h.v.Port == culprit.Port {
		h.unready()
	} else {
		h.q.Unpush(int(h.q.UsedIdx() - h.pub))
		h.q.Unpop(int(h.q.LastAvail() - h.q.UsedIdx()))
	}
	h.v.Unlock()
	*h = rxHold{}
}

// settleAfterFault finishes a burst that a fault in another vring's
// memory (culprit, now stopped) cut short, so that no guest waits forever:
// the TX chain in hand is given back (a unicast frame is served again; a
// flood, which may have reached some guests, is lost), the TX ring's
// completions are published and its guest interrupted, and every
// destination that got frames is interrupted.
// Those rings were readable a moment ago; should one fault now all the
// same, the rest of the settling is given up rather than the process.
func (w *worker) settleAfterFault(tx, culprit *netdev.Vring) {
	w.untouch(culprit)
	if tx.Port != culprit.Port {
		w.returnInHandSafely(tx)
	}
	w.callTouched() // each decision catches its own fault (netdev.Vring.Call)
}

// returnInHandSafely is returnInHand, giving up (with a log line) should
// the source's ring fault now all the same.
func (w *worker) returnInHandSafely(tx *netdev.Vring) {
	defer func() {
		if r := recover(); r != nil {
			w.s.k = 0
			w.dp.log.Warn("second fault while settling a burst", "port", tx.Port.Name(), "vring", tx.Index, "err", r)
		}
	}()
	w.returnInHand(tx)
}

// returnInHand returns the TX chain in hand as used, publishes the TX
// ring and interrupts its guest if it wants that.
func (w *worker) returnInHand(tx *netdev.Vring) {
	tx.Lock()
	defer tx.Unlock()
	q := tx.Queue()
	if q == nil {
		q = tx.StartedDisabled()
	}
	if q == nil {
		return
	}
	if s := &w.s; s.k > 0 {
		q.Unpop(s.k - 1 - s.cur)
		if q.LastAvail() != q.UsedIdx() {
			if s.plan[s.cur].act == actUnicast {
				// A unicast frame reached no guest yet (the fault was in
				// its destination's memory, now stopped, or in another
				// port's ring released on its way): served again.
				q.Unpop(1)
			} else {
				// a flood may have reached some guests: not twice
				q.Push(s.frames[s.cur].Head, 0)
			}
		}
		s.k = 0
	}
	q.Publish()
	tx.Call()
}

// holdRX makes rv the held RX vring (releasing the previous one) and
// returns the hold, or nil when rv cannot take frames.
func (w *worker) holdRX(rv *netdev.Vring, dst *port) *rxHold {
	h := &w.s.rx
	if h.v == rv {
		return h
	}
	w.releaseRX(false)
	rv.Lock()
	q := rv.Queue()
	if q == nil {
		rv.Unlock()
		return nil
	}
	*h = rxHold{v: rv, q: q, port: dst, hdrLen: rv.HdrLen(), mergeable: rv.Mergeable(), logging: q.Logging(), pub: q.UsedIdx()}
	return h
}

// releaseRX publishes what the held RX vring received (one fence), counts
// it, and unlocks it. With callNow the guest is interrupted at once if it
// wants to be (the end of a burst); otherwise the decision waits for
// callTouched.
func (w *worker) releaseRX(callNow bool) {
	h := &w.s.rx
	rv := h.v
	if rv == nil {
		return
	}
	if h.frames > 0 {
		s := &w.s
		prev := s.inRX
		s.inRX = true
		h.q.Publish()
		s.inRX = prev
		c := &rv.Counters
		c.Packets.Add(h.frames)
		c.Bytes.Add(h.bytes)
		if callNow {
			w.untouch(rv)
			rv.Call()
		} else {
			w.touch(rv)
		}
	} else if callNow && w.untouch(rv) {
		rv.Call()
	}
	*h = rxHold{}
	rv.Unlock()
}

// forward copies a unicast frame into an RX vring of dst, reading the rest
// of the source chain from r (whose first bytes, prefix, were already
// read), and returns the frame length (more than maxFrame: too long, not
// delivered). The caller checks r.Err().
func (w *worker) forward(dst *port, r *virtq.Reader, prefix []byte, maxFrame int, hash uint32) int {
	pair := dst.pickRX(hash)
	if pair < 0 {
		n := len(prefix) + r.Skip(maxFrame+1-len(prefix))
		if n <= maxFrame {
			dst.dev.Vrings()[0].Counters.DropDisable.Add(1)
		}
		return n
	}
	rv := dst.dev.Vrings()[2*pair]
	h := w.holdRX(rv, dst)
	if h == nil {
		n := len(prefix) + r.Skip(maxFrame+1-len(prefix))
		if n <= maxFrame {
			rv.Counters.DropDisable.Add(1)
		}
		return n
	}
	s := &w.s
	s.inRX = true
	n, nbufs, res := w.fill(h, prefix, r, maxFrame+1)
	if res == fillDone {
		if n <= maxFrame && n >= s.minLen && r.Err() == nil && w.admit(dst, n) {
			if a := s.a; a != nil && a.hold.stalled != nil {
				a.delivered(dst)
			}
			w.commit(h, nbufs, n)
			if s.hdr[1] != virtio.GSONone { // offloads.go: a GSO frame passed whole
				rv.Counters.GSOWhole.Add(1)
			}
		} else {
			w.unfill(h, nbufs)
		}
	}
	// Cleared on a normal return only: after a fault in rv's memory
	// serveSafely must blame rv, not the source ring.
	s.inRX = false
	if res == fillDone || (res == fillNoRoom && w.hold(rv, dst)) {
		return n
	}
	n += r.Skip(maxFrame + 1 - n)
	if res == fillNoRoom && n <= maxFrame && r.Err() == nil {
		rv.Counters.DropNoBuf.Add(1)
	}
	return n
}

// deliver copies a flooded frame into an RX vring of dst: prefix (its
// head as read and checked once) and the rest walking the source chain
// again (a guest rewriting its descriptors meanwhile only hurts its own
// frame: the walk is bounded again and a frame that came out shorter is
// not delivered).
func (w *worker) deliver(dst *port, src *virtq.Queue, head uint16, srcHdr int, prefix []byte, frameLen int, hash uint32) {
	pair := dst.pickRX(hash)
	if pair < 0 {
		dst.dev.Vrings()[0].Counters.DropDisable.Add(1)
		return
	}
	rv := dst.dev.Vrings()[2*pair]
	h := w.holdRX(rv, dst)
	if h == nil {
		rv.Counters.DropDisable.Add(1)
		return
	}
	s := &w.s
	s.inRX = true
	r := src.NewReader(head)
	r.Skip(srcHdr + len(prefix))
	n, nbufs, res := w.fill(h, prefix, &r, frameLen)
	switch {
	case res == fillDone && n == frameLen && r.Err() == nil && w.admit(dst, n): // bandwidth.go
		w.commit(h, nbufs, n)
	case res == fillDone:
		w.unfill(h, nbufs) // the source chain changed under us, or the ingress limit dropped it
	case res == fillNoRoom:
		rv.Counters.DropNoBuf.Add(1)
	}
	s.inRX = false
}

type fillResult int

const (
	fillDone   fillResult = iota // the frame is in nbufs chains, taken and not yet pushed
	fillNoRoom                   // no (or too few) buffers: nothing taken
	fillBroken                   // the destination broke the ring protocol: stopped and released
)

// fill takes buffers from the held RX vring and writes the virtio-net
// header (s.hdr: plainHdr but while an offload frame is delivered), then prefix, then what r still holds, up to limit frame bytes.
// It returns the frame bytes consumed (prefix included) and, when done,
// how many chains hold them (in s.used).
func (w *worker) fill(h *rxHold, prefix []byte, r *virtq.Reader, limit int) (n, nbufs int, res fillResult) {
	s := &w.s
	rv, rq := h.v, h.q
	dhdr := rv.HdrLen()
	prefix = prefix[:min(len(prefix), limit)]
	for {
		if nbufs == maxMergeBufs || (nbufs == 1 && !rv.Mergeable()) {
			w.unfill(h, nbufs)
			return n, 0, fillNoRoom
		}
		if h.avail == 0 {
			avail, err := rq.Pending()
			if err != nil {
				w.unfill(h, nbufs)
				w.breakHeld(err)
				return n, 0, fillBroken
			}
			if avail == 0 {
				w.unfill(h, nbufs)
				return n, 0, fillNoRoom
			}
			h.avail = avail
		}
		head, err := rq.Pop()
		if err != nil {
			w.unfill(h, nbufs)
			w.breakHeld(err)
			return n, 0, fillBroken
		}
		h.avail--
		nbufs++
		wr := rq.NewWriter(head)
		m := 0
		if nbufs == 1 {
			if m = wr.Write(s.hdr[:dhdr]); m < dhdr {
				if err := wr.Err(); err != nil {
					w.unfill(h, nbufs)
					w.breakHeld(err)
					return n, 0, fillBroken
				}
				w.unfill(h, nbufs)
				return n, 0, fillNoRoom
			}
		}
		if len(prefix) > 0 {
			k := wr.Write(prefix)
			prefix = prefix[k:]
			m += k
			n += k
		}
		if len(prefix) == 0 && n < limit {
			c := wr.CopyFrom(r, limit-n)
			m += c
			n += c
		}
		if err := wr.Err(); err != nil {
			w.unfill(h, nbufs)
			w.breakHeld(err)
			return n, 0, fillBroken
		}
		s.used[nbufs-1] = usedElem{head: head, len: uint32(m)}
		if n == limit || (len(prefix) == 0 && !r.More()) {
			return n, nbufs, fillDone
		}
		// this chain is full and the frame goes on: the next chain
	}
}

// unfill gives back the last k chains taken from the held vring.
func (w *worker) unfill(h *rxHold, k int) {
	h.q.Unpop(k)
	h.avail += k
}

// commit returns the chains of a filled frame as used (published when the
// hold is released).
func (w *worker) commit(h *rxHold, nbufs, frameLen int) {
	s := &w.s
	rq := h.q
	if nbufs > 1 {
		// num_buffers lives in the first chain's header (it may be split
		// across descriptors, so write it through a walker).
		wr := rq.NewWriter(s.used[0].head)
		wr.Skip(10)
		nb := [2]byte{byte(nbufs), byte(nbufs >> 8)}
		wr.Write(nb[:])
	}
	for i := range nbufs {
		rq.Push(s.used[i].head, s.used[i].len)
	}
	h.frames++
	h.bytes += uint64(frameLen)
}

// breakHeld stops the held RX vring (its driver broke the ring protocol)
// after publishing the frames it already took, and releases it.
func (w *worker) breakHeld(err error) {
	h := &w.s.rx
	w.breakVring(h.v, err)
	h.unready()
	w.releaseRX(false)
}

// unready takes the held RX vring out of pickRX's choices until the
// frontend sets it up again (the Changed hook), so that flows pinned to it
// move to the port's other pairs instead of being dropped there.
func (h *rxHold) unready() {
	if h.port != nil {
		h.port.rxReady[h.v.Pair()].Store(false)
	}
}

// touch remembers that rv needs an interrupt decision at the end of the
// burst. Caller holds rv's lock.
func (w *worker) touch(rv *netdev.Vring) {
	s := &w.s
	for i := range s.nt {
		if s.touched[i] == rv {
			return
		}
	}
	if s.nt == maxTouched {
		rv.Call()
		return
	}
	s.touched[s.nt] = rv
	s.nt++
}

// untouch forgets rv and reports whether it was remembered.
func (w *worker) untouch(rv *netdev.Vring) bool {
	s := &w.s
	for i := range s.nt {
		if s.touched[i] == rv {
			s.nt--
			s.touched[i], s.touched[s.nt] = s.touched[s.nt], nil
			return true
		}
	}
	return false
}

// callTouched interrupts each destination guest once per burst.
func (w *worker) callTouched() {
	s := &w.s
	for s.nt > 0 {
		s.nt--
		rv := s.touched[s.nt]
		s.touched[s.nt] = nil
		callLocked(rv)
	}
}

func callLocked(rv *netdev.Vring) {
	rv.Lock()
	defer rv.Unlock()
	rv.Call()
}

// breakVring stops a vring whose driver broke the ring protocol. Caller
// holds its lock.
func (w *worker) breakVring(v *netdev.Vring, err error) {
	if v.Break(err) {
		w.dp.log.Warn("vring stopped: the guest broke the ring protocol; it restarts when the frontend sets it up again",
			"port", v.Port.Name(), "vring", v.Index, "err", err)
	}
}
