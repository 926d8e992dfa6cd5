package dataplane

// The per-packet path. A worker serves the TX vring of each queue pair it
// owns, in bursts:
//
//  1. lock the TX vring, take up to burstSize available chains;
//  2. per chain: walk it once (bounds, length, peek at the headers), learn
//     the source MAC, record the flow's TX queue, look up the destination;
//  3. deliver: lock the chosen RX vring of each destination port (one
//     for a known unicast address, every other port when flooding), copy
//     the frame from the source guest's buffers straight into the
//     destination guest's buffers (one copy), publish, unlock;
//  4. return the TX chains, publish once, interrupt the source guest once
//     if it asked for it, then interrupt each destination once.
//
// Locking follows netdev.Vring: a TX vring, then at most one RX vring at a
// time. Nothing here allocates.

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

// scratch is a worker's per-burst state, allocated once.
type scratch struct {
	peek    [virtio.NetHdrSize + vswitch.HeaderPeek]byte
	hdr     [virtio.NetHdrSize]byte
	used    [maxMergeBufs]usedElem
	touched [maxTouched]*netdev.Vring
	nt      int
	culprit *netdev.Vring // the vring whose memory is being touched, blamed for a fault
}

// serveTX forwards one burst from a TX vring and reports whether there was
// work.
func (w *worker) serveTX(a *assignment) bool {
	v := a.tx
	v.Lock()
	defer v.Unlock()
	q := v.Queue()
	discard := false
	if q == nil {
		if q = v.StartedDisabled(); q == nil {
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
	src := a.port
	hdrLen := v.HdrLen()
	maxFrame := src.dev.MTU() + ethHeader + vlanTag
	now := time.Now().UnixNano()
	var pkts, bytes, runts, oversize, nodest, disabled uint64
	s := &w.s
	for range n {
		head, err := q.Pop()
		if err != nil {
			w.breakVring(v, err)
			break
		}
		s.culprit = v
		r := q.NewReader(head)
		got := r.Read(s.peek[:])
		total := got + r.Skip(maxFrame+hdrLen+1)
		if err := r.Err(); err != nil {
			q.Unpop(1)
			w.breakVring(v, err)
			break
		}
		q.Push(head, 0)
		frameLen := total - hdrLen
		switch {
		case discard:
			disabled++
			continue
		case frameLen < ethHeader:
			runts++
			continue
		case frameLen > maxFrame:
			oversize++
			continue
		}
		frame := s.peek[hdrLen:got]
		var dst, smac vswitch.MAC
		copy(dst[:], frame[0:6])
		copy(smac[:], frame[6:12])
		src.net.macs.Learn(smac, src, now)
		hash := vswitch.FlowHash(frame)
		src.flows.Record(hash, a.pair)
		// Every frame that passed the checks counts as transmitted; a frame
		// that finds no room at its destination is counted there
		// (rxNoBuffer/rxDisabled), one with no destination at all here.
		pkts++
		bytes += uint64(frameLen)
		// DHCP from a guest whose lease the dataplane holds is answered
		// here (local.go), never switched.
		if src.dhcp != nil && dhcp.IsClientFrame(frame) {
			w.answerDHCP(src, q, head, hdrLen, frameLen)
			continue
		}
		if !dst.IsMulticast() {
			if p, ok := src.net.macs.Lookup(dst); ok {
				if p == src {
					nodest++ // addressed to its own port: a hairpin we do not do
				} else {
					w.deliver(p, q, head, hdrLen, frameLen, hash)
				}
				continue
			}
		}
		flooded := false
		for _, p := range *src.net.ports.Load() {
			if p != src {
				w.deliver(p, q, head, hdrLen, frameLen, hash)
				flooded = true
			}
		}
		if !flooded {
			nodest++
		}
	}
	s.culprit = nil
	q.Publish()
	v.Call()
	c := &v.Counters
	c.Packets.Add(pkts)
	c.Bytes.Add(bytes)
	if runts|oversize|nodest|disabled != 0 {
		c.DropRunt.Add(runts)
		c.DropMTU.Add(oversize)
		c.DropNoDest.Add(nodest)
		c.DropDisable.Add(disabled)
	}
	w.callTouched()
	return true
}

// deliver copies one frame into an RX vring of dst. The frame is read
// again from the source chain (a guest rewriting its descriptors meanwhile
// only hurts its own frame: the walk is bounded again).
func (w *worker) deliver(dst *port, src *virtq.Queue, head uint16, srcHdr, frameLen int, hash uint32) bool {
	pair := dst.pickRX(hash)
	if pair < 0 {
		dst.dev.Vrings()[0].Counters.DropDisable.Add(1)
		return false
	}
	rv := dst.dev.Vrings()[2*pair]
	rv.Lock()
	defer rv.Unlock()
	rq := rv.Queue()
	if rq == nil {
		rv.Counters.DropDisable.Add(1)
		return false
	}
	s := &w.s
	prev := s.culprit
	s.culprit = rv
	ok := w.deliverLocked(rv, rq, src, head, srcHdr, frameLen)
	// Restored on a normal return only: after a fault in rv's memory
	// serveSafely must find rv, not the source ring, as the culprit. (One
	// defer and few returns also keep the defer open-coded.)
	s.culprit = prev
	return ok
}

// deliverLocked is deliver's copy into rq; the caller holds rv's lock.
func (w *worker) deliverLocked(rv *netdev.Vring, rq *virtq.Queue, src *virtq.Queue, head uint16, srcHdr, frameLen int) bool {
	s := &w.s
	avail, err := rq.Pending()
	if err != nil {
		w.breakVring(rv, err)
		return false
	}
	r := src.NewReader(head)
	r.Skip(srcHdr)

	dhdr := rv.HdrLen()
	hdr := virtio.NetHdr{NumBuffers: 1}
	hdr.Encode(s.hdr[:])
	nbufs, copied := 0, 0
	for {
		if nbufs == avail || nbufs == maxMergeBufs || (nbufs == 1 && !rv.Mergeable()) {
			rq.Unpop(nbufs)
			rv.Counters.DropNoBuf.Add(1)
			return false
		}
		h, err := rq.Pop()
		if err != nil {
			rq.Unpop(nbufs)
			w.breakVring(rv, err)
			return false
		}
		wr := rq.NewWriter(h)
		n := 0
		if nbufs == 0 {
			if n = wr.Write(s.hdr[:dhdr]); n < dhdr {
				if wr.Err() != nil {
					rq.Unpop(1)
					w.breakVring(rv, wr.Err())
					return false
				}
				rq.Unpop(1)
				rv.Counters.DropNoBuf.Add(1)
				return false
			}
		}
		c := wr.CopyFrom(&r, frameLen-copied)
		if err := wr.Err(); err != nil {
			rq.Unpop(nbufs + 1)
			w.breakVring(rv, err)
			return false
		}
		copied += c
		s.used[nbufs] = usedElem{head: h, len: uint32(n + c)}
		nbufs++
		if copied == frameLen {
			break
		}
		if r.Err() != nil || (c == 0 && !wr.Full()) {
			// the source chain changed under us and ended early
			rq.Unpop(nbufs)
			return false
		}
	}
	if nbufs > 1 {
		// num_buffers lives in the first chain's header (it may be split
		// across descriptors, so write it through a walker).
		wr := rq.NewWriter(s.used[0].head)
		wr.Skip(10)
		var nb [2]byte
		nb[0], nb[1] = byte(nbufs), byte(nbufs>>8)
		wr.Write(nb[:])
	}
	for i := range nbufs {
		rq.Push(s.used[i].head, s.used[i].len)
	}
	rq.Publish()
	rv.Counters.Packets.Add(1)
	rv.Counters.Bytes.Add(uint64(frameLen))
	w.touch(rv)
	return true
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

// callTouched interrupts each destination guest once per burst.
func (w *worker) callTouched() {
	s := &w.s
	for i := range s.nt {
		rv := s.touched[i]
		s.touched[i] = nil
		rv.Lock()
		rv.Call()
		rv.Unlock()
	}
	s.nt = 0
}

// breakVring stops a vring whose driver broke the ring protocol. Caller
// holds its lock.
func (w *worker) breakVring(v *netdev.Vring, err error) {
	if v.Break(err) {
		w.dp.log.Warn("vring stopped: the guest broke the ring protocol; it restarts when the frontend sets it up again",
			"port", v.Port.Name(), "vring", v.Index, "err", err)
	}
}
