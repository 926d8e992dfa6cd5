package virtq

import (
	"encoding/binary"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// This file holds the test side of a split virtqueue: guest memory backed by
// a memfd and a mock driver that lays out descriptors and rings by hand, the
// way a guest's virtio_ring.c would.

// regionSpec is one guest memory region of a test memory layout.
type regionSpec struct {
	gpa, size, fileOff uint64
}

// testMem is guest memory made of memfd-backed regions.
type testMem struct {
	tbl  *guestmem.Table
	regs []*guestmem.Region
}

// newTestMem maps the regions from one memfd (each at its own file offset)
// and unmaps them when the test ends.
func newTestMem(tb testing.TB, specs ...regionSpec) *testMem {
	tb.Helper()
	fd, err := unix.MemfdCreate("virtq-test", unix.MFD_CLOEXEC)
	if err != nil {
		tb.Fatalf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	var fileSize uint64
	for _, s := range specs {
		fileSize = max(fileSize, s.fileOff+s.size)
	}
	if err := unix.Ftruncate(fd, int64(fileSize)); err != nil {
		tb.Fatalf("ftruncate: %v", err)
	}
	m := &testMem{}
	for _, s := range specs {
		r, err := guestmem.Map(fd, s.gpa, s.size, 0x7f00_0000_0000+s.gpa, s.fileOff)
		if err != nil {
			tb.Fatalf("map %+v: %v", s, err)
		}
		m.regs = append(m.regs, r)
	}
	m.tbl, err = guestmem.NewTable(m.regs)
	if err != nil {
		tb.Fatalf("table: %v", err)
	}
	tb.Cleanup(m.tbl.Unmap)
	return m
}

// bytes returns the n bytes at gpa, which must lie in one region.
func (m *testMem) bytes(tb testing.TB, gpa, n uint64) []byte {
	tb.Helper()
	b, err := m.tbl.Slice(gpa, n)
	if err != nil {
		tb.Fatalf("slice %#x+%d: %v", gpa, n, err)
	}
	return b
}

// gpaOf returns the guest physical address of b's first byte and whether
// b lies wholly inside one mapped region.
func (m *testMem) gpaOf(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, r := range m.regs {
		d := r.Bytes()
		base := uintptr(unsafe.Pointer(unsafe.SliceData(d)))
		if p >= base && p-base < uintptr(len(d)) && uintptr(len(b)) <= uintptr(len(d))-(p-base) {
			return r.GPA + uint64(p-base), true
		}
	}
	return 0, false
}

// driver is a mock virtio driver for one split ring in testMem.
type driver struct {
	mem                        *testMem
	size                       int
	descGPA, availGPA, usedGPA uint64
	desc, avail, used          []byte
	availIdx                   uint16
}

func newDriver(tb testing.TB, m *testMem, size int, descGPA, availGPA, usedGPA uint64) *driver {
	tb.Helper()
	d := &driver{mem: m, size: size, descGPA: descGPA, availGPA: availGPA, usedGPA: usedGPA}
	d.desc = m.bytes(tb, descGPA, uint64(virtio.DescSize*size))
	d.avail = m.bytes(tb, availGPA, uint64(virtio.AvailRingSize(size)))
	d.used = m.bytes(tb, usedGPA, uint64(virtio.UsedRingSize(size)))
	return d
}

// queue builds the device side over the driver's rings.
func (d *driver) queue(tb testing.TB, lastAvail uint16, f Features) *Queue {
	tb.Helper()
	q, err := New(d.mem.tbl, d.size, d.desc, d.avail, d.used, lastAvail, f)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return q
}

func (d *driver) setDesc(i int, addr uint64, n uint32, flags, next uint16) {
	putDesc(d.desc[i*virtio.DescSize:], addr, n, flags, next)
}

func putDesc(b []byte, addr uint64, n uint32, flags, next uint16) {
	binary.LittleEndian.PutUint64(b, addr)
	binary.LittleEndian.PutUint32(b[8:], n)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
}

// add makes head available (it does not allocate: the allocation tests use
// it inside the measured function).
func (d *driver) add(head uint16) {
	binary.LittleEndian.PutUint16(d.avail[4+2*(int(d.availIdx)%d.size):], head)
	d.availIdx++
	binary.LittleEndian.PutUint16(d.avail[2:], d.availIdx)
}

func (d *driver) setAvailIdx(v uint16) {
	d.availIdx = v
	binary.LittleEndian.PutUint16(d.avail[2:], v)
}

func (d *driver) setAvailRing(i int, head uint16) {
	binary.LittleEndian.PutUint16(d.avail[4+2*i:], head)
}

func (d *driver) setAvailFlags(v uint16) { binary.LittleEndian.PutUint16(d.avail[0:], v) }
func (d *driver) setUsedEvent(v uint16) {
	binary.LittleEndian.PutUint16(d.avail[4+2*d.size:], v)
}

func (d *driver) setUsedIdx(v uint16)    { binary.LittleEndian.PutUint16(d.used[2:], v) }
func (d *driver) usedFlags() uint16      { return binary.LittleEndian.Uint16(d.used[0:]) }
func (d *driver) usedIdx() uint16        { return binary.LittleEndian.Uint16(d.used[2:]) }
func (d *driver) availEvent() uint16     { return binary.LittleEndian.Uint16(d.used[4+8*d.size:]) }
func (d *driver) setAvailEvent(v uint16) { binary.LittleEndian.PutUint16(d.used[4+8*d.size:], v) }

// usedElem returns used ring entry i (a ring slot, not an index).
func (d *driver) usedElem(i int) (id, n uint32) {
	e := d.used[4+8*i:]
	return binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:])
}

