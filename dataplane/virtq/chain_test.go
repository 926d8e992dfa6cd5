package virtq

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

const (
	fNext     = virtio.DescFNext
	fWrite    = virtio.DescFWrite
	fIndirect = virtio.DescFIndirect
)

// chainCase lays out descriptors (and perhaps an indirect table) and says
// what the walk must return.
type chainCase struct {
	name     string
	size     int // queue size, 16 by default
	indirect bool
	setup    func(d *driver, m *testMem)
	head     uint16
	want     []piece
	err      error
}

// indirectGPA is where the chain tests put indirect tables.
const indirectGPA = 0x18000

func putIndirect(tb testing.TB, m *testMem, gpa uint64, descs ...[4]uint64) {
	tb.Helper()
	b := m.bytes(tb, gpa, uint64(len(descs)*virtio.DescSize))
	for i, d := range descs {
		putDesc(b[i*virtio.DescSize:], d[0], uint32(d[1]), uint16(d[2]), uint16(d[3]))
	}
}

func chainCases(t *testing.T) []chainCase {
	const D = stdDataGPA
	return []chainCase{
		{
			name:  "single",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, D, 100, 0, 0) },
			want:  []piece{{D, 100, false}},
		},
		{
			name: "read then write",
			setup: func(d *driver, _ *testMem) {
				d.setDesc(3, D, 10, fNext, 7)
				d.setDesc(7, D+0x100, 20, fNext|fWrite, 1)
				d.setDesc(1, D+0x200, 30, fWrite, 0)
			},
			head: 3,
			want: []piece{{D, 10, false}, {D + 0x100, 20, true}, {D + 0x200, 30, true}},
		},
		{
			name: "loop",
			setup: func(d *driver, _ *testMem) {
				d.setDesc(0, D, 1, fNext, 1)
				d.setDesc(1, D+1, 1, fNext, 0)
			},
			// 16 hops fit the TTL, the 17th does not
			want: repeatPieces([]piece{{D, 1, false}, {D + 1, 1, false}}, 8),
			err:  ErrChainLoop,
		},
		{
			name:  "zero-length self loop",
			setup: func(d *driver, _ *testMem) { d.setDesc(5, D, 0, fNext, 5) },
			head:  5,
			err:   ErrChainLoop,
		},
		{
			name: "maximal chain",
			setup: func(d *driver, _ *testMem) {
				for i := range 16 {
					d.setDesc(i, D+uint64(i)*16, 16, fNext, uint16(i+1))
				}
				d.setDesc(15, D+15*16, 16, 0, 0)
			},
			want: seqPieces(D, 16, 16, false),
		},
		{
			name: "maximal chain plus one hop",
			setup: func(d *driver, _ *testMem) {
				for i := range 16 {
					d.setDesc(i, D+uint64(i)*16, 16, fNext, uint16(i+1)%16)
				}
			},
			want: seqPieces(D, 16, 16, false),
			err:  ErrChainLoop,
		},
		{
			name: "maximal chain of size 1",
			size: 1,
			setup: func(d *driver, _ *testMem) {
				d.setDesc(0, D, 4, 0, 0)
			},
			want: []piece{{D, 4, false}},
		},
		{
			name:  "size 1 self loop",
			size:  1,
			setup: func(d *driver, _ *testMem) { d.setDesc(0, D, 4, fNext, 0) },
			want:  []piece{{D, 4, false}},
			err:   ErrChainLoop,
		},
		{
			name:  "next out of range",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, D, 8, fNext, 16) },
			err:   ErrNextOutOfRange,
		},
		{
			name:  "next 0xffff",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, D, 8, fNext, 0xffff) },
			err:   ErrNextOutOfRange,
		},
		{
			name:  "next ignored without NEXT",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, D, 8, fWrite, 0xffff) },
			want:  []piece{{D, 8, true}},
		},
		{
			name: "zero-length descriptors skipped",
			setup: func(d *driver, _ *testMem) {
				d.setDesc(0, 0xdead_0000_0000, 0, fNext, 1) // never translated
				d.setDesc(1, D, 4, fNext, 2)
				d.setDesc(2, 0, 0, fNext|fWrite, 3)
				d.setDesc(3, D+8, 4, fWrite, 0)
			},
			want: []piece{{D, 4, false}, {D + 8, 4, true}},
		},
		{
			name:  "address outside memory",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, 0x80000, 4, 0, 0) },
			err:   ErrAddr,
		},
		{
			name:  "address in the hole before region C",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, stdCGPA-4, 8, 0, 0) },
			err:   ErrAddr,
		},
		{
			name:  "buffer running off the end of memory",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, stdCEnd-4, 8, 0, 0) },
			want:  []piece{{stdCEnd - 4, 4, false}},
			err:   ErrAddr,
		},
		{
			name:  "last byte of memory",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, stdCEnd-1, 1, 0, 0) },
			want:  []piece{{stdCEnd - 1, 1, false}},
		},
		{
			name:  "address plus length overflows",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, 1<<64-8, 16, 0, 0) },
			err:   ErrAddr,
		},
		{
			name:  "address plus length is exactly 2^64",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, 1<<64-16, 16, 0, 0) },
			err:   ErrAddr,
		},
		{
			name:  "huge length",
			setup: func(d *driver, _ *testMem) { d.setDesc(0, D, 0xffffffff, 0, 0) },
			want:  []piece{{D, stdAEnd - D, false}, {stdAEnd, stdBEnd - stdAEnd, false}}, // to the end of region B
			err:   ErrAddr,
		},
		{
			name: "buffer crossing two GPA-adjacent regions",
			setup: func(d *driver, _ *testMem) {
				d.setDesc(0, stdAEnd-5, 12, 0, 0)
			},
			want: []piece{{stdAEnd - 5, 5, false}, {stdAEnd, 7, false}},
		},
		{
			name: "readable after writable",
			setup: func(d *driver, _ *testMem) {
				d.setDesc(0, D, 4, fNext|fWrite, 1)
				d.setDesc(1, D+4, 4, 0, 0)
			},
			want: []piece{{D, 4, true}},
			err:  ErrWriteOrder,
		},
		{
			name: "zero-length readable after writable",
			setup: func(d *driver, _ *testMem) {
				d.setDesc(0, D, 4, fNext|fWrite, 1)
				d.setDesc(1, D+4, 0, 0, 0)
			},
			want: []piece{{D, 4, true}},
			err:  ErrWriteOrder,
		},
		{
			name: "readable after an empty writable",
			setup: func(d *driver, _ *testMem) {
				d.setDesc(0, D, 4, fNext, 1)
				d.setDesc(1, D+4, 0, fNext|fWrite, 2)
				d.setDesc(2, D+8, 4, 0, 0)
			},
			want: []piece{{D, 4, false}},
			err:  ErrWriteOrder,
		},
		{
			name: "maximal chain of empty descriptors",
			setup: func(d *driver, _ *testMem) {
				for i := range 15 {
					d.setDesc(i, 0, 0, fNext, uint16(i+1))
				}
				d.setDesc(15, D, 3, fWrite, 0)
			},
			want: []piece{{D, 3, true}},
		},
		{
			name:  "indirect not negotiated",
			setup: func(d *driver, m *testMem) { d.setDesc(0, indirectGPA, 16, fIndirect, 0) },
			err:   ErrNoIndirect,
		},
		{
			name:     "indirect",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA,
					[4]uint64{D, 12, fNext, 2},
					[4]uint64{D + 0x300, 99, fWrite, 0}, // unused entry
					[4]uint64{D + 0x100, 50, fNext, 3},
					[4]uint64{D + 0x200, 60, fWrite, 7}) // next ignored: no NEXT
				d.setDesc(9, indirectGPA, 4*16, fIndirect|fWrite, 0) // WRITE on the indirect descriptor is ignored
			},
			head: 9,
			want: []piece{{D, 12, false}, {D + 0x100, 50, false}, {D + 0x200, 60, true}},
		},
		{
			name:     "direct then indirect",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA, [4]uint64{D + 0x100, 8, fWrite, 0})
				d.setDesc(0, D, 12, fNext, 1)
				d.setDesc(1, indirectGPA, 16, fIndirect, 0)
			},
			want: []piece{{D, 12, false}, {D + 0x100, 8, true}},
		},
		{
			name:     "indirect with NEXT",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA, [4]uint64{D, 8, 0, 0})
				d.setDesc(0, indirectGPA, 16, fIndirect|fNext, 1)
				d.setDesc(1, D, 8, 0, 0)
			},
			err: ErrIndirectNext,
		},
		indirectSizeCase(t, 0, ErrIndirectSize),
		indirectSizeCase(t, 15, ErrIndirectSize),
		indirectSizeCase(t, 17, ErrIndirectSize),
		indirectSizeCase(t, 16*16+8, ErrIndirectSize),
		indirectSizeCase(t, 17*16, ErrIndirectSize), // more entries than the queue size
		indirectSizeCase(t, 0xfffffff0, ErrIndirectSize),
		indirectSizeCase(t, 16*16, nil),
		{
			name:     "nested indirect",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA,
					[4]uint64{D, 8, fNext, 1},
					[4]uint64{indirectGPA, 32, fIndirect, 0})
				d.setDesc(0, indirectGPA, 32, fIndirect, 0)
			},
			want: []piece{{D, 8, false}},
			err:  ErrNestedIndirect,
		},
		{
			name:     "indirect table outside memory",
			indirect: true,
			setup:    func(d *driver, m *testMem) { d.setDesc(0, 0x80000, 32, fIndirect, 0) },
			err:      ErrAddr,
		},
		{
			name:     "indirect table crossing regions",
			indirect: true,
			setup:    func(d *driver, m *testMem) { d.setDesc(0, stdAEnd-16, 32, fIndirect, 0) },
			err:      ErrAddr,
		},
		{
			name:     "indirect table address overflows",
			indirect: true,
			setup:    func(d *driver, m *testMem) { d.setDesc(0, 1<<64-16, 32, fIndirect, 0) },
			err:      ErrAddr,
		},
		{
			name:     "indirect next out of its table",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA,
					[4]uint64{D, 8, fNext, 1},
					[4]uint64{D + 8, 8, fNext, 2}, // the table has 2 entries
					[4]uint64{D + 16, 8, 0, 0})
				d.setDesc(0, indirectGPA, 32, fIndirect, 0)
			},
			want: []piece{{D, 8, false}},
			err:  ErrNextOutOfRange,
		},
		{
			name:     "indirect loop",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA,
					[4]uint64{D, 8, fNext, 1},
					[4]uint64{D + 8, 8, fNext, 2},
					[4]uint64{D + 16, 8, fNext, 0})
				d.setDesc(0, indirectGPA, 48, fIndirect, 0)
			},
			want: []piece{{D, 8, false}, {D + 8, 8, false}, {D + 16, 8, false}},
			err:  ErrChainLoop,
		},
		{
			name:     "indirect readable after writable",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA,
					[4]uint64{D, 8, fNext | fWrite, 1},
					[4]uint64{D + 8, 8, 0, 0})
				d.setDesc(0, indirectGPA, 32, fIndirect, 0)
			},
			want: []piece{{D, 8, true}},
			err:  ErrWriteOrder,
		},
		{
			name:     "writable direct then readable indirect",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA, [4]uint64{D + 8, 8, 0, 0})
				d.setDesc(0, D, 8, fNext|fWrite, 1)
				d.setDesc(1, indirectGPA, 16, fIndirect, 0)
			},
			want: []piece{{D, 8, true}},
			err:  ErrWriteOrder,
		},
		{
			name:     "indirect entry outside memory",
			indirect: true,
			setup: func(d *driver, m *testMem) {
				putIndirect(t, m, indirectGPA,
					[4]uint64{D, 8, fNext, 1},
					[4]uint64{0x90000, 8, 0, 0})
				d.setDesc(0, indirectGPA, 32, fIndirect, 0)
			},
			want: []piece{{D, 8, false}},
			err:  ErrAddr,
		},
	}
}

