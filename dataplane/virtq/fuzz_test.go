package virtq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// FuzzChainWalk decodes the input into a descriptor table, an optional
// indirect table in guest memory, a head and the negotiated features, then
// walks the chain with Chain.Next, Reader and Writer. Every walk must
// terminate, return only guest memory, and agree with modelWalk, a plain
// restatement of the chain rules.
//
// Input layout (missing bytes read as zero):
//
//	[0] config: bits 0-2 log2 queue size (1..128), bit 3 INDIRECT_DESC,
//	    bits 4-5 where the indirect table lives (fuzzIndirectGPAs)
//	[1] head (may be out of range)
//	then queue-size descriptors of 8 bytes, then up to 128 indirect entries
//	of 8 bytes (see decodeFuzzDesc)
func FuzzChainWalk(f *testing.F) {
	for _, s := range chainSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		fuzzChainWalk(t, in)
	})
}

// fuzzIndirectGPAs: in region A, crossing from A into B, in region C, and
// outside memory.
var fuzzIndirectGPAs = [4]uint64{indirectGPA, stdAEnd - 0x20, stdCGPA, 0x60000}

const fuzzMaxIndirect = 128

var (
	fuzzMemOnce sync.Once
	fuzzMem     *testMem
)

// fuzzTB lets the shared fuzz memory outlive the first input's *testing.T.
type fuzzTB struct{ testing.TB }

func (fuzzTB) Cleanup(func()) {}

func sharedFuzzMem(t *testing.T) *testMem {
	fuzzMemOnce.Do(func() { fuzzMem = newStdMem(fuzzTB{t}) })
	return fuzzMem
}

// fuzzDesc is a decoded descriptor before it is written to memory.
type fuzzDesc struct {
	addr  uint64
	n     uint32
	flags uint16
	next  uint16
}

// decodeFuzzDesc turns 8 input bytes into a descriptor whose address most
// often falls in or near guest memory:
//
//	e[0] flags, e[1] next (e[7]&4 sets the high byte to 0xff)
//	e[2:4] address selector: 0xffff is 2^64-16, ≥ 0xf000 lands around
//	       region C in 2-byte steps, else selector*8 (regions A, B, hole)
//	e[4:6] length; e[7]&1 adds e[6]<<16, e[7]&8 makes it 0xffffffff;
//	e[7]&2 points it at the indirect table with length e[4]*16 (plus
//	e[5]&15 when e[5]&0x80)
func decodeFuzzDesc(e []byte, indirectAt uint64) fuzzDesc {
	d := fuzzDesc{flags: uint16(e[0]), next: uint16(e[1])}
	if e[7]&4 != 0 {
		d.next |= 0xff00
	}
	switch sel := binary.LittleEndian.Uint16(e[2:]); {
	case sel == 0xffff:
		d.addr = 1<<64 - 16
	case sel >= 0xf000:
		d.addr = stdCGPA - 0x800 + uint64(sel-0xf000)*2
	default:
		d.addr = uint64(sel) * 8
	}
	d.n = uint32(binary.LittleEndian.Uint16(e[4:]))
	if e[7]&1 != 0 {
		d.n |= uint32(e[6]) << 16
	}
	if e[7]&8 != 0 {
		d.n = 0xffffffff
	}
	if e[7]&2 != 0 {
		d.addr, d.n = indirectAt, uint32(e[4])*16
		if e[5]&0x80 != 0 {
			d.n += uint32(e[5] & 15)
		}
	}
	return d
}

// encodeFuzzDesc is decodeFuzzDesc's inverse for the seeds; the address must
// be representable.
func encodeFuzzDesc(d fuzzDesc, indirectRef bool) []byte {
	e := make([]byte, 8)
	e[0], e[1] = byte(d.flags), byte(d.next)
	if d.next > 0xff {
		e[7] |= 4
	}
	if indirectRef {
		e[7] |= 2
		e[4] = byte(d.n / 16)
		if d.n%16 != 0 {
			e[5] = 0x80 | byte(d.n%16)
		}
		return e
	}
	var sel uint16
	switch {
	case d.addr == 1<<64-16:
		sel = 0xffff
	case d.addr >= stdCGPA-0x800 && d.addr < stdCGPA+0x1ffe:
		sel = 0xf000 + uint16((d.addr-(stdCGPA-0x800))/2)
	default:
		sel = uint16(d.addr / 8)
	}
	binary.LittleEndian.PutUint16(e[2:], sel)
	switch {
	case d.n == 0xffffffff:
		e[7] |= 8
	default:
		binary.LittleEndian.PutUint16(e[4:], uint16(d.n))
		if d.n > 0xffff {
			e[7] |= 1
			e[6] = byte(d.n >> 16)
		}
	}
	return e
}

