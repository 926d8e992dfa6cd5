package virtq

import (
	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Desc is one split-ring descriptor, copied out of guest memory once so
// that a guest rewriting it cannot change it between check and use.
type Desc struct {
	Addr  uint64
	Len   uint32
	Flags uint16
	Next  uint16
}

func readDesc(table []byte, i uint32) Desc {
	e := table[i*virtio.DescSize : i*virtio.DescSize+virtio.DescSize]
	return Desc{Addr: le.Uint64(e), Len: le.Uint32(e[8:]), Flags: le.Uint16(e[12:]), Next: le.Uint16(e[14:])}
}

// Chain walks one descriptor chain (virtio spec §2.7.5, §2.7.5.3) and never
// trusts it: next indices are checked against the table, hops are bounded by
// the table size (TTL), an indirect table is one level deep, a multiple of
// 16 bytes and at most queue-size entries, readable descriptors come before
// writable ones, and every buffer must lie in guest memory. The first
// violation ends the walk and is kept in Err.
type Chain struct {
	mem           *guestmem.Table
	cur           *guestmem.Cursor // the queue's, nil for an empty walk
	table         []byte           // descriptor table being walked: the ring's or an indirect one
	n             uint32           // entries in table
	next          uint32
	ttl           uint32
	maxIndirect   uint32
	more          bool
	indirect      bool
	allowIndirect bool
	seenWrite     bool
	err           error

	// the part of the current descriptor not yet returned by Next
	addr  uint64
	left  uint32
	write bool
}

// Err returns why the walk stopped early, or nil.
func (c *Chain) Err() error { return c.err }

func (c *Chain) fail(err error) bool {
	c.err, c.more, c.left = err, false, 0
	return false
}

// nextDesc advances to the next descriptor with a buffer.
func (c *Chain) nextDesc() bool {
	for {
		if !c.more {
			return false
		}
		if c.ttl == 0 {
			return c.fail(ErrChainLoop)
		}
		c.ttl--
		d := readDesc(c.table, c.next)
		if d.Flags&virtio.DescFIndirect != 0 {
			switch {
			case c.indirect:
				return c.fail(ErrNestedIndirect)
			case !c.allowIndirect:
				return c.fail(ErrNoIndirect)
			case d.Flags&virtio.DescFNext != 0:
				return c.fail(ErrIndirectNext)
			case d.Len == 0 || d.Len%virtio.DescSize != 0 || d.Len/virtio.DescSize > c.maxIndirect:
				return c.fail(ErrIndirectSize)
			}
			tbl, err := c.cur.Slice(c.mem, d.Addr, uint64(d.Len))
			if err != nil {
				return c.fail(ErrAddr)
			}
			c.table, c.n, c.next, c.ttl, c.indirect = tbl, d.Len/virtio.DescSize, 0, d.Len/virtio.DescSize, true
			continue
		}
		if d.Flags&virtio.DescFNext != 0 {
			if uint32(d.Next) >= c.n {
				return c.fail(ErrNextOutOfRange)
			}
			c.next = uint32(d.Next)
		} else {
			c.more = false
		}
		w := d.Flags&virtio.DescFWrite != 0
		if w {
			c.seenWrite = true
		} else if c.seenWrite {
			return c.fail(ErrWriteOrder)
		}
		if d.Len == 0 {
			continue
		}
		if d.Addr+uint64(d.Len) < d.Addr {
			return c.fail(ErrAddr)
		}
		c.addr, c.left, c.write = d.Addr, d.Len, w
		return true
	}
}

// done reports, without walking, that the chain has nothing left: the
// current descriptor is used up and it had no NEXT (or the walk failed).
// Next would return nothing; the readers' loops ask this first because
// it inlines and Next does not.
func (c *Chain) done() bool { return c.left == 0 && !c.more }

// Next returns the next host-contiguous piece of the chain's buffers and
// whether it is device-writable. A descriptor whose guest range spans two
// mapped regions comes back in two pieces.
func (c *Chain) Next() (buf []byte, write bool, ok bool) {
	if c.left == 0 && !c.nextDesc() {
		return nil, false, false
	}
	b := c.cur.Span(c.mem, c.addr, uint64(c.left))
	if len(b) == 0 {
		c.fail(ErrAddr)
		return nil, false, false
	}
	c.addr += uint64(len(b))
	c.left -= uint32(len(b))
	return b, c.write, true
}

// Reader reads the device-readable part of a chain (a guest TX buffer).
type Reader struct {
	c   Chain
	seg []byte
}

// NewReader starts reading the chain at head.
func (q *Queue) NewReader(head uint16) Reader { return Reader{c: q.Chain(head)} }

// Err returns the chain's error, if the walk hit one.
func (r *Reader) Err() error { return r.c.err }

// ready reports whether r.seg holds bytes, filling it if needed; the
// common cases (bytes left, chain done) are decided inline.
func (r *Reader) ready() bool { return len(r.seg) > 0 || (!r.c.done() && r.fill()) }

func (r *Reader) fill() bool {
	for len(r.seg) == 0 {
		b, w, ok := r.c.Next()
		if !ok {
			return false
		}
		if w { // the readable part ends where the writable part starts
			r.c.more, r.c.left = false, 0
			return false
		}
		r.seg = b
	}
	return true
}

// Read copies up to len(p) bytes.
func (r *Reader) Read(p []byte) int {
	n := 0
	for n < len(p) && r.ready() {
		k := copy(p[n:], r.seg)
		r.seg = r.seg[k:]
		n += k
	}
	return n
}

// Skip discards up to n bytes and returns how many it skipped.
func (r *Reader) Skip(n int) int {
	done := 0
	for done < n && r.ready() {
		k := min(n-done, len(r.seg))
		r.seg = r.seg[k:]
		done += k
	}
	return done
}

// More reports whether readable bytes remain, walking on to the next
// descriptor if the current one is used up (a walk error ends it: see Err).
func (r *Reader) More() bool { return r.ready() }

// Segment returns the rest of the current piece, consuming it; nil at the
// end of the readable part.
func (r *Reader) Segment() []byte {
	if !r.ready() {
		return nil
	}
	s := r.seg
	r.seg = nil
	return s
}

// Writer writes into the device-writable buffers of a chain (a guest RX
// buffer). Every descriptor of the chain must be writable.
type Writer struct {
	c   Chain
	seg []byte
	q   *Queue // for dirty-page logging (log.go)
	gpa uint64 // the guest address of seg, while logging
}

// NewWriter starts writing the chain at head.
func (q *Queue) NewWriter(head uint16) Writer { return Writer{c: q.Chain(head), q: q} }

// Err returns the chain's error, if the walk hit one.
func (w *Writer) Err() error { return w.c.err }

// ready is Reader.ready for the writable side.
func (w *Writer) ready() bool { return len(w.seg) > 0 || (!w.c.done() && w.fill()) }

func (w *Writer) fill() bool {
	for len(w.seg) == 0 {
		b, wr, ok := w.c.Next()
		if !ok {
			return false
		}
		if !wr {
			return w.c.fail(ErrNotWritable)
		}
		w.seg = b
		w.gpa = w.c.addr - uint64(len(b)) // Next moved addr past b
	}
	return true
}

// Write copies as much of p as fits and returns the count.
func (w *Writer) Write(p []byte) int {
	n := 0
	for n < len(p) && w.ready() {
		k := copy(w.seg, p[n:])
		w.wrote(k)
		n += k
	}
	return n
}

// CopyFrom copies up to max bytes from r and returns the count.
func (w *Writer) CopyFrom(r *Reader, max int) int {
	n := 0
	for n < max && w.ready() && r.ready() {
		k := copy(w.seg[:min(len(w.seg), max-n)], r.seg)
		w.wrote(k)
		r.seg = r.seg[k:]
		n += k
	}
	return n
}

// wrote consumes k bytes of seg that were just written, marking them in
// the dirty log while the queue logs.
func (w *Writer) wrote(k int) {
	if w.q != nil && w.q.lg.on {
		w.q.logGPA(w.gpa, uint64(k))
	}
	w.seg = w.seg[k:]
	w.gpa += uint64(k)
}

// Full reports whether the chain has no writable room left.
func (w *Writer) Full() bool { return !w.ready() }

// Skip moves past up to n writable bytes without writing them.
func (w *Writer) Skip(n int) int {
	done := 0
	for done < n && w.ready() {
		k := min(n-done, len(w.seg))
		w.seg = w.seg[k:]
		w.gpa += uint64(k)
		done += k
	}
	return done
}
