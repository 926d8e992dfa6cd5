package netdev

import (
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
)

// Faults in a port's shared memory.
//
// A frontend can take back memory it shared (ftruncate of an unsealed
// memfd behind a region or the dirty log): the next access to it raises
// SIGBUS. Every access to guest, ring or log memory happens in code that
// turns that into an error of this port alone:
//   - the dataplane's workers run with debug.SetPanicOnFault and recover
//     per ring (dataplane/worker.go);
//   - everything else (the session's handlers, ring stops and rebuilds,
//     log flushes, the watchdog's look at a ring, a handoff's adoption)
//     goes through Vring.guarded or a function that defers guestmem.Catch.
//
// Whoever catches the fault stops the ring (Break) and calls Port.Fault,
// which ends the session: its connection is closed, the session goroutine
// resets the port (every ring stopped under its lock, the memory
// unmapped), reports what was revoked and counts it, and the port waits for
// its next frontend. Its slots, workers and every other port carry on.

// FaultReason says which shared memory faulted.
type FaultReason string

// The reasons, as the vhostmq_port_faults_total metric labels them.
const (
	FaultGuestMemory FaultReason = "guest_memory" // a region of SET_MEM_TABLE / ADD_MEM_REG
	FaultDirtyLog    FaultReason = "dirty_log"    // SET_LOG_BASE's log
)

// FaultCounts counts sessions ended by a fault, by reason.
type FaultCounts struct {
	GuestMemory uint64
	DirtyLog    uint64
}

// faults is a port's fault bookkeeping. Its lock is a leaf: Fault runs
// under vring locks, from workers, the watchdog and the control path.
type faults struct {
	mu sync.Mutex
	// first is the current session's first fault, until reset reports it
	first *pendingFault
	// live is the current session's connection: Fault closes it, and a
	// fault recorded for an older connection is not this session's
	live atomic.Pointer[net.UnixConn]

	guestMemory, dirtyLog atomic.Uint64
}

type pendingFault struct {
	conn  *net.UnixConn
	vring int // -1: not one ring's
	where string
	addr  uintptr
	// reason and revoked, when set, say what was lost before it was
	// mapped (an adoption that found a file shrunk)
	reason  FaultReason
	revoked string
}

// Fault ends the port's session after an access to its shared memory
// faulted (f) while serving vring v in where ("forwarding", "log flush",
// ...). It records the session's first fault and closes its connection;
// the session's goroutine then resets the port and reports the fault.
// Safe from any goroutine, with v's lock held or not; it never blocks.
func (p *Port) Fault(v *Vring, where string, f *guestmem.Fault) {
	c := p.fault.live.Load()
	if c == nil {
		return // no session: nothing of it left to fault
	}
	p.fault.mu.Lock()
	if p.fault.first == nil || p.fault.first.conn != c {
		p.fault.first = &pendingFault{conn: c, vring: v.Index, where: where, addr: f.Addr}
	}
	p.fault.mu.Unlock()
	c.Close()
}

// faulted reports whether the current session already faulted.
func (p *Port) faulted() bool {
	c := p.fault.live.Load()
	p.fault.mu.Lock()
	defer p.fault.mu.Unlock()
	return c != nil && p.fault.first != nil && p.fault.first.conn == c
}

// errFaulted ends a session whose memory faulted before it was served
// (in its adoption).
var errFaulted = errors.New("the session's shared memory faulted")

// reportFault logs and counts the ending session's fault, if it had one,
// against the tables it was mapped in (still mapped: reset unmaps them
// after). Called by reset once every ring is stopped, so no later access
// to this session's memory can fault.
func (p *Port) reportFault(mem *guestmem.Table, lg *guestmem.Log) (reported bool) {
	c := p.fault.live.Load()
	p.fault.mu.Lock()
	f := p.fault.first
	p.fault.first = nil
	p.fault.mu.Unlock()
	if f == nil || f.conn != c {
		return false
	}
	reason, revoked := f.reason, f.revoked
	if revoked == "" {
		reason, revoked = FaultGuestMemory, mem.Revoked(f.addr)
	}
	if revoked == "" {
		if revoked = lg.Revoked(f.addr); revoked != "" {
			reason = FaultDirtyLog
		} else {
			revoked = "memory no longer in the port's mappings"
		}
	}
	switch reason {
	case FaultGuestMemory:
		p.fault.guestMemory.Add(1)
	case FaultDirtyLog:
		p.fault.dirtyLog.Add(1)
	}
	p.log.Warn("frontend took back memory it shared: its session ended, the port waits for its next frontend",
		"socket", p.cfg.Socket, "vring", f.vring, "while", f.where, "revoked", revoked, "reason", string(reason),
		"faultAddress", fmt.Sprintf("%#x", f.addr))
	return true
}

