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
		_, lead, frame, taken := q.PopTX(hdrLen)
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
		if got := uint16(all[0]) | uint16(all[1])<<8; got != lead {
			t.Fatalf("PopTX(%d): header lead %#x, walker reads %#x", hdrLen, lead, got)
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
	}
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
			head, _, frame, taken := q.PopTX(12)
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
	if _, _, _, taken := q.PopTX(12); taken != Broken || q.LastAvail() != 0 {
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
			_, _, frame, taken := q.PopTX(12)
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
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if direct == 0 {
		t.Fatal("no chain was taken directly: the test tested nothing")
	}
}
