package netdev

import (
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/internal/release"
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
	Packets     LockedCounter
	Bytes       LockedCounter
	Kicks       atomic.Uint64
	Calls       atomic.Uint64
	DropNoBuf   atomic.Uint64 // RX: the guest had no (or too small) buffers
	Held        atomic.Uint64 // RX: guest frames that found the ring full and were held at their source
	HoldExpired atomic.Uint64 // RX: held frames dropped after the hold bound (also in DropNoBuf)
	DropDisable atomic.Uint64 // TX: frames a disabled ring sent were discarded; RX: ring disabled
	DropBad     atomic.Uint64 // chains that broke the ring protocol
	DropMTU     atomic.Uint64 // frames longer than the port MTU allows
	DropRunt    atomic.Uint64 // TX: frames shorter than an Ethernet header
	DropNoDest  atomic.Uint64 // TX: frames with nowhere to go
	DropSpoofed atomic.Uint64 // TX: frames from an address that is not the port's (port security)
	// DropRateLimited counts RX frames above the port's ingress limit.
	DropRateLimited atomic.Uint64
	// Shaped counts TX bursts the port's egress limit cut short.
	Shaped atomic.Uint64
	// Offloads: RX counts what was delivered to this guest, TX what its
	// guest sent.
	GSOWhole     atomic.Uint64 // RX: GSO frames delivered whole (metadata passed through)
	GSOSegmented atomic.Uint64 // RX: GSO frames cut into segments in software for this guest
	CsumSoftware atomic.Uint64 // RX: partial checksums completed in software for this guest
	DropOffload  atomic.Uint64 // TX: frames whose offload metadata did not fit the frame
	// Stalls counts the times the stall watchdog found this TX ring with
	// frames waiting and nothing taken for longer than its bound.
	Stalls atomic.Uint64
	// BaseMismatch counts ring starts whose SET_VRING_BASE disagreed with
	// the ring's used index.
	BaseMismatch atomic.Uint64
}

// LockedCounter is a counter its vring's lock serialises: only the lock's
// holder adds (a worker, once per burst), anyone loads. Add is a load and a
// release store, not a locked add: a burst's locked instructions make its
// worker wait for its stores into guest memory to drain (#29).
type LockedCounter struct{ v uint64 }

// Load reads the counter.
func (c *LockedCounter) Load() uint64 { return atomic.LoadUint64(&c.v) }

// Add adds n; the caller holds the vring's lock.
func (c *LockedCounter) Add(n uint64) { release.Store64(&c.v, atomic.LoadUint64(&c.v)+n) }

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

// TryLock takes the lock only if it is free: the stall watchdog never waits
// behind a worker's burst.
func (v *Vring) TryLock() bool { return v.mu.TryLock() }

// RingState is what a ring looks like from the device side, for the stall
// watchdog and the debug ring dump.
type RingState struct {
	Started, Enabled bool
	Ready            bool   // a queue exists: started, set up and memory mapped
	Broken           string // why the ring stopped, if it did
	Size             int
	EventIdx         bool
	AvailIdx         uint16 // the driver's published avail index
	LastAvail        uint16 // the next entry the device takes
	UsedIdx          uint16 // the device's used index
	AvailEvent       uint16 // EVENT_IDX: the driver kicks when AvailIdx passes it
	UsedEvent        uint16 // EVENT_IDX: the driver wants a call when UsedIdx passes it
	AvailFlags       uint16
	UsedFlags        uint16
	KickFD           int
}

// Pending is how many chains the driver made available that the device has
// not taken.
func (s RingState) Pending() uint16 { return s.AvailIdx - s.LastAvail }

// State reads the ring's state. A fault in the ring's memory stops the
// ring and ends the port's session (fault.go); the state then says so.
// Caller holds the lock.
func (v *Vring) State() RingState {
	s := RingState{Started: v.started, Enabled: v.enabled, Ready: v.q != nil, Size: v.num, KickFD: v.kickFD,
		LastAvail: v.base}
	if v.broken != nil {
		s.Broken = v.broken.Error()
	}
	if v.q != nil {
		if err := readState(v.q, &s); err != nil {
			v.faulted("ring state", err)
			s = RingState{Started: v.started, Enabled: v.enabled, Size: v.num, KickFD: v.kickFD, LastAvail: v.base, Broken: v.broken.Error()}
		}
	}
	return s
}

