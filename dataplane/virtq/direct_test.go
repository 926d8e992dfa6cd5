package virtq

import (
	"bytes"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// checkDirect takes the fuzz input's chain (made available once at index
// 0 by the caller) through PopTX and PopRX on fresh queues and holds them
// to the walker's answer (want, wantErr: the model's pieces): a chain the
// direct path serves is one the walker reads without error, to the same
// bytes at the same guest addresses; anything else is declined, taken
// but untouched, for the walker to decide.
func checkDirect(t *testing.T, m *testMem, d *driver, f Features, want []piece, wantErr error) {
	t.Helper()
	readable, writable := 0, 0
	for _, p := range want {
		if p.write {
			writable += p.n
		} else {
			readable += p.n
		}
	}
	for _, hdrLen := range []int{10, 12} {
		q := d.queue(t, 0, f)
		_, frame, taken := popTX(q, hdrLen)
		if taken == Broken || q.LastAvail() != 1 {
			t.Fatalf("PopTX(%d) = %v but took %d chains", hdrLen, taken, q.LastAvail())
		}
		if taken != Direct {
			continue
		}
		if wantErr != nil || writable != 0 || readable != hdrLen+len(frame) {
			t.Fatalf("PopTX(%d) served a chain the walker reads as %d readable + %d writable bytes, err %v; direct frame %d bytes",
				hdrLen, readable, writable, wantErr, len(frame))
		}
		var all []byte
		for _, p := range want {
			b, _ := m.tbl.Slice(p.gpa, uint64(p.n))
			all = append(all, b...)
		}
		if all[0]|all[1] != 0 {
			t.Fatalf("PopTX(%d): served a frame whose header has flags/gso_type %#x %#x (offload metadata: the walker's)", hdrLen, all[0], all[1])
		}
		if !bytes.Equal(all[hdrLen:], frame) {
			t.Fatalf("PopTX(%d): frame differs from the walker's", hdrLen)
		}
		if len(frame) > 0 {
			if gpa, ok := m.gpaOf(frame); !ok || !endsAt(want, gpa+uint64(len(frame))) {
				t.Fatalf("PopTX(%d): frame at gpa %#x (%v) is not where the walker's buffers end", hdrLen, gpa, ok)
			}
		}
	}
	for _, min := range []int{1, 12} {
		q := d.queue(t, 0, f)
		_, buf, taken := q.PopRX(min)
		if taken != Direct {
			continue
		}
		gpa, ok := m.gpaOf(buf)
		if wantErr != nil || len(want) != 1 || !want[0].write || !ok || want[0] != (piece{gpa, len(buf), true}) || len(buf) < min {
			t.Fatalf("PopRX(%d) served %d bytes at %#x; the walker reads %v, err %v", min, len(buf), gpa, want, wantErr)
		}
		// GatherRX, the region now cached, takes the same buffer
		q.Unpop(1)
		var out [2]RXBuf
		if n := q.GatherRX(min, out[:1]); n != 1 || !bytes.Equal(q.Buf(&out[0]), buf) || &q.Buf(&out[0])[0] != &buf[0] {
			t.Fatalf("GatherRX(%d) took %d chains; PopRX served %d bytes at %#x", min, n, len(buf), gpa)
		}
	}
}

// popTX gathers one chain, as a burst's first.
func popTX(q *Queue, hdrLen int) (head uint16, frame []byte, t Taken) {
	var out [1]TXFrame
	n, broken := q.GatherTX(hdrLen, out[:])
	if broken || n != 1 {
		return 0, nil, Broken
	}
	f := &out[0]
	if f.Kind == Direct {
		frame = q.Frame(f)
	}
	return f.Head, frame, f.Kind
}

// endsAt reports whether the last of the pieces ends at gpa.
func endsAt(ps []piece, gpa uint64) bool {
	return len(ps) > 0 && ps[len(ps)-1].gpa+uint64(ps[len(ps)-1].n) == gpa
}

// TestDirectChains: which chains the direct path serves, and that it
// declines everything else before anything is consumed but the head.
func TestDirectChains(t *testing.T) {
	const D = stdDataGPA
	cases := []struct {
		name   string
		descs  [][4]uint64 // addr, len, flags, next
		tx, rx Taken
		frame  int // bytes of the direct TX frame
	}{
		{"tx one descriptor", [][4]uint64{{D, 12 + 60, 0, 0}}, Direct, Walk, 60},
		{"tx header then frame", [][4]uint64{{D, 12, fNext, 1}, {D + 0x100, 1514, 0, 0}}, Direct, Walk, 1514},
		{"tx header only", [][4]uint64{{D, 12, 0, 0}}, Direct, Walk, 0},
		{"tx ends at the region's end", [][4]uint64{{stdAEnd - 72, 72, 0, 0}}, Direct, Walk, 60},
		{"tx crosses into the next region", [][4]uint64{{stdAEnd - 36, 72, 0, 0}}, Walk, Walk, 0},
		{"tx address + length wraps", [][4]uint64{{1<<64 - 16, 72, 0, 0}}, Walk, Walk, 0},
		{"tx outside memory", [][4]uint64{{0x60000, 72, 0, 0}}, Walk, Walk, 0},
		{"tx shorter than the header", [][4]uint64{{D, 11, 0, 0}}, Walk, Walk, 0},
		{"tx header split", [][4]uint64{{D, 6, fNext, 1}, {D + 6, 66, 0, 0}}, Walk, Walk, 0},
		{"tx three descriptors", [][4]uint64{{D, 12, fNext, 1}, {D + 12, 30, fNext, 2}, {D + 42, 30, 0, 0}}, Walk, Walk, 0},
		{"tx next out of range", [][4]uint64{{D, 12, fNext, 4}}, Walk, Walk, 0},
		{"tx indirect", [][4]uint64{{D, 32, fIndirect, 0}}, Walk, Walk, 0},
		{"tx second descriptor writable", [][4]uint64{{D, 12, fNext, 1}, {D + 12, 60, fWrite, 0}}, Walk, Walk, 0},
		{"rx one descriptor", [][4]uint64{{D, 2048, fWrite, 0}}, Walk, Direct, 0},
		{"rx ends at the region's end", [][4]uint64{{stdAEnd - 2048, 2048, fWrite, 0}}, Walk, Direct, 0},
		{"rx crosses into the next region", [][4]uint64{{stdAEnd - 1024, 2048, fWrite, 0}}, Walk, Walk, 0},
		{"rx two descriptors", [][4]uint64{{D, 12, fWrite | fNext, 1}, {D + 12, 2036, fWrite, 0}}, Walk, Walk, 0},
		{"rx shorter than asked", [][4]uint64{{D, 11, fWrite, 0}}, Walk, Walk, 0},
		{"rx indirect", [][4]uint64{{D, 32, fIndirect | fWrite, 0}}, Walk, Walk, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, d, _ := newRing(t, 4, Features{IndirectDesc: true})
			for i, x := range c.descs {
				d.setDesc(i, x[0], uint32(x[1]), uint16(x[2]), uint16(x[3]))
			}
			d.add(0)
			q := d.queue(t, 0, Features{IndirectDesc: true})
			head, frame, taken := popTX(q, 12)
			if head != 0 || taken != c.tx || q.LastAvail() != 1 || q.UsedIdx() != 0 {
				t.Fatalf("PopTX = head %d, %v (took %d, used %d); want head 0, %v", head, taken, q.LastAvail(), q.UsedIdx(), c.tx)
			}
			if taken == Direct && len(frame) != c.frame {
				t.Fatalf("PopTX frame %d bytes, want %d", len(frame), c.frame)
			}
			q = d.queue(t, 0, Features{IndirectDesc: true})
			if head, _, taken := q.PopRX(12); head != 0 || taken != c.rx || q.LastAvail() != 1 {
				t.Fatalf("PopRX(12) = head %d, %v; want head 0, %v", head, taken, c.rx)
			}
		})
	}
	// A head out of range is a broken ring: nothing taken.
	_, d, q := newRing(t, 4, Features{})
	d.add(4)
	if _, _, taken := popTX(q, 12); taken != Broken || q.LastAvail() != 0 {
		t.Fatalf("PopTX of head 4 of 4 = %v, took %d", taken, q.LastAvail())
	}
	if _, _, taken := q.PopRX(12); taken != Broken || q.LastAvail() != 0 {
		t.Fatalf("PopRX of head 4 of 4 = %v, took %d", taken, q.LastAvail())
	}
}

