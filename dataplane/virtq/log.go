package virtq

import (
	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Dirty-page logging during live migration (vhost-user spec, "Migration"):
// while VHOST_F_LOG_ALL is negotiated, every byte the device writes into
// guest memory marks its page in the frontend's log, so that QEMU sends
// the page again. The device writes RX buffers (the dataplane's copies,
// through LogWritten and the Writer) and, when SET_VRING_ADDR asked for it
// with VHOST_VRING_F_LOG, the used ring: its elements, flags and index
// (marked when published) and avail_event. Marks gather in the queue's
// cache and reach the log at every Publish, before the vring's lock is let
// go; the stop (GET_VRING_BASE) takes that lock, so every write is logged
// before QEMU's last look at the log. With logging off, the per-frame cost
// is one flag test where the dataplane writes a buffer.

type queueLog struct {
	on        bool   // LOG_ALL: mark every write
	used      bool   // VHOST_VRING_F_LOG: the used ring's writes too
	usedGPA   uint64 // the used ring's guest address (log_guest_addr)
	published uint16 // the used index last marked
	c         guestmem.LogCache
}

// SetLog turns logging on with log l (nil: off); logUsed and usedGPA come
// from SET_VRING_ADDR. Caller holds the vring's lock.
func (q *Queue) SetLog(l *guestmem.Log, logUsed bool, usedGPA uint64) {
	if q.lg.on {
		q.lg.c.Flush()
	}
	if l == nil {
		q.lg = queueLog{}
		return
	}
	q.lg = queueLog{on: true, used: logUsed, usedGPA: usedGPA, published: q.usedIdx, c: guestmem.NewLogCache(l)}
}

// FlushLog puts the marks gathered so far into the log (a ring that
// stops or is rebuilt must not take them with it).
func (q *Queue) FlushLog() {
	if q.lg.on {
		q.lg.c.Flush()
	}
}

// Logging reports whether the queue marks its writes.
func (q *Queue) Logging() bool { return q.lg.on }

// LogWritten marks the pages of b, a buffer of this queue's guest memory
// the device just wrote (a direct RX buffer). Call only while Logging.
func (q *Queue) LogWritten(b []byte) {
	if len(b) == 0 {
		return
	}
	if gpa, ok := q.mem.GPAOf(b); ok {
		q.lg.c.Mark(gpa, uint64(len(b)))
	}
}

// logGPA marks n bytes written at gpa.
func (q *Queue) logGPA(gpa, n uint64) {
	if n > 0 {
		q.lg.c.Mark(gpa, n)
	}
}

// logUsedRing marks n bytes written at offset off of the used ring.
func (q *Queue) logUsedRing(off, n uint64) {
	if q.lg.used {
		q.lg.c.Mark(q.lg.usedGPA+off, n)
	}
	q.lg.c.Flush()
}

// logPublished marks the used elements published since the last time, and
// the used ring's flags and index, then flushes the cache into the log.
func (q *Queue) logPublished() {
	if q.lg.used {
		n := q.usedIdx - q.lg.published
		if n >= q.size || n == 0 {
			if n != 0 {
				q.lg.c.Mark(q.lg.usedGPA+4, virtio.UsedElemSize*uint64(q.size))
			}
		} else {
			first := uint64(q.lg.published & q.mask)
			if last := first + uint64(n); last <= uint64(q.size) {
				q.lg.c.Mark(q.lg.usedGPA+4+virtio.UsedElemSize*first, virtio.UsedElemSize*uint64(n))
			} else { // wraps around the ring's end
				q.lg.c.Mark(q.lg.usedGPA+4+virtio.UsedElemSize*first, virtio.UsedElemSize*(uint64(q.size)-first))
				q.lg.c.Mark(q.lg.usedGPA+4, virtio.UsedElemSize*(last-uint64(q.size)))
			}
		}
		q.lg.c.Mark(q.lg.usedGPA, 4)
	}
	q.lg.published = q.usedIdx
	q.lg.c.Flush()
}

// Holds reports whether host address addr is memory the queue reaches:
// its guest memory table or, while logging, its dirty log.
func (q *Queue) Holds(addr uintptr) bool {
	return q.mem.Contains(addr) || q.lg.on && q.lg.c.Contains(addr)
}
