package netdev

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
)

// Vring is one virtqueue of a port. Index 2i is the guest's RX queue of
// pair i (the dataplane writes into it), 2i+1 its TX queue (the dataplane
// reads from it).
//
// Locking: mu guards everything but the counters. A worker holds it for one
// burst; the control path holds it to change anything. Locks are taken in
// one global order so that a worker (which holds one TX vring and then one
// RX vring at a time) and the control path (which takes all TX vrings of a
// port, then all its RX vrings) cannot deadlock: TX vrings before RX
// vrings, and an RX vring lock is never held while waiting for another.
type Vring struct {
	mu    sync.Mutex
	Index int
	Port  *Port

	q       *virtq.Queue // nil unless the ring is fully set up and memory mapped
	num     int
	base    uint16
	addr    vhostuser.VringAddr
	addrSet bool
	kickFD  int
	callFD  int
	errFD   int
	started bool // SET_VRING_KICK seen since the last stop
	enabled bool
	broken  error // the driver broke the ring protocol; stopped until set up again
	hdrLen  int
	// mergeable: MRG_RXBUF negotiated, a frame may span several RX chains
	mergeable bool
	// id distinguishes vrings in a worker's epoll set
	ID uint32

	Counters Counters
}

// Counters are per-vring statistics, safe to read at any time.
type Counters struct {
	Packets     atomic.Uint64
	Bytes       atomic.Uint64
	Kicks       atomic.Uint64
	Calls       atomic.Uint64
	DropNoBuf   atomic.Uint64 // RX: the guest had no (or too small) buffers
	DropDisable atomic.Uint64 // TX: frames a disabled ring sent were discarded; RX: ring disabled
	DropBad     atomic.Uint64 // chains that broke the ring protocol
	DropMTU     atomic.Uint64 // frames longer than the port MTU allows
	DropRunt    atomic.Uint64 // TX: frames shorter than an Ethernet header
	DropNoDest  atomic.Uint64 // TX: frames with nowhere to go
	// Offloads: RX counts what was delivered to this guest, TX what its
	// guest sent.
	GSOWhole     atomic.Uint64 // RX: GSO frames delivered whole (metadata passed through)
	GSOSegmented atomic.Uint64 // RX: GSO frames cut into segments in software for this guest
	CsumSoftware atomic.Uint64 // RX: partial checksums completed in software for this guest
	DropOffload  atomic.Uint64 // TX: frames whose offload metadata did not fit the frame
}

var vringIDs atomic.Uint32

func newVring(p *Port, i int) *Vring {
	return &Vring{Index: i, Port: p, ID: vringIDs.Add(1), kickFD: -1, callFD: -1, errFD: -1, hdrLen: virtio.NetHdrSize}
}

// IsTX reports whether this is a guest TX ring (one the dataplane reads).
func (v *Vring) IsTX() bool { return v.Index%2 == 1 }

// Pair returns the queue pair index.
func (v *Vring) Pair() int { return v.Index / 2 }

// Lock takes the vring for a burst.
func (v *Vring) Lock() { v.mu.Lock() }

// Unlock releases it.
func (v *Vring) Unlock() { v.mu.Unlock() }

// Queue returns the ring when it may carry traffic: set up, memory mapped,
// enabled and not broken; nil otherwise. Caller holds the lock.
func (v *Vring) Queue() *virtq.Queue {
	if v.q == nil || !v.enabled || v.broken != nil {
		return nil
	}
	return v.q
}

// StartedDisabled returns the ring if it is started but disabled: a net
// backend must then consume and discard what the guest transmits
// (vhost-user spec, "Ring states"). Caller holds the lock.
func (v *Vring) StartedDisabled() *virtq.Queue {
	if v.q == nil || v.enabled || !v.started || v.broken != nil {
		return nil
	}
	return v.q
}

// Mergeable reports whether MRG_RXBUF was negotiated.
func (v *Vring) Mergeable() bool { return v.mergeable }

// HdrLen returns the virtio-net header length negotiated for this ring.
func (v *Vring) HdrLen() int { return v.hdrLen }

// KickFD returns the current kick eventfd, or -1. Caller holds the lock.
func (v *Vring) KickFD() int { return v.kickFD }

// Call notifies the guest that used buffers are ready, if it wants that.
// Caller holds the lock and has published used elements.
func (v *Vring) Call() {
	if v.q == nil || v.callFD < 0 || !v.q.NeedsCall() {
		return
	}
	unix.Write(v.callFD, eventOne[:])
	v.Counters.Calls.Add(1)
}

// Break stops the ring after the driver broke the ring protocol, signals
// the frontend's error eventfd, and reports whether it was newly broken.
// Caller holds the lock.
func (v *Vring) Break(err error) bool {
	if v.broken != nil {
		return false
	}
	v.broken = err
	v.Counters.DropBad.Add(1)
	if v.errFD >= 0 {
		unix.Write(v.errFD, eventOne[:])
	}
	return true
}

var eventOne = [8]byte{1}

// rebuild recreates the queue from the negotiated state; it is called after
// every message that changes that state. Caller holds the lock.
func (v *Vring) rebuild(mem *guestmem.Table, f virtq.Features) error {
	if v.q != nil {
		v.base = v.q.LastAvail() // keep a running ring's position
	}
	v.q = nil
	if mem == nil || !v.addrSet || v.num == 0 {
		return nil
	}
	desc, err := mem.SliceUVA(v.addr.Desc, uint64(virtio.DescSize*v.num))
	if err != nil {
		return errRing("descriptor table", v.addr.Desc, err)
	}
	avail, err := mem.SliceUVA(v.addr.Avail, uint64(virtio.AvailRingSize(v.num)))
	if err != nil {
		return errRing("available ring", v.addr.Avail, err)
	}
	used, err := mem.SliceUVA(v.addr.Used, uint64(virtio.UsedRingSize(v.num)))
	if err != nil {
		return errRing("used ring", v.addr.Used, err)
	}
	q, err := virtq.New(mem, v.num, desc, avail, used, v.base, f)
	if err != nil {
		return err
	}
	v.q, v.broken = q, nil
	return nil
}

// stop ends the ring's current life: it remembers where the driver should
// resume and drops the queue. Caller holds the lock.
func (v *Vring) stop() uint16 {
	if v.q != nil {
		v.base = v.q.LastAvail()
	}
	v.q, v.started = nil, false
	return v.base
}

func closeFD(fd *int) {
	if *fd >= 0 {
		unix.Close(*fd)
		*fd = -1
	}
}