func fuzzByte(in []byte, i int) byte {
	if i < len(in) {
		return in[i]
	}
	return 0
}

func fuzzChunk(in []byte, off int) []byte {
	var e [8]byte
	if off < len(in) {
		copy(e[:], in[off:])
	}
	return e[:]
}

// writeGPA writes b at gpa through as many regions as it crosses and
// returns false when part of it is not in memory.
func (m *testMem) writeGPA(gpa uint64, b []byte) bool {
	for len(b) > 0 {
		s := m.tbl.Span(gpa, uint64(len(b)))
		if len(s) == 0 {
			return false
		}
		copy(s, b)
		gpa += uint64(len(s))
		b = b[len(s):]
	}
	return true
}

func fuzzChainWalk(t *testing.T, in []byte) {
	m := sharedFuzzMem(t)
	cfg := fuzzByte(in, 0)
	size := 1 << (cfg & 7)
	feat := Features{IndirectDesc: cfg&8 != 0, EventIdx: cfg&0x40 != 0}
	indirectAt := fuzzIndirectGPAs[cfg>>4&3]
	head := uint16(fuzzByte(in, 1))

	d := newDriver(t, m, size, stdDescGPA, stdAvailGPA, stdUsedGPA)
	maxLen := uint32(0)
	for i := range size {
		fd := decodeFuzzDesc(fuzzChunk(in, 2+8*i), indirectAt)
		d.setDesc(i, fd.addr, fd.n, fd.flags, fd.next)
		maxLen = max(maxLen, fd.n)
	}
	var itbl [fuzzMaxIndirect * virtio.DescSize]byte
	for i := range fuzzMaxIndirect {
		fd := decodeFuzzDesc(fuzzChunk(in, 2+8*size+8*i), indirectAt)
		putDesc(itbl[i*virtio.DescSize:], fd.addr, fd.n, fd.flags, fd.next)
		maxLen = max(maxLen, fd.n)
	}
	m.writeGPA(indirectAt, itbl[:])
	d.setUsedIdx(0)
	d.availIdx = 0
	d.add(head)
	q := d.queue(t, 0, feat)
	if n, err := q.Pending(); n != 1 || err != nil {
		t.Fatalf("Pending = %d, %v", n, err)
	}
	h, err := q.Pop()
	if int(head) >= size {
		if !errors.Is(err, ErrHeadOutOfRange) {
			t.Fatalf("head %d of %d: Pop err %v", head, size, err)
		}
		return
	}
	if h != head || err != nil {
		t.Fatalf("Pop = %d, %v; want %d", h, err, head)
	}

	want, wantErr := modelWalk(m, d.desc, size, head, feat.IndirectDesc)
	hopLimit := 2 * size // the ring's table, then at most size indirect entries
	total := 0
	for _, p := range want {
		total += p.n
	}
	if len(want) > 2*hopLimit || uint64(total) > uint64(hopLimit)*uint64(maxLen) {
		t.Fatalf("model returned %d pieces, %d bytes: beyond %d hops of at most %d bytes", len(want), total, hopLimit, maxLen)
	}

	// The direct path takes the chain as the walker would, or declines.
	checkDirect(t, m, d, feat, want, wantErr)

	// Chain.Next: exactly the model's pieces and error.
	got, err := walkChain(t, m, q.Chain(head))
	if !slices.Equal(got, want) || !sameErr(err, wantErr) {
		t.Fatalf("Chain walk:\n got %v, %v\nwant %v, %v", got, err, want, wantErr)
	}

	// Reader: the readable prefix; the chain error only if it came first.
	var wantR []piece
	wantRErr := wantErr
	for _, p := range want {
		if p.write {
			wantRErr = nil
			break
		}
		wantR = append(wantR, p)
	}
	r := q.NewReader(head)
	var gotR []piece
	for i := 0; ; i++ {
		s := r.Segment()
		if s == nil {
			break
		}
		gpa, ok := m.gpaOf(s)
		if !ok || i > len(want) {
			t.Fatalf("Segment %d outside guest memory or past the model", i)
		}
		gotR = append(gotR, piece{gpa, len(s), false})
	}
	if !slices.Equal(gotR, wantR) || !sameErr(r.Err(), wantRErr) {
		t.Fatalf("Reader:\n got %v, %v\nwant %v, %v", gotR, r.Err(), wantR, wantRErr)
	}
	var wantBytes []byte
	for _, p := range wantR {
		if len(wantBytes) >= 4096 {
			break
		}
		b, _ := m.tbl.Slice(p.gpa, uint64(p.n))
		wantBytes = append(wantBytes, b...)
	}
	wantBytes = wantBytes[:min(len(wantBytes), 4096)]
	r = q.NewReader(head)
	var buf [4096]byte
	n := r.Read(buf[:])
	if !bytes.Equal(buf[:n], wantBytes) {
		t.Fatalf("Reader.Read = %d bytes, want %d", n, len(wantBytes))
	}
	readable := 0
	for _, p := range wantR {
		readable += p.n
	}
	if skipped := r.Skip(1 << 40); n+skipped != readable || !sameErr(r.Err(), wantRErr) {
		t.Fatalf("Reader: read %d + skipped %d, want %d; err %v", n, skipped, readable, r.Err())
	}

	// Writer (without writing): all of it if every piece is writable.
	wantW, wantWErr := 0, wantErr
	for _, p := range want {
		if !p.write {
			wantWErr = ErrNotWritable
			break
		}
		wantW += p.n
	}
	w := q.NewWriter(head)
	if got := w.Skip(1 << 40); got != wantW || !sameErr(w.Err(), wantWErr) || !w.Full() {
		t.Fatalf("Writer.Skip = %d, %v; want %d, %v", got, w.Err(), wantW, wantWErr)
	}

	// Writer writing: the guest's buffers may overlap its own descriptors,
	// so this pass only has to terminate within the bound and write what it
	// says it wrote.
	w = q.NewWriter(head)
	var pat [512]byte
	for i := range pat {
		pat[i] = byte(i)
	}
	written := 0
	for i := 0; i < 16 && !w.Full(); i++ {
		written += w.Write(pat[:])
	}
	written += w.Skip(1 << 40)
	if uint64(written) > uint64(hopLimit)*uint64(maxLen) {
		t.Fatalf("Writer wrote %d bytes, beyond %d hops of %d", written, hopLimit, maxLen)
	}
}