func indirectSizeCase(t *testing.T, n uint32, err error) chainCase {
	c := chainCase{
		name:     fmt.Sprintf("indirect length %d", n),
		indirect: true,
		setup: func(d *driver, m *testMem) {
			// a valid table of 16 one-byte readable entries, chained
			b := m.bytes(t, indirectGPA, 16*16)
			for i := range 16 {
				putDesc(b[i*16:], stdDataGPA+uint64(i), 1, fNext, uint16(i+1))
			}
			putDesc(b[15*16:], stdDataGPA+15, 1, 0, 0)
			d.setDesc(0, indirectGPA, n, fIndirect, 0)
		},
		err: err,
	}
	if err == nil {
		c.want = seqPieces(stdDataGPA, 1, 16, false)
	}
	return c
}

func seqPieces(gpa uint64, n, count int, write bool) []piece {
	var ps []piece
	for i := range count {
		ps = append(ps, piece{gpa + uint64(i*n), n, write})
	}
	return ps
}

func repeatPieces(ps []piece, times int) []piece {
	var out []piece
	for range times {
		out = append(out, ps...)
	}
	return out
}

// within fails the test if f does not return in time (a walk that does
// not terminate would otherwise hang the whole package).
func within(t *testing.T, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("did not terminate within %v", d)
	}
}

