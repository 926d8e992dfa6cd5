package afxdp

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is the index half of an AF_XDP ring mapped from the kernel: a
// power-of-two array with a producer and a consumer index, each written by
// one side only. We keep cached copies of both (as libxdp does) and touch
// the shared ones only when the cached view runs out: an atomic load of the
// other side's index (acquire), an atomic store of ours after the entries
// (release). Go's sync/atomic is sequentially consistent, which is stronger
// than both.
type ring struct {
	producer *uint32
	consumer *uint32
	flags    *uint32
	mask     uint32
	size     uint32
	prod     uint32 // cached producer
	cons     uint32 // cached consumer
	mem      []byte // the mapping, for munmap
}

// mapRing maps one ring of a socket and points ring at its indexes. entry
// is the size of one entry (16 for descriptors, 8 for addresses); the
// returned pointer is the first entry.
func mapRing(fd int, pgoff int64, off unix.XDPRingOffset, size uint32, entry uintptr) (ring, unsafe.Pointer, error) {
	length := int(off.Desc) + int(size)*int(entry)
	mem, err := unix.Mmap(fd, pgoff, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return ring{}, nil, err
	}
	// The offsets come from the kernel (XDP_MMAP_OFFSETS); check them
	// against what we mapped before forming pointers.
	for _, o := range []uint64{off.Producer, off.Consumer, off.Flags} {
		if o+4 > off.Desc || o%4 != 0 {
			unix.Munmap(mem)
			return ring{}, nil, errBadOffsets
		}
	}
	if off.Desc%8 != 0 {
		unix.Munmap(mem)
		return ring{}, nil, errBadOffsets
	}
	base := unsafe.Pointer(unsafe.SliceData(mem))
	r := ring{
		producer: (*uint32)(unsafe.Add(base, off.Producer)),
		consumer: (*uint32)(unsafe.Add(base, off.Consumer)),
		flags:    (*uint32)(unsafe.Add(base, off.Flags)),
		mask:     size - 1,
		size:     size,
		mem:      mem,
	}
	r.prod = atomic.LoadUint32(r.producer)
	r.cons = atomic.LoadUint32(r.consumer)
	return r, unsafe.Add(base, off.Desc), nil
}

func (r *ring) unmap() {
	if r.mem != nil {
		unix.Munmap(r.mem)
		r.mem = nil
	}
}

// free returns how many entries a producer may write, at least want if
// the consumer has made room (re-reading its index only then).
func (r *ring) free(want uint32) uint32 {
	n := r.size - (r.prod - r.cons)
	if n >= want {
		return n
	}
	r.cons = atomic.LoadUint32(r.consumer)
	n = r.size - (r.prod - r.cons)
	if n > r.size { // a consumer index ahead of ours: not a state the kernel may put us in
		return 0
	}
	return n
}

// ready returns how many entries a consumer may read (up to want),
// re-reading the producer's index when the cached view is empty. An index
// claiming more than the ring holds is clamped to the ring.
func (r *ring) ready(want uint32) uint32 {
	n := r.prod - r.cons
	if n == 0 {
		r.prod = atomic.LoadUint32(r.producer)
		n = r.prod - r.cons
		if n > r.size {
			n = r.size
			r.prod = r.cons + r.size
		}
	}
	return min(n, want)
}

// publish makes the entries written so far visible to the consumer.
func (r *ring) publish() { atomic.StoreUint32(r.producer, r.prod) }

// release hands the entries read so far back to the producer.
func (r *ring) release() { atomic.StoreUint32(r.consumer, r.cons) }

// needWakeup reports the kernel's XDP_RING_NEED_WAKEUP flag.
func (r *ring) needWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

// descRing is an RX or TX ring: entries are struct xdp_desc.
type descRing struct {
	ring
	descs []unix.XDPDesc
}

// addrRing is a fill or completion ring: entries are UMEM addresses.
type addrRing struct {
	ring
	addrs []uint64
}