func sameErr(got, want error) bool {
	if want == nil {
		return got == nil
	}
	return errors.Is(got, want)
}

// modelWalk restates the chain rules (virtio spec §2.7.5, §2.7.5.3.1) on
// the bytes in memory: TTL of the table size, next in range, one level of
// indirection with a table of 1..size whole entries in one region, no
// INDIRECT with NEXT, readable before writable, empty descriptors skipped,
// buffers split where guest memory regions end.
func modelWalk(m *testMem, table []byte, size int, head uint16, allowIndirect bool) ([]piece, error) {
	var ps []piece
	tbl, n, next, ttl := table, size, int(head), size
	indirect, seenWrite := false, false
	for {
		if ttl == 0 {
			return ps, ErrChainLoop
		}
		ttl--
		e := tbl[next*16:]
		addr, ln := binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint32(e[8:])
		flags, nxt := binary.LittleEndian.Uint16(e[12:]), int(binary.LittleEndian.Uint16(e[14:]))
		if flags&fIndirect != 0 {
			switch {
			case indirect:
				return ps, ErrNestedIndirect
			case !allowIndirect:
				return ps, ErrNoIndirect
			case flags&fNext != 0:
				return ps, ErrIndirectNext
			case ln == 0 || ln%16 != 0 || int(ln/16) > size:
				return ps, ErrIndirectSize
			}
			b, ok := modelOneRegion(m, addr, uint64(ln))
			if !ok {
				return ps, ErrAddr
			}
			tbl, n, next, ttl, indirect = b, int(ln/16), 0, int(ln/16), true
			continue
		}
		last := flags&fNext == 0
		if !last {
			if nxt >= n {
				return ps, ErrNextOutOfRange
			}
			next = nxt
		}
		w := flags&fWrite != 0
		if w {
			seenWrite = true
		} else if seenWrite {
			return ps, ErrWriteOrder
		}
		if ln > 0 {
			if addr+uint64(ln) < addr {
				return ps, ErrAddr
			}
			more, ok := modelPieces(m, addr, uint64(ln), w)
			ps = append(ps, more...)
			if !ok {
				return ps, ErrAddr
			}
		}
		if last {
			return ps, nil
		}
	}
}

