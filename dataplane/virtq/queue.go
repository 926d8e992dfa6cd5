// Package virtq implements the device side of a virtio 1.x split virtqueue
// (OASIS virtio spec §2.7) on top of guest memory mapped by guestmem: taking
// available descriptor chains, walking them with a bounded iterator,
// returning used elements, and notification suppression with or without
// VIRTIO_RING_F_EVENT_IDX.
//
// A Queue is not safe for concurrent use; its owner (one vring of a
// dataplane/netdev port) serialises access with a lock held per burst.
// Nothing here allocates after New.
package virtq

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

var le = binary.LittleEndian

// Errors that make a queue unusable. The driver broke the ring protocol; the
// queue is stopped until the frontend sets it up again.
var (
	ErrAvailIdx        = errors.New("avail idx moved by more than the queue size")
	ErrHeadOutOfRange  = errors.New("available head index out of range")
	ErrChainLoop       = errors.New("descriptor chain longer than its table (loop)")
	ErrNextOutOfRange  = errors.New("descriptor next index out of range")
	ErrIndirectSize    = errors.New("indirect table length not a non-zero multiple of 16 within the queue size")
	ErrNestedIndirect  = errors.New("indirect descriptor inside an indirect table")
	ErrIndirectNext    = errors.New("descriptor has both INDIRECT and NEXT")
	ErrNoIndirect      = errors.New("indirect descriptor but INDIRECT_DESC not negotiated")
	ErrAddr            = errors.New("descriptor address range outside guest memory")
	ErrWriteOrder      = errors.New("device-readable descriptor after a device-writable one")
	ErrNotWritable     = errors.New("device-readable descriptor where a writable buffer is required")
	errBadQueueSize    = errors.New("queue size must be a power of 2 in 1..32768")
	errMisalignedRings = errors.New("used ring not 4-aligned or available ring not 2-aligned")
)

// Features selects ring behaviour negotiated with the driver.
type Features struct {
	EventIdx     bool // VIRTIO_RING_F_EVENT_IDX
	IndirectDesc bool // VIRTIO_RING_F_INDIRECT_DESC
}

// Queue is the device side of one split virtqueue.
type Queue struct {
	mem   *guestmem.Table
	size  uint16 // 32768 fits: sizes are powers of two up to 2^15
	mask  uint16
	desc  []byte
	avail []byte
	used  []byte
	feat  Features
	cur   guestmem.Cursor // last region hit by this queue's chains
	v     ringViews       // typed rings and the direct path's region (direct.go)
	lg    queueLog        // dirty-page logging during live migration (log.go)

	lastAvail      uint16 // next available ring entry to take
	usedIdx        uint16 // shadow of used.idx, published by Publish
	usedFlags      uint16
	signalledUsed  uint16
	signalledValid bool
}

// New sets up a queue over rings that the caller already translated into
// host memory (their lengths are checked here). lastAvail is the
// SET_VRING_BASE value.
func New(mem *guestmem.Table, size int, desc, avail, used []byte, lastAvail uint16, f Features) (*Queue, error) {
	if size < 1 || size > virtio.MaxQueueSize || size&(size-1) != 0 {
		return nil, fmt.Errorf("%w: got %d", errBadQueueSize, size)
	}
	if len(desc) != virtio.DescSize*size || len(avail) != virtio.AvailRingSize(size) || len(used) != virtio.UsedRingSize(size) {
		return nil, fmt.Errorf("ring slices do not match queue size %d", size)
	}
	if !aligned(used, 4) || !aligned(avail, 2) {
		return nil, errMisalignedRings
	}
	q := &Queue{mem: mem, size: uint16(size), mask: uint16(size - 1), desc: desc, avail: avail, used: used, feat: f}
	// This backend completes chains in order and never holds one across a
	// stop, so a ring resumes where its used index stands: lastAvail (the
	// SET_VRING_BASE value) equals used.idx. Where they differ, used.idx
	// wins, as in DPDK (translate_ring_addresses): chains between them were
	// taken and never returned, and taking them again (a TX frame resent,
	// an RX buffer refilled) is better than leaking them from the driver.
	// The caller sees the difference in LastAvail.
	q.viewRings()
	q.usedIdx = load16(used, 2)
	q.lastAvail = lastAvail
	if lastAvail != q.usedIdx {
		q.lastAvail = q.usedIdx
	}
	return q, nil
}

// AvailIdx returns the driver's published avail index (acquire).
func (q *Queue) AvailIdx() uint16 { return loadAcquire16(q.avail, 2) }

// AvailFlags returns the driver's avail ring flags.
func (q *Queue) AvailFlags() uint16 { return load16(q.avail, 0) }