// readState fills in what the ring's memory says (the watchdog's scan
// allocates nothing: no closure).
func readState(q *virtq.Queue, s *RingState) (err error) {
	defer guestmem.Catch(&err, debug.SetPanicOnFault(true))
	s.read(q)
	return nil
}

// read fills in what the ring's memory says.
func (s *RingState) read(q *virtq.Queue) {
	s.Ready, s.EventIdx = true, q.EventIdx()
	s.AvailIdx, s.LastAvail, s.UsedIdx = q.AvailIdx(), q.LastAvail(), q.UsedIdx()
	s.AvailEvent, s.UsedEvent = q.AvailEvent(), q.UsedEvent()
	s.AvailFlags, s.UsedFlags = q.AvailFlags(), q.UsedFlags()
}

// LogValue prints the state as one group in the log.
func (s RingState) LogValue() slog.Value {
	return slog.GroupValue(slog.Bool("started", s.Started), slog.Bool("enabled", s.Enabled), slog.Bool("ready", s.Ready),
		slog.String("broken", s.Broken), slog.Int("size", s.Size), slog.Bool("eventIdx", s.EventIdx),
		slog.Int("availIdx", int(s.AvailIdx)), slog.Int("lastAvail", int(s.LastAvail)), slog.Int("usedIdx", int(s.UsedIdx)),
		slog.Int("availEvent", int(s.AvailEvent)), slog.Int("usedEvent", int(s.UsedEvent)),
		slog.Int("availFlags", int(s.AvailFlags)), slog.Int("usedFlags", int(s.UsedFlags)), slog.Int("kickFD", s.KickFD))
}

// Queue returns the ring when it may carry traffic: started, set up,
// memory mapped, enabled and not broken; nil otherwise. Caller holds the
// lock.
func (v *Vring) Queue() *virtq.Queue {
	if v.q == nil || !v.started || !v.enabled || v.broken != nil {
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
// Whether it does is read from ring memory (used_event, or the avail
// flags): a fault there stops the ring and ends the port's session
// (fault.go) instead of reaching the caller, which may be a worker
// serving another port. Caller is a worker (its thread turns faults into
// panics), holds the lock and has published used elements.
func (v *Vring) Call() {
	if v.q == nil || v.callFD < 0 {
		return
	}
	var needs bool
	if err := needsCallCaught(v.q, &needs); err != nil {
		v.faulted("interrupt decision", err)
		return
	}
	if !needs {
		return
	}
	unix.Write(v.callFD, eventOne[:])
	v.Counters.Calls.Add(1)
}

func needsCallCaught(q *virtq.Queue, needs *bool) (err error) {
	defer guestmem.Recover(&err)
	*needs = q.NeedsCall()
	return nil
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
// every message that changes that state. Only a started ring has a queue
// (spec "Ring states": SET_VRING_KICK starts a ring, GET_VRING_BASE stops
// it): a stopped ring is neither translated nor served, whatever arrives
// for it or for other rings meanwhile. Caller holds the lock.
func (v *Vring) rebuild(mem *guestmem.Table, f virtq.Features) (err error) {
	if v.q != nil {
		v.base = v.q.LastAvail() // keep a running ring's position
		if !v.guarded("log flush", (*virtq.Queue).FlushLog) {
			return v.broken
		}
	}
	v.q = nil
	defer guestmem.Catch(&err, debug.SetPanicOnFault(true)) // virtq.New reads the used index
	if !v.started || mem == nil || !v.addrSet || v.num == 0 {
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
	if q.LastAvail() != v.base {
		// The ring's used index disagrees with the base the frontend
		// gave: the used index wins (docs/architecture.md, "Ring
		// states"); said once per start.
		v.Counters.BaseMismatch.Add(1)
		v.Port.log.Warn("vring base differs from the ring's used index; resuming at the used index",
			"vring", v.Index, "base", v.base, "usedIdx", q.UsedIdx())
	}
	v.q, v.broken = q, nil
	v.base = q.LastAvail()
	return nil
}

// stop ends the ring's current life: it remembers where the driver should
// resume and drops the queue. Caller holds the lock.
func (v *Vring) stop() uint16 {
	if v.q != nil {
		v.base = v.q.LastAvail()
		v.guarded("log flush", (*virtq.Queue).FlushLog)
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