func modelRegion(m *testMem, gpa uint64) (start, end uint64, data []byte, ok bool) {
	for _, r := range m.regs {
		if gpa >= r.GPA && gpa < r.GPA+r.Size {
			return r.GPA, r.GPA + r.Size, r.Bytes(), true
		}
	}
	return 0, 0, nil, false
}

func modelOneRegion(m *testMem, gpa, n uint64) ([]byte, bool) {
	start, end, data, ok := modelRegion(m, gpa)
	if !ok || gpa+n < gpa || gpa+n > end {
		return nil, false
	}
	return data[gpa-start : gpa-start+n], true
}

func modelPieces(m *testMem, gpa, n uint64, w bool) ([]piece, bool) {
	var ps []piece
	for n > 0 {
		_, end, _, ok := modelRegion(m, gpa)
		if !ok {
			return ps, false
		}
		k := min(n, end-gpa)
		ps = append(ps, piece{gpa, int(k), w})
		gpa += k
		n -= k
	}
	return ps, true
}

// chainSeed builds a fuzz input from readable descriptions.
type seedDesc struct {
	fuzzDesc
	indirectRef bool // point at the indirect table, length n (bytes)
}

func chainSeed(cfg, head byte, main []seedDesc, ind []seedDesc) []byte {
	size := 1 << (cfg & 7)
	b := []byte{cfg, head}
	for i := range size {
		if i < len(main) {
			b = append(b, encodeFuzzDesc(main[i].fuzzDesc, main[i].indirectRef)...)
		} else {
			b = append(b, make([]byte, 8)...)
		}
	}
	for _, d := range ind {
		b = append(b, encodeFuzzDesc(d.fuzzDesc, d.indirectRef)...)
	}
	return b
}

func sd(addr uint64, n uint32, flags, next uint16) seedDesc {
	return seedDesc{fuzzDesc: fuzzDesc{addr, n, flags, next}}
}

func sdIndirect(n uint32, flags uint16) seedDesc {
	return seedDesc{fuzzDesc: fuzzDesc{n: n, flags: flags}, indirectRef: true}
}