// piece is one host-contiguous buffer a walk returned, by guest address.
type piece struct {
	gpa   uint64
	n     int
	write bool
}

// walkChain walks a chain with Chain.Next, checking that every piece lies
// in guest memory, and returns the pieces and the walk's error.
func walkChain(tb testing.TB, m *testMem, c Chain) ([]piece, error) {
	tb.Helper()
	var ps []piece
	for i := 0; ; i++ {
		if i > 1<<20 {
			tb.Fatalf("walk did not terminate")
		}
		b, w, ok := c.Next()
		if !ok {
			if b != nil {
				tb.Fatalf("Next returned a buffer with ok=false")
			}
			break
		}
		gpa, in := m.gpaOf(b)
		if !in {
			tb.Fatalf("Next returned %d bytes outside guest memory", len(b))
		}
		ps = append(ps, piece{gpa, len(b), w})
	}
	// A finished walk stays finished.
	if _, _, ok := c.Next(); ok {
		tb.Fatalf("Next returned a buffer after the walk ended")
	}
	return ps, c.Err()
}

// Standard test layout: region A [0, 0x40000) holds the rings and data;
// region B [0x40000, 0x50000) is adjacent in guest physical memory but a
// separate mapping (a buffer crossing 0x40000 is contiguous in GPA, not in
// host memory); region C [0x100000, 0x101000) sits after a hole.
const (
	stdDescGPA  = 0x0
	stdAvailGPA = 0x10000
	stdUsedGPA  = 0x14000
	stdDataGPA  = 0x20000
	stdAEnd     = 0x40000
	stdBEnd     = 0x50000
	stdCGPA     = 0x100000
	stdCEnd     = 0x101000
)

func newStdMem(tb testing.TB) *testMem {
	return newTestMem(tb,
		regionSpec{gpa: 0, size: stdAEnd, fileOff: 0},
		regionSpec{gpa: stdAEnd, size: stdBEnd - stdAEnd, fileOff: 0x50000},
		regionSpec{gpa: stdCGPA, size: stdCEnd - stdCGPA, fileOff: 0x40000},
	)
}

// newRing returns standard memory, a driver of the given size (≤ 4096) and
// the device queue over it.
func newRing(tb testing.TB, size int, f Features) (*testMem, *driver, *Queue) {
	tb.Helper()
	m := newStdMem(tb)
	d := newDriver(tb, m, size, stdDescGPA, stdAvailGPA, stdUsedGPA)
	return m, d, d.queue(tb, 0, f)
}