// TestDirectRewrittenConcurrently: a guest rewriting its descriptors and
// ring while the device takes chains gets, per chain, a declined chain or
// buffers inside guest memory: never an access outside it.
func TestDirectRewrittenConcurrently(t *testing.T) {
	m, d, _ := newRing(t, 16, Features{})
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the hostile guest
		defer wg.Done()
		addrs := []uint64{stdDataGPA, stdAEnd - 40, stdAEnd - 2048, 1<<64 - 8, 0x60000, stdCGPA + 0xf00}
		lens := []uint32{0, 12, 40, 72, 2048, 0xffffffff}
		for i := uint64(0); !stop.Load(); i++ {
			e := d.desc[(i%16)*virtio.DescSize:]
			binary.LittleEndian.PutUint64(e, addrs[i%uint64(len(addrs))])
			binary.LittleEndian.PutUint32(e[8:], lens[(i/3)%uint64(len(lens))])
			binary.LittleEndian.PutUint16(e[12:], []uint16{0, fNext, fWrite, fNext | fWrite, fIndirect}[(i/7)%5])
			binary.LittleEndian.PutUint16(e[14:], uint16(i*5)%20)
			binary.LittleEndian.PutUint16(d.avail[4+2*(i%16):], uint16(i*3)%18)
		}
	}()
	inMem := func(b []byte) bool { // wholly inside one region
		_, ok := m.gpaOf(b)
		return ok || len(b) == 0
	}
	var direct int
	for i := range 200000 {
		q := d.queue(t, uint16(i), Features{})
		q.lastAvail = uint16(i)
		if i%2 == 0 {
			var out [4]TXFrame
			n, _ := q.GatherTX(12, out[:])
			for _, f := range out[:n] {
				if fr := q.Frame(&f); f.Kind == Direct && !inMem(fr) {
					t.Fatalf("GatherTX returned %d bytes outside guest memory", len(fr))
				}
			}
			q.lastAvail = uint16(i)
			_, frame, taken := popTX(q, 12)
			if taken == Direct {
				direct++
				if !inMem(frame) {
					t.Fatalf("PopTX returned %d bytes outside guest memory", len(frame))
				}
			}
		} else {
			_, buf, taken := q.PopRX(12)
			if taken == Direct {
				direct++
				if !inMem(buf) || len(buf) < 12 {
					t.Fatalf("PopRX returned %d bytes outside guest memory (or short)", len(buf))
				}
				// the region is cached now: the next ones in a batch
				var out [4]RXBuf
				for _, r := range out[:q.GatherRX(12, out[:])] {
					if b := q.Buf(&r); !inMem(b) || len(b) < 12 {
						t.Fatalf("GatherRX returned %d bytes outside guest memory (or short)", len(b))
					}
				}
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if direct == 0 {
		t.Fatal("no chain was taken directly: the test tested nothing")
	}
}

// TestGatherTX: a burst's chains are taken back to back; the gather stops
// before a chain in another region than the one cached (that chain starts
// the next gather, which looks its region up), and at a head out of range
// (broken, nothing more taken). Chains only the walker serves, and direct
// ones whose header carries offload metadata, are taken as Walk.
func TestGatherTX(t *testing.T) {
	const D = stdDataGPA
	m, d, q := newRing(t, 16, Features{})
	m.bytes(t, D+0x500, 2)[0] = 1 // chain 3's header: NEEDS_CSUM
	chains := [][][4]uint64{
		{{D, 12 + 60, 0, 0}}, // 0 direct, region A
		{{D + 0x100, 12, fNext, 2}, {D + 0x200, 100, 0, 0}},                           // 1 direct, two descriptors
		{{D + 0x300, 12, fNext, 4}, {D + 0x400, 30, fNext, 5}, {D + 0x410, 30, 0, 0}}, // 3 descriptors: Walk
		{{D + 0x500, 12 + 60, 0, 0}},                                                  // offload metadata: Walk
		{{stdCGPA, 12 + 200, 0, 0}},                                                   // region C: stops the first gather
		{{stdCGPA + 0x400, 12 + 64, 0, 0}},                                            // C again
		{{D + 0x600, 12 + 64, 0, 0}},                                                  // back in A: stops the second
	}
	var heads []uint16
	next := 0
	for _, c := range chains {
		heads = append(heads, uint16(next))
		for i, x := range c {
			nx := uint16(x[3])
			if x[2]&fNext != 0 {
				nx = uint16(next + i + 1)
			}
			d.setDesc(next+i, x[0], uint32(x[1]), uint16(x[2]), nx)
		}
		next += len(c)
		d.add(heads[len(heads)-1])
	}
	d.add(16) // out of range
	var out [8]TXFrame
	want := func(f TXFrame, head uint16, kind Taken, gpa uint64, n int) {
		t.Helper()
		if f.Head != head || f.Kind != kind {
			t.Fatalf("chain head %d: got head %d, %v; want %v", head, f.Head, f.Kind, kind)
		}
		if kind != Direct {
			return
		}
		fr := q.Frame(&f)
		if g, ok := m.gpaOf(fr); !ok || g != gpa || len(fr) != n {
			t.Fatalf("chain head %d: frame at %#x (%v), %d bytes; want %#x, %d", head, g, ok, len(fr), gpa, n)
		}
	}
	n, broken := q.GatherTX(12, out[:])
	if n != 4 || broken || q.LastAvail() != 4 {
		t.Fatalf("first gather: %d chains (broken %v), took %d; want 4, stopping before region C", n, broken, q.LastAvail())
	}
	want(out[0], heads[0], Direct, D+12, 60)
	want(out[1], heads[1], Direct, D+0x200, 100)
	want(out[2], heads[2], Walk, 0, 0)
	want(out[3], heads[3], Walk, 0, 0)
	n, broken = q.GatherTX(12, out[:])
	if n != 2 || broken || q.LastAvail() != 6 {
		t.Fatalf("second gather: %d chains (broken %v), took %d; want 2", n, broken, q.LastAvail())
	}
	want(out[0], heads[4], Direct, stdCGPA+12, 200)
	want(out[1], heads[5], Direct, stdCGPA+0x40c, 64)
	n, broken = q.GatherTX(12, out[:])
	if n != 1 || !broken || q.LastAvail() != 7 {
		t.Fatalf("third gather: %d chains (broken %v), took %d; want 1, then the broken head untaken", n, broken, q.LastAvail())
	}
	want(out[0], heads[6], Direct, D+0x60c, 64)
	// A record that does not lie in the region cached now (an older
	// gather's, made in a larger region) gives no frame.
	stale := TXFrame{off: q.v.rsize - 10, Len: 64, Kind: Direct}
	if fr := q.Frame(&stale); fr != nil {
		t.Fatalf("Frame of a record reaching past the cached region returned %d bytes", len(fr))
	}
}

// TestGatherRX: buffers are taken back to back while each is one writable
// descriptor of at least min bytes inside the cached region; the first
// that is not stays untaken.
func TestGatherRX(t *testing.T) {
	const D = stdDataGPA
	m, d, q := newRing(t, 16, Features{})
	d.setDesc(0, D, 2048, fWrite, 0)
	d.setDesc(1, D+0x1000, 2048, fWrite, 0)
	d.setDesc(2, D+0x2000, 100, fWrite, 0) // too short for 1500
	d.setDesc(3, stdCGPA, 2048, fWrite, 0) // region C
	d.setDesc(4, D+0x3000, 2048, 0, 0)     // not writable
	for _, h := range []uint16{0, 1, 2, 3, 4} {
		d.add(h)
	}
	var out [8]RXBuf
	if n := q.GatherRX(1500, out[:]); n != 0 || q.LastAvail() != 0 {
		t.Fatalf("with no region cached: took %d (%d); want none (PopRX looks it up)", n, q.LastAvail())
	}
	if _, _, taken := q.PopRX(1500); taken != Direct {
		t.Fatalf("PopRX: %v", taken)
	}
	q.Unpop(1)
	if n := q.GatherRX(1500, out[:]); n != 2 || q.LastAvail() != 2 {
		t.Fatalf("took %d (%d), want the 2 long enough", n, q.LastAvail())
	}
	for i, gpa := range []uint64{D, D + 0x1000} {
		b := q.Buf(&out[i])
		if g, ok := m.gpaOf(b); !ok || g != gpa || len(b) != 2048 || out[i].Head != uint16(i) {
			t.Fatalf("buffer %d at %#x (%v), %d bytes, head %d", i, g, ok, len(b), out[i].Head)
		}
	}
	if n := q.GatherRX(64, out[:]); n != 1 || q.LastAvail() != 3 {
		t.Fatalf("took %d (%d), want the short one, stopping before region C", n, q.LastAvail())
	}
	if _, _, taken := q.PopRX(64); taken != Direct { // caches C
		t.Fatalf("PopRX in region C: %v", taken)
	}
	if n := q.GatherRX(64, out[:]); n != 0 || q.LastAvail() != 4 {
		t.Fatalf("a readable descriptor: took %d (%d), want none", n, q.LastAvail())
	}
	d.add(16)
	q.lastAvail = 5
	if n := q.GatherRX(1, out[:]); n != 0 || q.LastAvail() != 5 {
		t.Fatalf("a head out of range: took %d", n)
	}
}