// cfg bits: log2 size | 8 (indirect) | where<<4.
func chainSeeds() [][]byte {
	const D = stdDataGPA
	const size16, indir = 4, 8
	return [][]byte{
		// direct TX: header and frame in one descriptor; header, then frame
		chainSeed(size16, 1, []seedDesc{{}, sd(D, 12+60, 0, 0)}, nil),
		chainSeed(size16, 0, []seedDesc{sd(D, 12, fNext, 3), {}, {}, sd(D+0x100, 1500, 0, 0)}, nil),
		chainSeed(size16, 0, []seedDesc{sd(D, 10, fNext, 1), sd(stdAEnd-60, 60, 0, 0)}, nil),
		// direct RX: one writable descriptor, ending at region A's end
		chainSeed(size16, 0, []seedDesc{sd(stdAEnd-2048, 2048, fWrite, 0)}, nil),
		// TX: 12-byte header split 5+7, then a frame
		chainSeed(size16, 0, []seedDesc{sd(D, 5, fNext, 1), sd(D+0x100, 7, fNext, 2), sd(D+0x200, 1500, 0, 0)}, nil),
		// header split 3+4+5
		chainSeed(size16, 2, []seedDesc{sd(D+0x100, 4, fNext, 3), {}, sd(D, 3, fNext, 0), sd(D+0x200, 5, fNext, 4), sd(D+0x300, 60, 0, 0)}, nil),
		// RX: writable only, crossing from region A into B
		chainSeed(size16, 0, []seedDesc{sd(stdAEnd-6, 12, fWrite|fNext, 1), sd(D, 1514, fWrite, 0)}, nil),
		// readable then writable
		chainSeed(size16, 0, []seedDesc{sd(D, 12, fNext, 1), sd(D+0x100, 64, fWrite, 0)}, nil),
		// loop
		chainSeed(size16, 0, []seedDesc{sd(D, 1, fNext, 1), sd(D, 1, fNext, 0)}, nil),
		// zero-length self loop
		chainSeed(size16, 0, []seedDesc{sd(D, 0, fNext, 0)}, nil),
		// next out of range
		chainSeed(size16, 0, []seedDesc{sd(D, 8, fNext, 16)}, nil),
		chainSeed(size16, 0, []seedDesc{sd(D, 8, fNext, 0xff42)}, nil),
		// head out of range
		chainSeed(size16, 16, nil, nil),
		// zero-length then out-of-memory addresses
		chainSeed(size16, 0, []seedDesc{sd(0, 0, fNext, 1), sd(0x60000, 8, fNext, 2), sd(D, 8, 0, 0)}, nil),
		chainSeed(size16, 0, []seedDesc{sd(stdCGPA-8, 16, 0, 0)}, nil),
		chainSeed(size16, 0, []seedDesc{sd(stdCGPA+0xff8, 16, 0, 0)}, nil),
		chainSeed(size16, 0, []seedDesc{sd(1<<64-16, 16, 0, 0)}, nil),
		chainSeed(size16, 0, []seedDesc{sd(D, 0xffffffff, 0, 0)}, nil),
		// readable after writable
		chainSeed(size16, 0, []seedDesc{sd(D, 8, fWrite|fNext, 1), sd(D, 8, 0, 0)}, nil),
		// indirect without the feature
		chainSeed(size16, 0, []seedDesc{sdIndirect(32, fIndirect)}, []seedDesc{sd(D, 8, fNext, 1), sd(D+8, 8, 0, 0)}),
		// indirect
		chainSeed(size16|indir, 0, []seedDesc{sd(D, 12, fNext, 1), sdIndirect(32, fIndirect)}, []seedDesc{sd(D+0x100, 8, fNext|fWrite, 1), sd(D+0x200, 8, fWrite, 0)}),
		// indirect with NEXT
		chainSeed(size16|indir, 0, []seedDesc{sdIndirect(16, fIndirect|fNext)}, []seedDesc{sd(D, 8, 0, 0)}),
		// nested indirect
		chainSeed(size16|indir, 0, []seedDesc{sdIndirect(32, fIndirect)}, []seedDesc{sd(D, 8, fNext, 1), sdIndirect(32, fIndirect)}),
		// oversized indirect table (17 entries for a 16-entry queue), odd length
		chainSeed(size16|indir, 0, []seedDesc{sdIndirect(17*16, fIndirect)}, []seedDesc{sd(D, 8, 0, 0)}),
		chainSeed(size16|indir, 0, []seedDesc{sdIndirect(33, fIndirect)}, []seedDesc{sd(D, 8, 0, 0)}),
		// indirect loop
		chainSeed(size16|indir, 0, []seedDesc{sdIndirect(32, fIndirect)}, []seedDesc{sd(D, 8, fNext, 1), sd(D, 8, fNext, 0)}),
		// indirect table crossing regions, in region C, outside memory
		chainSeed(size16|indir|1<<4, 0, []seedDesc{sdIndirect(64, fIndirect)}, []seedDesc{sd(D, 8, 0, 0)}),
		chainSeed(size16|indir|2<<4, 0, []seedDesc{sdIndirect(64, fIndirect)}, []seedDesc{sd(D, 8, 0, 0)}),
		chainSeed(size16|indir|3<<4, 0, []seedDesc{sdIndirect(64, fIndirect)}, []seedDesc{sd(D, 8, 0, 0)}),
		// maximal chain in a queue of 128
		maximalChainSeed(7),
	}
}

func maximalChainSeed(log2 byte) []byte {
	size := 1 << log2
	var main []seedDesc
	for i := range size {
		main = append(main, sd(stdDataGPA+uint64(i)*8, 8, fNext, uint16(i+1)))
	}
	main[size-1].flags = 0
	return chainSeed(log2, 0, main, nil)
}

// The seeds decode to what they describe.
func TestChainSeedsRoundTrip(t *testing.T) {
	for _, d := range []fuzzDesc{
		{stdDataGPA, 5, fNext, 1},
		{stdAEnd - 8, 0x12345, fWrite, 0xff05},
		{stdCGPA + 0xff8, 16, 0, 0},
		{stdCGPA - 8, 0xffffffff, 0, 0},
		{1<<64 - 16, 16, fIndirect, 0},
	} {
		if got := decodeFuzzDesc(encodeFuzzDesc(d, false), 0); got != d {
			t.Errorf("round trip %+v -> %+v", d, got)
		}
	}
	if got := decodeFuzzDesc(encodeFuzzDesc(fuzzDesc{n: 33, flags: fIndirect}, true), indirectGPA); got != (fuzzDesc{indirectGPA, 33, fIndirect, 0}) {
		t.Errorf("indirect reference decodes to %+v", got)
	}
}
