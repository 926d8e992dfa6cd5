package guestmem

import (
	"fmt"
	"runtime/debug"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Fault is an access to memory a frontend shared and then took back: it
// shrank the file behind a region or the dirty log (ftruncate of an
// unsealed memfd), so the page is gone and the access raised SIGBUS.
// Nothing in this process is wrong; the frontend's session is over.
type Fault struct {
	Addr uintptr // the faulting host address
}

func (f *Fault) Error() string {
	return fmt.Sprintf("memory fault at host address %#x: the frontend took back memory it shared", f.Addr)
}

// faultAddr is what the runtime panics with after a fault while
// debug.SetPanicOnFault is on.
type faultAddr interface{ Addr() uintptr }

// AsFault returns the Fault a recovered panic value stands for, or nil
// when it is not a memory fault (a bug, which the caller re-raises or
// reports as one).
func AsFault(r any) *Fault {
	if e, ok := r.(faultAddr); ok {
		return &Fault{Addr: e.Addr()}
	}
	return nil
}

// Catch turns a memory fault in the calling function into *err. It must
// be deferred directly, with the previous SetPanicOnFault setting that the
// same defer statement turned on:
//
//	defer guestmem.Catch(&err, debug.SetPanicOnFault(true))
//
// The goroutine's setting is restored on the way out. A panic that is not
// a memory fault goes on unwinding.
//
// This is how code outside the dataplane's workers (which run with
// SetPanicOnFault all the time and recover per ring) touches guest, ring
// or log memory: the control goroutines, the watchdog, a handoff.
func Catch(err *error, prev bool) {
	r := recover()
	debug.SetPanicOnFault(prev)
	if r == nil {
		return
	}
	if f := AsFault(r); f != nil {
		*err = f
		return
	}
	panic(r)
}

// Recover is Catch for a goroutine that runs with SetPanicOnFault on all
// the time (the dataplane's workers), where turning it on and back for
// each access would cost instructions on the per-burst path:
//
//	defer guestmem.Recover(&err)
func Recover(err *error) {
	r := recover()
	if r == nil {
		return
	}
	if f := AsFault(r); f != nil {
		*err = f
		return
	}
	panic(r)
}

// mapped reports whether addr lies in m.
func mapped(m []byte, addr uintptr) bool {
	if len(m) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	return addr >= base && addr-base < uintptr(len(m))
}

// Revoked says what the frontend took back, for a fault at addr: the
// region holding it and how far its file shrank; "" when addr is in none
// of t's regions.
func (t *Table) Revoked(addr uintptr) string {
	for _, r := range t.Regions() {
		if mapped(r.mapping, addr) {
			return fmt.Sprintf("guest memory region gpa %#x size %#x: %s", r.GPA, r.Size, fileNow(r.fd, r.offset+r.Size))
		}
	}
	return ""
}

// Revoked says what the frontend took back of the log, for a fault at
// addr; "" when addr is not in the log.
func (l *Log) Revoked(addr uintptr) string {
	if l == nil || !mapped(l.mapping, addr) {
		return ""
	}
	return fmt.Sprintf("dirty log of %d bytes: %s", len(l.words)*8, fileNow(l.fd, uint64(len(l.mapping))))
}

// fileNow says how many bytes the file behind fd has now against the
// needed bytes it had when it was mapped.
func fileNow(fd int, needed uint64) string {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Sprintf("its file cannot be examined: %v", err)
	}
	if uint64(st.Size) < needed {
		return fmt.Sprintf("its file now has %d bytes, %d were mapped (shrunk by the frontend)", st.Size, needed)
	}
	return fmt.Sprintf("its file has %d bytes, %d were mapped (shrunk and grown again)", st.Size, needed)
}

// Seals are the seals of a memory or log file (fcntl F_GET_SEALS).
type Seals struct {
	// Sealable: the file is a memfd that supports seals at all
	// (hugetlbfs files and plain files do not).
	Sealable bool
	// Shrink: F_SEAL_SHRINK is set, so the frontend can no longer take
	// the memory back.
	Shrink bool
	Grow   bool
	Write  bool
	Seal   bool // no further seals can be added or removed
}

// SealsOf reads fd's seals.
func SealsOf(fd int) Seals {
	v, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return Seals{}
	}
	return Seals{Sealable: true, Shrink: v&unix.F_SEAL_SHRINK != 0, Grow: v&unix.F_SEAL_GROW != 0,
		Write: v&unix.F_SEAL_WRITE != 0, Seal: v&unix.F_SEAL_SEAL != 0}
}

// Contains reports whether host address addr is in one of t's mappings.
func (t *Table) Contains(addr uintptr) bool {
	for _, r := range t.Regions() {
		if mapped(r.mapping, addr) {
			return true
		}
	}
	return false
}

// Contains reports whether host address addr is in the log's mapping.
func (l *Log) Contains(addr uintptr) bool { return l != nil && mapped(l.mapping, addr) }

// Contains reports whether host address addr is in the log c writes.
func (c *LogCache) Contains(addr uintptr) bool { return c.log.Contains(addr) }
