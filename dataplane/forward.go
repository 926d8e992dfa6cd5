package dataplane

// The per-packet path. A worker serves the TX vring of each queue pair it
// owns, in bursts:
//
//  1. lock the TX vring, take up to burstSize available chains;
//  2. per chain: read the virtio-net and frame headers (one bounded walk
//     that goes on below), look up the destination;
//  3. a known unicast destination: hold the chosen RX vring of that port
//     (locked until the burst ends or a frame goes elsewhere), take its
//     buffers and copy the frame from the source guest's buffers straight
//     into the destination guest's buffers, continuing the same walk of
//     the source chain (one copy, one walk); a frame that turns out longer
//     than the MTU gives the buffers back. Unknown and multicast
//     destinations finish the walk first (to know the length), then copy
//     into every other port with a fresh walk each;
//  4. learn the source MAC and record the flow's TX queue for frames that
//     passed the checks;
//  5. per held RX vring: one avail-index read (again only when the known
//     buffers run out), one used-index publish (one fence) and one
//     interrupt decision per burst; the TX chains are returned with one
//     publish and the source guest is interrupted once if it asked.
//
// Locking follows netdev.Vring: a TX vring, then at most one RX vring at a
// time (a held RX vring is released before another is taken). Nothing here
// allocates.

import (
	"time"

	"github.com/vhostmq/vhostmq/dataplane/dhcp"
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
}

// scratch is a worker's per-burst state, allocated once.
type scratch struct {
	peek    [virtio.NetHdrSize + vswitch.HeaderPeek]byte
	hdr     [virtio.NetHdrSize]byte
	minLen  int            // the shortest frame forward may deliver (offloads.go; else 0)
	off     offloadScratch // offloads.go
	used    [maxMergeBufs]usedElem
	touched [maxTouched]*netdev.Vring
	nt      int
	rx      rxHold
	b       txBurst // the burst being served
	// inRX says that the guest memory being touched is the held RX
	// vring's (rx.v): a fault now is blamed on it, else on the TX vring
	// being served. A flag, not a pointer, because it changes per frame.
	inRX   bool
	blamed *netdev.Vring // the held RX vring, kept by unlockBurst when a fault in its memory ends the burst
	start  int64         // wall clock at the start of the last burst that had work
	txHead uint16        // the TX chain in hand (taken, not yet returned)
	a      *assignment   // the pair whose TX ring is being served (hold.go)
	txq    *virtq.Queue  // its queue
	first  uint16        // its LastAvail when the burst began: the held frame, if any, is the one after
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
	lastDst   uint64 // the destination last looked up (a Key), and its port
	lastTo    *port

	pkts, bytes, runts, oversize, nodest, disabled, badOffload uint64
}

// noKey is no address's Key: a burst's first source is always learned.
const noKey = ^uint64(0)

// frameOutcome is how a frame's trip ended for the burst.
type frameOutcome int

const (
	frameDone   frameOutcome = iota // switched, dropped or counted: next frame
	frameHeld                       // held for a full destination: the burst ends (hold.go)
	frameBroken                     // the TX ring broke: the burst ends
)

// serveTX forwards one burst from a TX vring and reports whether there was
// work. Per frame: take the chain; a direct chain (virtq/direct.go)
// without offload metadata is switched by txDirect straight from the
// guest's buffer, anything else walks (txWalk). The burst ends with one
// publish and one interrupt decision per ring.
func (w *worker) serveTX(a *assignment) bool {
	v := a.tx
	v.Lock()
	defer w.unlockBurst(v)
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
	*b = txBurst{a: a, src: src, v: v, q: q, hdrLen: v.HdrLen(),
		maxFrame: src.dev.MTU() + ethHeader + vlanTag, now: time.Now().UnixNano(),
		discard: discard, direct: !discard && src.net.up == nil,
		multiPair: len(src.rxReady) > 1, dhcp: src.dhcp != nil, lastSmac: noKey, lastDst: noKey,
		alone: len(*src.net.ports.Load()) <= 1 && src.net.up == nil}
	s.start = b.now
	a.macs.Sync(src.net.macs)
	// A frame held for a full destination (hold.go) is the first chain of
	// the next burst; it ends the burst it was held in.
	s.a, s.txq, s.first = a, q, q.LastAvail()
	wasHolding, heldAt := a.hold.rv != nil, -1
	for k := range n {
		head, lead, frame, t := q.PopTX(b.hdrLen)
		if t == virtq.Broken {
			w.breakVring(v, virtq.ErrHeadOutOfRange)
			break
		}
		s.txHead = head
		var out frameOutcome
		if t == virtq.Direct && lead == 0 && b.direct {
			out = w.txDirect(b, head, frame)
		} else {
			out = w.txWalk(b, head)
		}
		if out == frameHeld {
			heldAt = k
		}
		if out != frameDone {
			break
		}
	}
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
	if b.runts|b.oversize|b.nodest|b.disabled|b.badOffload != 0 {
		c.DropOffload.Add(b.badOffload)
		c.DropRunt.Add(b.runts)
		c.DropMTU.Add(b.oversize)
		c.DropNoDest.Add(b.nodest)
		c.DropDisable.Add(b.disabled)
	}
	b.a, b.src, b.v, b.q, b.lastTo = nil, nil, nil, nil, nil
	w.callTouched()
	return heldAt != 0 // a burst that only held its first frame moved nothing
}