func TestChainWalk(t *testing.T) {
	for _, c := range chainCases(t) {
		t.Run(c.name, func(t *testing.T) {
			size := c.size
			if size == 0 {
				size = 16
			}
			m, d, q := newRing(t, size, Features{IndirectDesc: c.indirect})
			c.setup(d, m)
			var got []piece
			var err error
			within(t, 10*time.Second, func() { got, err = walkChain(t, m, q.Chain(c.head)) })
			if !errors.Is(err, c.err) || (c.err == nil && err != nil) {
				t.Errorf("err = %v, want %v", err, c.err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("pieces:\n got %v\nwant %v", got, c.want)
			}
		})
	}
}

// The same chains through Reader and Writer: the reader sees the readable
// prefix, the writer fails on a readable descriptor, and both stop on the
// chain's errors.
func TestChainWalkReaderWriter(t *testing.T) {
	for _, c := range chainCases(t) {
		t.Run(c.name, func(t *testing.T) {
			size := c.size
			if size == 0 {
				size = 16
			}
			m, d, q := newRing(t, size, Features{IndirectDesc: c.indirect})
			c.setup(d, m)

			// Fill the buffers with a pattern, then expect the reader to
			// return the readable pieces up to the first writable one, and
			// the chain error only if it came before that.
			for _, p := range c.want {
				b := m.bytes(t, p.gpa, uint64(p.n))
				for i := range b {
					b[i] = byte((p.gpa+uint64(i))*7 + 1)
				}
			}
			var wantRead []byte
			wantRErr := c.err
			for _, p := range c.want {
				if p.write {
					wantRErr = nil
					break
				}
				wantRead = append(wantRead, m.bytes(t, p.gpa, uint64(p.n))...)
			}
			r := q.NewReader(c.head)
			buf := make([]byte, len(wantRead)+100)
			n := r.Read(buf)
			if !bytes.Equal(buf[:n], wantRead) {
				t.Errorf("Read = %d bytes, want %d", n, len(wantRead))
			}
			if r.Read(buf) != 0 || r.Skip(10) != 0 || r.Segment() != nil {
				t.Errorf("reader returned data after its end")
			}
			if err := r.Err(); !errors.Is(err, wantRErr) || (wantRErr == nil && err != nil) {
				t.Errorf("reader err = %v, want %v", err, wantRErr)
			}

			// Writer: fine only if every piece is writable.
			wantW, wantWErr := 0, c.err
			for _, p := range c.want {
				if !p.write {
					wantWErr = ErrNotWritable
					break
				}
				wantW += p.n
			}
			w := q.NewWriter(c.head)
			if got := w.Skip(1 << 30); got != wantW {
				t.Errorf("writer Skip = %d, want %d", got, wantW)
			}
			if !w.Full() {
				t.Errorf("writer not Full at the end")
			}
			if err := w.Err(); !errors.Is(err, wantWErr) || (wantWErr == nil && err != nil) {
				t.Errorf("writer err = %v, want %v", err, wantWErr)
			}
		})
	}
}

func TestWriterOnReadable(t *testing.T) {
	_, d, q := newRing(t, 8, Features{})
	d.setDesc(0, stdDataGPA, 64, 0, 0)
	w := q.NewWriter(0)
	if n := w.Write([]byte("hello")); n != 0 {
		t.Errorf("Write into a readable buffer wrote %d bytes", n)
	}
	if !errors.Is(w.Err(), ErrNotWritable) {
		t.Errorf("err = %v, want ErrNotWritable", w.Err())
	}
	if !w.Full() {
		t.Errorf("Full = false after ErrNotWritable")
	}
}

// netHdr is a recognisable 12-byte virtio-net header.
var netHdr = []byte{1, 0, 0x36, 0, 0, 0, 0x22, 0, 0x10, 0, 1, 0}

func TestReaderSplitHeader(t *testing.T) {
	frame := make([]byte, 1500)
	for i := range frame {
		frame[i] = byte(i)
	}
	for _, split := range [][]int{{12}, {5, 7}, {3, 4, 5}, {1, 1, 10}, {11, 1}} {
		t.Run(fmt.Sprint(split), func(t *testing.T) {
			m, d, q := newRing(t, 8, Features{})
			data := append(append([]byte(nil), netHdr...), frame...)
			// header pieces in scattered places, then the frame in region B
			gpa, off := uint64(stdDataGPA), 0
			for i, n := range split {
				copy(m.bytes(t, gpa, uint64(n)), data[off:off+n])
				d.setDesc(i, gpa, uint32(n), fNext, uint16(i+1))
				gpa += 0x1000
				off += n
			}
			copy(m.bytes(t, stdAEnd, uint64(len(frame))), frame)
			d.setDesc(len(split), stdAEnd, uint32(len(frame)), 0, 0)
			d.add(0)

			n, err := q.Pending()
			if n != 1 || err != nil {
				t.Fatalf("Pending = %d, %v", n, err)
			}
			head, err := q.Pop()
			if err != nil {
				t.Fatal(err)
			}
			r := q.NewReader(head)
			var hdr [virtio.NetHdrSize]byte
			if got := r.Read(hdr[:]); got != len(hdr) || !bytes.Equal(hdr[:], netHdr) {
				t.Fatalf("header = %d bytes %x", got, hdr[:got])
			}
			var h virtio.NetHdr
			h.Decode(hdr[:])
			if h.HdrLen != 0x36 || h.CsumStart != 0x22 || h.NumBuffers != 1 {
				t.Errorf("decoded header %+v", h)
			}
			// Segment returns the rest of the current piece, aliasing guest memory.
			seg := r.Segment()
			if len(seg) != len(frame) || !bytes.Equal(seg, frame) {
				t.Fatalf("Segment = %d bytes", len(seg))
			}
			if g, ok := m.gpaOf(seg); !ok || g != stdAEnd {
				t.Errorf("Segment at gpa %#x (%v), want %#x", g, ok, stdAEnd)
			}
			if r.Segment() != nil || r.Read(hdr[:]) != 0 || r.Err() != nil {
				t.Errorf("reader not at a clean end: err %v", r.Err())
			}

			// Read, Skip and Read again over the same chain.
			r = q.NewReader(head)
			if got := r.Skip(10); got != 10 {
				t.Fatalf("Skip = %d", got)
			}
			var two [2]byte
			if r.Read(two[:]) != 2 || two != [2]byte{1, 0} {
				t.Errorf("num_buffers = %x", two)
			}
			if got := r.Skip(100); got != 100 {
				t.Errorf("Skip = %d", got)
			}
			rest := make([]byte, 2000)
			if got := r.Read(rest); got != len(frame)-100 || !bytes.Equal(rest[:got], frame[100:]) {
				t.Errorf("Read rest = %d", got)
			}
			if got := r.Skip(1); got != 0 {
				t.Errorf("Skip past the end = %d", got)
			}
		})
	}
}

// A buffer contiguous in guest physical memory across two regions comes
// back as two host pieces, and reads and writes cross the seam.
func TestAcrossRegions(t *testing.T) {
	m, d, q := newRing(t, 8, Features{})
	const start = stdAEnd - 6
	d.setDesc(0, start, 16, 0, 0)
	d.setDesc(1, start, 16, fWrite, 0)
	copy(m.bytes(t, start, 6), "abcdef")
	copy(m.bytes(t, stdAEnd, 10), "ghijklmnop")

	ps, err := walkChain(t, m, q.Chain(0))
	if err != nil || !slices.Equal(ps, []piece{{start, 6, false}, {stdAEnd, 10, false}}) {
		t.Fatalf("pieces %v, err %v", ps, err)
	}
	r := q.NewReader(0)
	var b [20]byte
	if n := r.Read(b[:]); string(b[:n]) != "abcdefghijklmnop" {
		t.Errorf("Read = %q", b[:n])
	}
	r = q.NewReader(0)
	if s := r.Segment(); string(s) != "abcdef" {
		t.Errorf("first Segment = %q", s)
	}
	if s := r.Segment(); string(s) != "ghijklmnop" {
		t.Errorf("second Segment = %q", s)
	}

	w := q.NewWriter(1)
	if n := w.Write([]byte("ABCDEFGHIJKLMNOPQRS")); n != 16 {
		t.Errorf("Write = %d, want 16", n)
	}
	if !w.Full() || w.Err() != nil {
		t.Errorf("Full %v err %v", w.Full(), w.Err())
	}
	if got := string(m.bytes(t, start, 6)) + string(m.bytes(t, stdAEnd, 10)); got != "ABCDEFGHIJKLMNOP" {
		t.Errorf("memory = %q", got)
	}
}

func TestWriterCopyFrom(t *testing.T) {
	m, d, q := newRing(t, 16, Features{})
	payload := make([]byte, 300)
	for i := range payload {
		payload[i] = byte(i * 3)
	}
	// TX chain: header (split 7+5) then payload in 3 pieces.
	tx := append(append([]byte(nil), netHdr...), payload...)
	txParts := []int{7, 5, 100, 1, 199}
	gpa, off := uint64(stdDataGPA), 0
	for i, n := range txParts {
		copy(m.bytes(t, gpa, uint64(n)), tx[off:off+n])
		flags := uint16(fNext)
		if i == len(txParts)-1 {
			flags = 0
		}
		d.setDesc(i, gpa, uint32(n), flags, uint16(i+1))
		gpa += 0x400
		off += n
	}
	// RX chain: writable 5 + 7 (header split) + 64 + 1000.
	rxParts := []int{5, 7, 64, 1000}
	rxGPA := []uint64{}
	gpa = stdDataGPA + 0x8000
	for i, n := range rxParts {
		flags := uint16(fNext | fWrite)
		if i == len(rxParts)-1 {
			flags = fWrite
		}
		d.setDesc(8+i, gpa, uint32(n), flags, uint16(8+i+1))
		rxGPA = append(rxGPA, gpa)
		gpa += 0x800
	}
	readRX := func(total int) []byte {
		var out []byte
		for i, n := range rxParts {
			out = append(out, m.bytes(t, rxGPA[i], uint64(n))...)
		}
		return out[:total]
	}

	r := q.NewReader(0)
	if got := r.Skip(virtio.NetHdrSize); got != virtio.NetHdrSize {
		t.Fatalf("Skip = %d", got)
	}
	w := q.NewWriter(8)
	hdr := virtio.NetHdr{NumBuffers: 1, Flags: virtio.NetHdrFDataValid}
	var hb [virtio.NetHdrSize]byte
	hdr.Encode(hb[:])
	if n := w.Write(hb[:]); n != len(hb) {
		t.Fatalf("header Write = %d", n)
	}
	if n := w.CopyFrom(&r, 150); n != 150 {
		t.Fatalf("CopyFrom(150) = %d", n)
	}
	if n := w.CopyFrom(&r, 0); n != 0 {
		t.Fatalf("CopyFrom(0) = %d", n)
	}
	if n := w.CopyFrom(&r, 1<<20); n != 150 {
		t.Fatalf("CopyFrom(rest) = %d, want 150", n)
	}
	if r.Err() != nil || w.Err() != nil || w.Full() {
		t.Fatalf("reader err %v writer err %v full %v", r.Err(), w.Err(), w.Full())
	}
	got := readRX(12 + 300)
	if !bytes.Equal(got[:12], hb[:]) || !bytes.Equal(got[12:], payload) {
		t.Errorf("RX buffer:\n got %x\nwant %x%x", got, hb, payload)
	}

	// The writer stops when its chain is full.
	r = q.NewReader(0)
	d.setDesc(11, rxGPA[3], 10, fWrite, 0) // shrink the RX chain to 5+7+64+10
	w = q.NewWriter(8)
	if n := w.CopyFrom(&r, 1<<20); n != 86 {
		t.Errorf("CopyFrom into an 86-byte chain = %d", n)
	}
	if !w.Full() || w.Err() != nil {
		t.Errorf("Full %v Err %v", w.Full(), w.Err())
	}
	if w.Write([]byte{1}) != 0 || w.Skip(1) != 0 {
		t.Errorf("writer accepted bytes after Full")
	}
	if got := readRX(86); !bytes.Equal(got, tx[:86]) {
		t.Errorf("RX buffer after the second copy differs")
	}

	// Skip then Write lands num_buffers at offset 10 of a split header.
	w = q.NewWriter(8)
	if w.Skip(10) != 10 || w.Write([]byte{7, 0}) != 2 {
		t.Fatalf("Skip+Write failed")
	}
	if got := m.bytes(t, rxGPA[1], 7); got[5] != 7 || got[6] != 0 {
		t.Errorf("num_buffers bytes = %x", got[5:7])
	}
}

// addr+len wrapping past 2^64 is refused before any byte is returned, even
// where the start of the range is mapped (a region just below the top of
// the address space).
func TestChainAddressWrap(t *testing.T) {
	const top = 1<<64 - 0x2000 // region [top, top+0x1000)
	m := newTestMem(t,
		regionSpec{gpa: 0, size: stdAEnd, fileOff: 0},
		regionSpec{gpa: top, size: 0x1000, fileOff: stdAEnd},
	)
	d := newDriver(t, m, 8, stdDescGPA, stdAvailGPA, stdUsedGPA)
	q := d.queue(t, 0, Features{})
	d.setDesc(0, top+0x800, 0x1000, 0, 0)     // runs off the region: a piece, then ErrAddr
	d.setDesc(1, top+0x800, 0xfffff900, 0, 0) // wraps past 2^64
	ps, err := walkChain(t, m, q.Chain(0))
	if !errors.Is(err, ErrAddr) || !slices.Equal(ps, []piece{{top + 0x800, 0x800, false}}) {
		t.Errorf("running off the top region: %v, %v", ps, err)
	}
	ps, err = walkChain(t, m, q.Chain(1))
	if !errors.Is(err, ErrAddr) || len(ps) != 0 {
		t.Errorf("wrapping range: %v, %v; want no pieces and ErrAddr", ps, err)
	}
}
