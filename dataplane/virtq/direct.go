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

// Taken is how GatherTX and PopRX took a chain.
type Taken uint8

const (
	Direct Taken = iota // a chain the direct path serves: use the buffers returned
	Walk                // a chain taken that only the walker serves: NewReader/NewWriter(head)
	Broken              // the available ring is broken (a head out of range): nothing taken
)

// TXFrame is a TX chain GatherTX took: its head and, when Kind is Direct,
// where its frame lies (Frame).
type TXFrame struct {
	off  uint64 // the frame's offset in the queue's cached region
	Len  uint32 // the frame's length, the header not counted
	Head uint16
	Kind Taken // Direct, or Walk: only the walker serves it (NewReader(Head))
}

// GatherTX takes up to len(out) available chains back to back (the
// caller checked Pending) and describes each in out: a burst's heads and
// descriptors are read together, before any frame is looked at. A direct
// TX chain is one descriptor holding the hdrLen-byte header and the frame
// (flags exactly 0) or two, the header (flags exactly NEXT, length exactly
// hdrLen, next in range) then the frame (flags exactly 0), inside one
// guest memory region, whose header carries no offload metadata (its
// first two bytes, flags and gso_type, zero; read once). It returns how
// many chains it took, and broken when it stopped at a head out of range
// (not taken). It also stops, without taking it, at a chain whose buffers
// lie outside the cached region unless that chain is the first: the
// frames it describes all lie in the region cached when it returns, where
// Frame finds them.
func (q *Queue) GatherTX(hdrLen int, out []TXFrame) (n int, broken bool) {
	h := uint32(hdrLen)
	for n < len(out) {
		head := q.availAt(q.lastAvail)
		if head >= q.size {
			return n, true
		}
		f := TXFrame{Head: head, Kind: Walk}
		d := q.descAt(head)
		switch {
		case d.Flags == 0 && d.Len >= h:
			off := d.Addr - q.v.rgpa
			if off >= q.v.rsize || uint64(d.Len) > q.v.rsize-off {
				if n > 0 {
					return n, false
				}
				q.gatherMiss(&f, d, d, h, true)
				break
			}
			if lead := (*[2]byte)(unsafe.Add(q.v.rbase, off)); lead[0]|lead[1] == 0 {
				f.off, f.Len, f.Kind = off+uint64(h), d.Len-h, Direct
			}
		case d.Flags == virtio.DescFNext && d.Len == h && d.Next < q.size:
			d2 := q.descAt(d.Next)
			if d2.Flags != 0 {
				break
			}
			hoff, off := d.Addr-q.v.rgpa, d2.Addr-q.v.rgpa
			if hoff >= q.v.rsize || uint64(h) > q.v.rsize-hoff || off >= q.v.rsize || uint64(d2.Len) > q.v.rsize-off {
				if n > 0 {
					return n, false
				}
				q.gatherMiss(&f, d, d2, h, false)
				break
			}
			if lead := (*[2]byte)(unsafe.Add(q.v.rbase, hoff)); lead[0]|lead[1] == 0 {
				f.off, f.Len, f.Kind = off, d2.Len, Direct
			}
		}
		out[n] = f
		q.lastAvail++
		n++
	}
	return n, false
}

// gatherMiss is GatherTX for a direct chain not wholly in the cached
// region: the header's descriptor d and the frame's d2 (one: d holds
// both) are each looked up, the frame's last, so that its region is the
// one cached.
//
//go:noinline
func (q *Queue) gatherMiss(f *TXFrame, d, d2 Desc, h uint32, one bool) {
	hb := q.find(d.Addr, d.Len)
	if hb == nil || hb[0]|hb[1] != 0 {
		return
	}
	if one {
		f.off, f.Len, f.Kind = d.Addr-q.v.rgpa+uint64(h), d.Len-h, Direct
		return
	}
	if q.find(d2.Addr, d2.Len) == nil {
		return
	}
	f.off, f.Len, f.Kind = d2.Addr-q.v.rgpa, d2.Len, Direct
}

// find is buf, looking the region up on a miss.
func (q *Queue) find(addr uint64, n uint32) []byte {
	if b := q.buf(addr, n); b != nil {
		return b
	}
	return q.bufMiss(addr, n)
}

// Frame is the frame of f, a Direct frame of the last GatherTX: guest
// memory the driver may still write to, so each value that decides
// anything is read once. It is nil when f does not lie in the cached
// region (a frame of an older gather).
func (q *Queue) Frame(f *TXFrame) []byte {
	if f.off > q.v.rsize || uint64(f.Len) > q.v.rsize-f.off {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Add(q.v.rbase, f.off)), f.Len)
}

// RXBuf is an RX chain GatherRX took: one writable descriptor.
type RXBuf struct {
	off  uint64 // the buffer's offset in the queue's cached region
	Len  uint32
	Head uint16
}

// GatherRX takes up to len(out) available chains back to back (the caller
// checked that many are available) while each is one writable descriptor
// of at least min bytes inside the cached region, describes them in out,
// and returns how many it took: it stops, without taking it, at any
// other chain (PopRX decides about that one). The buffers are where Buf
// finds them until the next PopRX.
func (q *Queue) GatherRX(min int, out []RXBuf) int {
	for n := range out {
		head := q.availAt(q.lastAvail)
		d := q.descAt(head)
		off := d.Addr - q.v.rgpa
		if head >= q.size || d.Flags != virtio.DescFWrite || d.Len < uint32(min) ||
			off >= q.v.rsize || uint64(d.Len) > q.v.rsize-off {
			return n
		}
		out[n] = RXBuf{off: off, Len: d.Len, Head: head}
		q.lastAvail++
	}
	return len(out)
}

// Buf is the buffer of b, a chain of the last GatherRX: guest memory. It
// is nil when b does not lie in the cached region (an older gather's).
func (q *Queue) Buf(b *RXBuf) []byte {
	if b.off > q.v.rsize || uint64(b.Len) > q.v.rsize-b.off {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Add(q.v.rbase, b.off)), b.Len)
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