// UsedFlags returns the used ring flags as last set by this device.
func (q *Queue) UsedFlags() uint16 { return q.usedFlags }

// AvailEvent returns the avail_event this device last published (EVENT_IDX:
// the driver kicks when its avail index passes it).
func (q *Queue) AvailEvent() uint16 { return load16(q.used, 4+virtio.UsedElemSize*int(q.size)) }

// UsedEvent returns the driver's used_event (EVENT_IDX).
func (q *Queue) UsedEvent() uint16 { return load16(q.avail, 4+2*int(q.size)) }

// EventIdx reports whether VIRTIO_RING_F_EVENT_IDX is in use.
func (q *Queue) EventIdx() bool { return q.feat.EventIdx }

// Size returns the number of ring entries.
func (q *Queue) Size() int { return int(q.size) }

// LastAvail returns the next available index to be taken; GET_VRING_BASE
// reports it.
func (q *Queue) LastAvail() uint16 { return q.lastAvail }

// UsedIdx returns the device's used index (published or not).
func (q *Queue) UsedIdx() uint16 { return q.usedIdx }

// Pending returns how many chains the driver has made available and not yet
// taken. An avail idx that moved by more than the queue size is a broken
// ring.
func (q *Queue) Pending() (int, error) {
	n := loadAcquire16(q.avail, 2) - q.lastAvail
	if n > q.size {
		return 0, ErrAvailIdx
	}
	return int(n), nil
}

// Pop takes the next available head. The caller checked Pending.
func (q *Queue) Pop() (uint16, error) {
	head := q.availAt(q.lastAvail)
	if head >= q.size {
		return 0, ErrHeadOutOfRange
	}
	q.lastAvail++
	return head, nil
}

// Unpop gives back the last n popped heads (not yet pushed), e.g. when a
// packet did not fit and is dropped without consuming buffers.
func (q *Queue) Unpop(n int) { q.lastAvail -= uint16(n) }

// Push writes a used element without publishing it.
func (q *Queue) Push(head uint16, length uint32) {
	*q.usedAt(q.usedIdx) = usedSlot{id: uint32(head), len: length}
	q.usedIdx++
}

// Unpush forgets the last n unpublished used elements.
func (q *Queue) Unpush(n int) { q.usedIdx -= uint16(n) }

// Publish makes every pushed element visible to the driver (release). It is
// not a full fence: NeedsCall fences before it decides.
func (q *Queue) Publish() {
	storeRelease32(q.used, 0, uint32(q.usedFlags)|uint32(q.usedIdx)<<16)
	if q.lg.on {
		q.logPublished()
	}
}

// NeedsCall decides, after Publish, whether the driver wants an interrupt
// for the elements published since the last decision (virtio spec §2.7.10;
// the EVENT_IDX test is vring_need_event from the Linux virtio_ring.h).
func (q *Queue) NeedsCall() bool {
	fence()
	if q.feat.EventIdx {
		event := load16(q.avail, 4+2*int(q.size))
		old, valid := q.signalledUsed, q.signalledValid
		q.signalledUsed, q.signalledValid = q.usedIdx, true
		if !valid {
			return true
		}
		return q.usedIdx-event-1 < q.usedIdx-old
	}
	return load16(q.avail, 0)&virtio.AvailFNoInterrupt == 0
}

// SetNotify asks the driver to kick (enable) or not to kick (disable) when
// it adds buffers. After enabling it re-checks the ring, closing the race
// with a driver that added buffers while notifications were off: more
// reports work that arrived meanwhile.
func (q *Queue) SetNotify(enable bool) (more bool) {
	if q.feat.EventIdx {
		if !enable {
			return false // a stale avail_event already suppresses kicks
		}
		store16(q.used, 4+virtio.UsedElemSize*int(q.size), q.lastAvail)
		if q.lg.on {
			q.logUsedRing(4+virtio.UsedElemSize*uint64(q.size), 2)
		}
	} else {
		if enable {
			q.usedFlags &^= virtio.UsedFNoNotify
		} else {
			q.usedFlags |= virtio.UsedFNoNotify
		}
		q.Publish()
	}
	if !enable {
		return false
	}
	fence()
	n, err := q.Pending()
	return n > 0 || err != nil
}

// Chain returns a bounded walker over the chain starting at head; a head
// outside the table yields an empty walk with ErrHeadOutOfRange.
func (q *Queue) Chain(head uint16) Chain {
	if head >= q.size {
		return Chain{err: ErrHeadOutOfRange}
	}
	return Chain{
		mem: q.mem, cur: &q.cur, table: q.desc, n: uint32(q.size), next: uint32(head), ttl: uint32(q.size),
		more: true, maxIndirect: uint32(q.size), allowIndirect: q.feat.IndirectDesc,
	}
}