// Faults counts the sessions a fault in their shared memory ended.
func (p *Port) Faults() FaultCounts {
	return FaultCounts{GuestMemory: p.fault.guestMemory.Load(), DirtyLog: p.fault.dirtyLog.Load()}
}

// guarded runs fn on v's queue, turning a fault in the port's shared
// memory into the end of the port's session (v stops). It reports whether
// fn ran to its end. Caller holds v's lock; v has a queue.
func (v *Vring) guarded(where string, fn func(q *virtq.Queue)) bool {
	err := runCaught(v.q, fn)
	if err == nil {
		return true
	}
	v.faulted(where, err)
	return false
}

func runCaught(q *virtq.Queue, fn func(q *virtq.Queue)) (err error) {
	defer guestmem.Catch(&err, debug.SetPanicOnFault(true))
	fn(q)
	return nil
}

// faulted stops v after a fault (err, a *guestmem.Fault) in where: the
// queue is dropped, the ring broken, the session ended. Caller holds v's
// lock.
func (v *Vring) faulted(where string, err error) {
	v.q = nil
	v.Break(err)
	var f *guestmem.Fault
	if errors.As(err, &f) {
		v.Port.Fault(v, where, f)
	}
}

// brokenBy stops v as faulted when err is a fault in the port's shared
// memory, and reports whether it was. Caller holds v's lock.
func (v *Vring) brokenBy(err error, where string) bool {
	var f *guestmem.Fault
	if !errors.As(err, &f) {
		return false
	}
	v.faulted(where, err)
	return true
}

func notifyOff(q *virtq.Queue) { q.SetNotify(false) }

// Holds reports whether host address addr is memory v's queue reaches:
// its port's guest memory or dirty log, as the queue maps them. A worker
// that faulted while touching two ports' rings asks which one's memory it
// was. Caller holds v's lock.
func (v *Vring) Holds(addr uintptr) bool {
	if v.q == nil {
		return false
	}
	return v.q.Holds(addr)
}

// SetNotify is q.SetNotify(enable) on v's queue q (Queue or
// StartedDisabled), safe from any goroutine: a fault stops the ring, ends
// the session and reports more, so that the caller looks at the ring
// again and finds it stopped. Caller holds v's lock.
func (v *Vring) SetNotify(q *virtq.Queue, enable bool) (more bool) {
	if err := setNotifyCaught(q, enable, &more); err != nil {
		v.faulted("notification setting", err)
		return true
	}
	return more
}

func setNotifyCaught(q *virtq.Queue, enable bool, more *bool) (err error) {
	defer guestmem.Catch(&err, debug.SetPanicOnFault(true))
	*more = q.SetNotify(enable)
	return nil
}

// Pending reports whether q has chains waiting to be taken (or a broken
// avail index the worker must see). A fault in ring memory stops the ring
// and ends the port's session, as SetNotify's does, and reports true: the
// worker looks at the ring and finds it stopped. Caller holds the lock.
func (v *Vring) Pending(q *virtq.Queue) bool {
	var n int
	var perr error
	if err := pendingCaught(q, &n, &perr); err != nil {
		v.faulted("avail index", err)
		return true
	}
	return n > 0 || perr != nil
}

func pendingCaught(q *virtq.Queue, n *int, perr *error) (err error) {
	defer guestmem.Catch(&err, debug.SetPanicOnFault(true))
	*n, *perr = q.Pending()
	return nil
}
