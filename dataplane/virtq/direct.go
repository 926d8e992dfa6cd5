package virtq

import (
	"unsafe"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// The direct path: the chains real drivers post, served without the
// bounded walker. Linux and DPDK's virtio PMD post a TX frame as one
// readable descriptor (header and frame together) or as two (the header,
// then the frame), and RX buffers as one writable descriptor each; that is
// nearly every chain a dataplane sees. For those, a descriptor is copied
// out of the table once, every field is checked by equality or range
// (flags exactly 0, NEXT or WRITE, so no INDIRECT or mixed chain slips
// through; next < size; the buffer inside the queue's cached region), and
// the buffer becomes a slice only after the check. There is no loop, so
// no hop limit is needed. Anything else is declined before it is consumed
// and goes to the walker (chain.go), which accepts exactly what it
// accepted before.
//
// The views below are the same guest memory as desc, avail and used,
// typed so that a ring access is one indexed load or store.

// usedSlot is one used-ring element as the ring lays it out.
type usedSlot struct {
	id  uint32
	len uint32
}

// ringViews types a queue's rings; New fills them. The bases point at
// the descriptor table, the available ring's entries and the used ring's
// elements, each holding size entries; the accessors below index them
// with an index masked to size, so no access leaves them and none needs
// a bounds check.
type ringViews struct {
	descs, ring, slots unsafe.Pointer

	// The guest memory region the queue's buffers were last found in: a
	// hit is checked inline, a miss searches the table. rbase is mapped
	// memory outside the Go heap, valid as long as the queue (a queue is
	// rebuilt for every memory table).
	rgpa, rsize uint64
	rbase       unsafe.Pointer
}

// viewRings builds the typed views; New checked the slices (lengths,
// 2- and 4-alignment; descriptors need no more than 1).
func (q *Queue) viewRings() {
	q.v.descs = unsafe.Pointer(&q.desc[0])
	q.v.ring = unsafe.Pointer(&q.avail[4])
	q.v.slots = unsafe.Pointer(&q.used[4])
}

// descAt copies descriptor i (masked) out of the table.
func (q *Queue) descAt(i uint16) Desc {
	return *(*Desc)(unsafe.Add(q.v.descs, uintptr(i&q.mask)*virtio.DescSize))
}

// availAt reads available ring entry i (masked).
func (q *Queue) availAt(i uint16) uint16 {
	return *(*uint16)(unsafe.Add(q.v.ring, uintptr(i&q.mask)*2))
}

// usedAt is used ring element i (masked).
func (q *Queue) usedAt(i uint16) *usedSlot {
	return (*usedSlot)(unsafe.Add(q.v.slots, uintptr(i&q.mask)*virtio.UsedElemSize))
}

// Desc's layout must be the ring's (virtio spec §2.7.5, little endian).
var _ = [1]struct{}{}[unsafe.Sizeof(Desc{})-virtio.DescSize]

// buf returns the n guest bytes at addr, nil when they do not lie in one
// region. A hit in the cached region is decided inline (buf's callers
// call bufMiss only on a miss, or buf would not inline); the test is
// overflow-safe: addr below the region wraps off past rsize, and n is
// compared with what is left after off. Only then does the range become a
// slice.
func (q *Queue) buf(addr uint64, n uint32) []byte {
	if off := addr - q.v.rgpa; off < q.v.rsize && uint64(n) <= q.v.rsize-off {
		return unsafe.Slice((*byte)(unsafe.Add(q.v.rbase, off)), n)
	}
	return nil
}

// bufMiss is buf after a miss: it finds the region holding addr and
// caches it.
//
//go:noinline
func (q *Queue) bufMiss(addr uint64, n uint32) []byte {
	r := q.mem.Region(addr)
	if r == nil {
		return nil
	}
	b := r.Bytes()
	if len(b) == 0 {
		return nil
	}
	q.v.rgpa, q.v.rsize, q.v.rbase = r.GPA, uint64(len(b)), unsafe.Pointer(&b[0])
	return q.buf(addr, n)
}

// Taken is the outcome of PopTX and PopRX.
type Taken int

const (
	Direct   Taken = iota // a chain the direct path serves: use the buffers returned
	Walk                  // a chain taken that only the walker serves: NewReader/NewWriter(head)
	NoneLeft              // (PopRX) no chain available: nothing taken
	Broken                // the available ring is broken (a head out of range): nothing taken
)

// PopTX takes the next available chain (the caller checked Pending) and,
// when it is a direct TX chain whose header is hdrLen bytes, returns the
// header's first two bytes (flags and gso_type: zero for a frame without
// offload metadata) and the frame that follows the header, which is guest
// memory the driver may still write to: read each value once.
func (q *Queue) PopTX(hdrLen int) (head, lead uint16, frame []byte, t Taken) {
	head = q.availAt(q.lastAvail)
	if head >= q.size {
		return 0, 0, nil, Broken
	}
	q.lastAvail++
	d := q.descAt(head)
	switch {
	case d.Flags == 0 && d.Len >= uint32(hdrLen):
		b := q.buf(d.Addr, d.Len)
		if b == nil {
			if b = q.bufMiss(d.Addr, d.Len); b == nil {
				return head, 0, nil, Walk
			}
		}
		return head, uint16(b[0]) | uint16(b[1])<<8, b[hdrLen:], Direct
	case d.Flags == virtio.DescFNext && d.Len == uint32(hdrLen) && d.Next < q.size:
		d2 := q.descAt(d.Next)
		if d2.Flags != 0 {
			return head, 0, nil, Walk
		}
		h := q.buf(d.Addr, d.Len)
		if h == nil {
			if h = q.bufMiss(d.Addr, d.Len); h == nil {
				return head, 0, nil, Walk
			}
		}
		f := q.buf(d2.Addr, d2.Len)
		if f == nil {
			if f = q.bufMiss(d2.Addr, d2.Len); f == nil {
				return head, 0, nil, Walk
			}
		}
		return head, uint16(h[0]) | uint16(h[1])<<8, f, Direct
	}
	return head, 0, nil, Walk
}

// PopRX takes the next available chain (the caller checked Pending) and,
// when it is one writable descriptor of at least min bytes, returns its
// buffer.
func (q *Queue) PopRX(min int) (head uint16, buf []byte, t Taken) {
	head = q.availAt(q.lastAvail)
	if head >= q.size {
		return 0, nil, Broken
	}
	q.lastAvail++
	d := q.descAt(head)
	if d.Flags != virtio.DescFWrite || d.Len < uint32(min) {
		return head, nil, Walk
	}
	b := q.buf(d.Addr, d.Len)
	if b == nil {
		if b = q.bufMiss(d.Addr, d.Len); b == nil {
			return head, nil, Walk
		}
	}
	return head, b, Direct
}