// txDirect switches one frame of a direct TX chain, frame being its bytes
// in the source guest's memory (which the guest may rewrite meanwhile:
// every value that decides anything is read once).
func (w *worker) txDirect(b *txBurst, head uint16, frame []byte) frameOutcome {
	q, src := b.q, b.src
	n := len(frame)
	if n < ethHeader || n > b.maxFrame {
		q.Push(head, 0)
		if n < ethHeader {
			b.runts++
		} else {
			b.oversize++
		}
		return frameDone
	}
	dst, smac := vswitch.Key(frame[0:6]), vswitch.Key(frame[6:12])
	if b.dhcp && dhcp.IsClientFrame(frame) {
		return w.txWalk(b, head) // answered here (local.go)
	}
	// Frames of a burst mostly go to one destination: it is looked up
	// once (through the pair's cache) until another one comes.
	if dst != b.lastDst {
		b.lastTo = nil
		if !vswitch.KeyIsMulticast(dst) {
			b.lastTo, _ = b.a.macs.Lookup(src.net.macs, dst)
		}
		b.lastDst = dst
		if b.lastTo != nil && b.lastTo.up != nil {
			// the uplink, attached since the burst began: its frames walk
			b.lastDst, b.lastTo = noKey, nil
			return w.txWalk(b, head)
		}
	}
	to := b.lastTo
	// The flow hash picks among a destination's pairs and records the
	// source's; a port with one pair needs neither.
	var hash uint32
	if b.multiPair || (to != nil && len(to.rxReady) > 1) {
		hash = vswitch.FlowHash(frame)
	}
	switch {
	case to == nil && b.alone:
		b.nodest++
	case to == nil:
		w.flood(src, frame, hash, b.multiPair)
	case to == src:
		b.nodest++ // addressed to its own port: a hairpin we do not do
	default:
		rv, res := w.put(to, frame, hash)
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
	}
	q.Push(head, 0)
	if smac != b.lastSmac {
		b.learnMAC(w, smac)
	}
	if b.multiPair {
		src.flows.Record(hash, b.a.pair)
	}
	b.pkts++
	b.bytes += uint64(n)
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
	src.net.macs.Learn(mac, src, b.now)
	b.lastSmac = smac
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
				w.deliver(p, q, head, hdrLen, frameLen, hash)
				flooded = true
			}
		}
		if src.net.up != nil {
			w.floodUplink(src.net, q, head, hdrLen, frameLen) // uplink.go
			flooded = true
		}
		if !flooded {
			b.nodest++
		}
	}
	return frameDone
}

// unlockBurst releases the burst's locks. On the normal path the held RX
// vring was already released; after a fault it is still held: its frames
// are published unless it is the culprit, and it is unlocked so that
// serveSafely can lock and stop the culprit.
func (w *worker) unlockBurst(tx *netdev.Vring) {
	if h := &w.s.rx; h.v != nil {
		if w.s.inRX {
			w.s.blamed = h.v
			h.unready()
			h.v.Unlock()
			*h = rxHold{}
		} else {
			w.releaseRX(false)
		}
	}
	tx.Unlock()
}

// settleAfterFault finishes a burst that a fault in another vring's
// memory (culprit, now stopped) cut short, so that no guest waits forever:
// the TX chain in hand is returned (its frame is lost), the TX ring's
// completions are published and its guest interrupted, and every
// destination that got frames is interrupted.
// Those rings were readable a moment ago; should one fault now all the
// same, the rest of the settling is given up rather than the process.
func (w *worker) settleAfterFault(tx, culprit *netdev.Vring) {
	defer func() {
		if r := recover(); r != nil {
			w.s.nt = 0
			w.dp.log.Warn("second fault while settling a burst", "port", tx.Port.Name(), "vring", tx.Index, "err", r)
		}
	}()
	w.untouch(culprit)
	if tx != culprit {
		w.returnInHand(tx)
	}
	w.callTouched()
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
	if q.LastAvail() != q.UsedIdx() {
		q.Push(w.s.txHead, 0)
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
	*h = rxHold{v: rv, q: q, port: dst, hdrLen: rv.HdrLen(), mergeable: rv.Mergeable(), logging: q.Logging()}
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
		if n <= maxFrame && n >= s.minLen && r.Err() == nil {
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

// deliver copies a flooded frame into an RX vring of dst, walking the
// source chain again (a guest rewriting its descriptors meanwhile only
// hurts its own frame: the walk is bounded again and a frame that came
// out shorter is not delivered).
func (w *worker) deliver(dst *port, src *virtq.Queue, head uint16, srcHdr, frameLen int, hash uint32) {
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
	r.Skip(srcHdr)
	n, nbufs, res := w.fill(h, nil, &r, frameLen)
	switch {
	case res == fillDone && n == frameLen && r.Err() == nil:
		w.commit(h, nbufs, n)
	case res == fillDone:
		w.unfill(h, nbufs) // the source chain changed under us
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
