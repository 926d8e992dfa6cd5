package virtq

import (
	"sync/atomic"
	"unsafe"

	"github.com/vhostmq/vhostmq/dataplane/internal/release"
)

// This file holds every load, store and fence on ring memory that the
// driver may access concurrently. Ring memory is guest memory mapped with
// mmap, outside the Go heap.
//
// Go's sync/atomic has no 16-bit operations, and the spec only guarantees
// 2-byte alignment for the available ring. The rules used here:
//
//   - avail.idx (acquire): the 32-bit aligned word that holds it always lies
//     inside the available ring (it holds flags+idx or idx+ring[0]), so it
//     is read with atomic.LoadUint32 and the half we want is extracted.
//   - used.flags+used.idx (release): both are device-owned and the used ring
//     is 4-aligned (checked when the ring is set up), so they are published
//     together with one 32-bit release store (package release: a plain
//     store on amd64). It is not a full fence: NeedsCall and SetNotify
//     fence before the loads that must follow it.
//   - avail.flags, used_event: plain 16-bit loads through a non-inlined
//     function, so the compiler cannot cache them across polls; on the
//     architectures we build for an aligned 16-bit load is single-copy
//     atomic. They are read after a full fence where the spec requires one.
//   - avail_event: a plain 16-bit store followed by fence().
//   - used elements and descriptors: plain loads/stores; descriptors are
//     copied into a local once before use (a guest may rewrite them at any
//     time).

// fence is a full memory barrier: a locked read-modify-write on amd64 and
// a sequentially consistent RMW elsewhere, on a word of the caller's own
// stack (as DPDK's rte_smp_mb on x86: lock add to the stack): a shared
// word would be one cache line every worker's fences pull to their CPU.
func fence() {
	var w uint32
	atomic.AddUint32(&w, 0)
}

//go:noinline
func load16(b []byte, off int) uint16 {
	_ = b[off+1]
	return *(*uint16)(unsafe.Pointer(&b[off]))
}

//go:noinline
func store16(b []byte, off int, v uint16) {
	_ = b[off+1]
	*(*uint16)(unsafe.Pointer(&b[off])) = v
}

// loadAcquire16 reads the u16 at b[off] with acquire ordering. b[off] must
// be 2-aligned in host memory and the enclosing aligned 32-bit word must be
// mapped (see the file comment for why that holds for avail.idx).
func loadAcquire16(b []byte, off int) uint16 {
	_ = b[off+1]
	p := unsafe.Pointer(&b[off])
	mis := uintptr(p) & 3 // 0 or 2
	v := atomic.LoadUint32((*uint32)(unsafe.Add(p, -int(mis))))
	return uint16(v >> (mis * 8))
}

// storeRelease32 publishes a 4-aligned 32-bit word.
func storeRelease32(b []byte, off int, v uint32) {
	_ = b[off+3]
	release.Store32((*uint32)(unsafe.Pointer(&b[off])), v)
}

// aligned reports whether b's first byte sits at a host address that is a
// multiple of n (a power of two).
func aligned(b []byte, n uintptr) bool {
	return len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))&(n-1) == 0
}
