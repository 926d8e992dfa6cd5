package guestmem

import (
	"errors"
	"math/rand/v2"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// memfd returns a memfd of size bytes, closed when the test ends.
func memfd(t *testing.T, size int64) int {
	t.Helper()
	fd, err := unix.MemfdCreate("guestmem-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	return fd
}

func mustMap(t *testing.T, fd int, gpa, size, uva, off uint64) *Region {
	t.Helper()
	r, err := Map(fd, gpa, size, uva, off)
	if err != nil {
		t.Fatalf("Map(gpa %#x size %#x uva %#x off %#x): %v", gpa, size, uva, off, err)
	}
	t.Cleanup(func() { r.Unmap() })
	return r
}

// fakeRegion is a region over Go memory, for table logic that does not
// need a mapping.
func fakeRegion(gpa, size, uva uint64) *Region {
	d := make([]byte, size)
	return &Region{GPA: gpa, UVA: uva, Size: size, data: d}
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func TestMapRefuses(t *testing.T) {
	fd := memfd(t, 0x3000)
	for _, c := range []struct {
		name                string
		gpa, size, uva, off uint64
	}{
		{"size 0", 0, 0, 0, 0},
		{"size over the cap", 0, maxRegionBytes + 0x1000, 0, 0},
		{"gpa + size overflows", 1<<64 - 0x1000, 0x2000, 0, 0},
		{"gpa + size is 2^64", 1<<64 - 0x1000, 0x1000, 0, 0},
		{"uva + size overflows", 0, 0x2000, 1<<64 - 0x1000, 0},
		{"offset + size overflows", 0, 0x2000, 0, 1<<64 - 0x1000},
		{"offset over the cap", 0, 0x1000, 0, maxRegionBytes + 0x1000},
		{"file smaller than the region", 0, 0x4000, 0, 0},
		{"file smaller than offset + size", 0, 0x2000, 0, 0x1001},
		{"offset past the file", 0, 0x1000, 0, 0x3000},
	} {
		if r, err := Map(fd, c.gpa, c.size, c.uva, c.off); err == nil {
			r.Unmap()
			t.Errorf("%s: Map succeeded", c.name)
		}
	}
	if _, err := Map(-1, 0, 0x1000, 0, 0); err == nil {
		t.Errorf("Map of fd -1 succeeded")
	}
	// Exactly the file is fine, and Map leaves the fd open.
	r := mustMap(t, fd, 0, 0x1000, 0, 0x2000)
	if len(r.Bytes()) != 0x1000 {
		t.Errorf("region has %d bytes", len(r.Bytes()))
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		t.Errorf("Map closed its fd: %v", err)
	}
}

// A file truncated below a region after mapping would fault; one that is
// already too short is refused before mmap.
func TestMapTruncatedFile(t *testing.T) {
	fd := memfd(t, 0x4000)
	mustMap(t, fd, 0, 0x4000, 0, 0)
	if err := unix.Ftruncate(fd, 0x2000); err != nil {
		t.Fatal(err)
	}
	if r, err := Map(fd, 0, 0x4000, 0, 0); err == nil {
		r.Unmap()
		t.Errorf("Map of a truncated file succeeded")
	}
	if r, err := Map(fd, 0, 0x1000, 0, 0x1800); err == nil {
		r.Unmap()
		t.Errorf("Map past the truncated end succeeded")
	}
}

func TestMapOffset(t *testing.T) {
	for _, c := range []struct {
		name      string
		fileSize  int64
		off, size uint64
	}{
		{"page offset", 0x4000, 0x1000, 0x2000},
		{"unaligned offset", 0x4000, 0x1234, 0x100},
		{"unaligned end at the file end", 0x1334, 0x1234, 0x100},
		{"whole file", 0x4000, 0, 0x4000},
	} {
		t.Run(c.name, func(t *testing.T) {
			fd := memfd(t, c.fileSize)
			own, err := unix.Mmap(fd, 0, int(c.fileSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(own)
			for i := range own {
				own[i] = byte(i*7 + i>>8)
			}
			r := mustMap(t, fd, 0x100000, c.size, 0x7f0000000000, c.off)
			b := r.Bytes()
			if uint64(len(b)) != c.size || uint64(cap(b)) != c.size {
				t.Fatalf("Bytes: len %d cap %d, want %d", len(b), cap(b), c.size)
			}
			for i := range b {
				if b[i] != own[c.off+uint64(i)] {
					t.Fatalf("byte %d of the region = %#x, file byte %#x is %#x", i, b[i], c.off+uint64(i), own[c.off+uint64(i)])
				}
			}
			// Writes are shared with the file.
			b[0], b[len(b)-1] = 0xaa, 0x55
			if own[c.off] != 0xaa || own[c.off+c.size-1] != 0x55 {
				t.Errorf("writes through the region are not visible in the file")
			}
			tbl, err := NewTable([]*Region{r})
			if err != nil {
				t.Fatal(err)
			}
			s, err := tbl.Slice(0x100000, 1)
			if err != nil || s[0] != 0xaa {
				t.Errorf("Slice(gpa) = %x, %v", s, err)
			}
			s, err = tbl.SliceUVA(0x7f0000000000+c.size-1, 1)
			if err != nil || s[0] != 0x55 {
				t.Errorf("SliceUVA(last byte) = %x, %v", s, err)
			}
		})
	}
}

func TestUnmap(t *testing.T) {
	fd := memfd(t, 0x2000)
	r, err := Map(fd, 0, 0x2000, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	tbl, _ := NewTable([]*Region{r})
	tbl.Unmap()
	if r.Bytes() != nil {
		t.Errorf("Bytes after Unmap = %d bytes", len(r.Bytes()))
	}
	if err := r.Unmap(); err != nil {
		t.Errorf("second Unmap: %v", err)
	}
	var nilTable *Table
	nilTable.Unmap()
}

func TestSliceBounds(t *testing.T) {
	fd := memfd(t, 0x3000)
	const gpa, size, uva = 0x1000, 0x2000, 0x7f0000010000
	r := mustMap(t, fd, gpa, size, uva, 0x1000)
	tbl, err := NewTable([]*Region{r})
	if err != nil {
		t.Fatal(err)
	}
	base := addr(r.Bytes())
	for _, c := range []struct {
		a, n uint64
		ok   bool
	}{
		{gpa, size, true},
		{gpa, 0, true},
		{gpa, 1, true},
		{gpa + size - 1, 1, true}, // last byte
		{gpa + size - 1, 0, true},
		{gpa + 0x800, size - 0x800, true},
		{gpa + size, 1, false}, // one past
		{gpa + size, 0, false},
		{gpa - 1, 1, false},
		{gpa - 1, 2, false},
		{gpa, size + 1, false},
		{gpa + size - 1, 2, false},
		{gpa, 1<<64 - 1, false},
		{gpa + 0x1000, 1<<64 - 0x1000, false}, // gpa + n overflows to inside
		{1<<64 - 1, 1, false},
		{0, 0x1000, false},
	} {
		s, err := tbl.Slice(c.a, c.n)
		if c.ok {
			if err != nil || uint64(len(s)) != c.n || uint64(cap(s)) != c.n ||
				(c.n > 0 && addr(s) != base+uintptr(c.a-gpa)) {
				t.Errorf("Slice(%#x, %#x) = %d bytes (cap %d), %v", c.a, c.n, len(s), cap(s), err)
			}
		} else if s != nil || !errors.Is(err, ErrOutOfBounds) {
			t.Errorf("Slice(%#x, %#x) = %d bytes, %v; want ErrOutOfBounds", c.a, c.n, len(s), err)
		}
		// The same range through the frontend's addresses.
		u := c.a - gpa + uva
		s, err = tbl.SliceUVA(u, c.n)
		if c.ok {
			if err != nil || uint64(len(s)) != c.n || (c.n > 0 && addr(s) != base+uintptr(c.a-gpa)) {
				t.Errorf("SliceUVA(%#x, %#x) = %d bytes, %v", u, c.n, len(s), err)
			}
		} else if s != nil || !errors.Is(err, ErrOutOfBounds) {
			t.Errorf("SliceUVA(%#x, %#x) = %d bytes, %v; want ErrOutOfBounds", u, c.n, len(s), err)
		}
	}
	// GPAs are not UVAs and the other way round.
	if _, err := tbl.SliceUVA(gpa, 1); err == nil {
		t.Errorf("SliceUVA translated a guest physical address")
	}
	if _, err := tbl.Slice(uva, 1); err == nil {
		t.Errorf("Slice translated a frontend virtual address")
	}
}

func TestSpan(t *testing.T) {
	fd := memfd(t, 0x3000)
	a := mustMap(t, fd, 0x1000, 0x1000, 0x10000, 0)
	b := mustMap(t, fd, 0x2000, 0x1000, 0x20000, 0x2000) // adjacent in GPA, not in the file
	tbl, err := NewTable([]*Region{b, a})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		gpa, n uint64
		want   int
		in     *Region
	}{
		{0x1000, 0x10, 0x10, a},
		{0x1ff0, 0x100, 0x10, a}, // stops at the region's end
		{0x2000, 0x100, 0x100, b},
		{0x2ff0, 1 << 40, 0x10, b},
		{0x1000, 1<<64 - 1, 0x1000, a},
		{0x1800, 0, 0, a},
	} {
		s := tbl.Span(c.gpa, c.n)
		if len(s) != c.want || cap(s) != c.want || s == nil || (c.want > 0 && addr(s) != addr(c.in.Bytes())+uintptr(c.gpa-c.in.GPA)) {
			t.Errorf("Span(%#x, %#x) = %d bytes, want %d", c.gpa, c.n, len(s), c.want)
		}
	}
	for _, g := range []uint64{0, 0xfff, 0x3000, 1<<64 - 1} {
		if s := tbl.Span(g, 1); s != nil {
			t.Errorf("Span(%#x) = %d bytes, want nil", g, len(s))
		}
	}
}

func TestNilTable(t *testing.T) {
	var tbl *Table
	if _, err := tbl.Slice(0, 1); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("Slice on nil table: %v", err)
	}
	if _, err := tbl.SliceUVA(0, 1); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("SliceUVA on nil table: %v", err)
	}
	if tbl.Span(0, 1) != nil || tbl.Len() != 0 || tbl.Regions() != nil {
		t.Errorf("nil table is not empty")
	}
	t2, err := tbl.With(fakeRegion(0, 0x1000, 0))
	if err != nil || t2.Len() != 1 {
		t.Errorf("With on nil table: %v", err)
	}
	if _, _, err := tbl.Without(0, 0x1000, 0); err == nil {
		t.Errorf("Without on nil table succeeded")
	}
	empty, err := NewTable(nil)
	if err != nil || empty.Len() != 0 {
		t.Fatalf("NewTable(nil) = %v, %v", empty, err)
	}
	if _, err := empty.Slice(0, 0); err == nil {
		t.Errorf("Slice on an empty table succeeded")
	}
}

func TestNewTableOverlaps(t *testing.T) {
	type reg struct{ gpa, size, uva uint64 }
	for _, c := range []struct {
		name string
		rs   []reg
		ok   bool
	}{
		{"adjacent", []reg{{0, 0x1000, 0x10000}, {0x1000, 0x1000, 0x11000}}, true},
		{"reversed order", []reg{{0x1000, 0x1000, 0x11000}, {0, 0x1000, 0x10000}}, true},
		{"uva order differs from gpa order", []reg{{0, 0x1000, 0x50000}, {0x1000, 0x1000, 0x10000}}, true},
		{"gpa overlap by a byte", []reg{{0, 0x1001, 0x10000}, {0x1000, 0x1000, 0x20000}}, false},
		{"same gpa", []reg{{0x1000, 0x1000, 0x10000}, {0x1000, 0x1000, 0x20000}}, false},
		{"gpa contained", []reg{{0, 0x10000, 0x100000}, {0x2000, 0x1000, 0x20000}}, false},
		{"gpa overlap in the middle of three", []reg{{0, 0x1000, 0x10000}, {0x3000, 0x1000, 0x30000}, {0x800, 0x1000, 0x50000}}, false},
		{"uva overlap by a byte", []reg{{0, 0x1000, 0x10000}, {0x5000, 0x1000, 0x10fff}}, false},
		{"same uva", []reg{{0, 0x1000, 0x10000}, {0x5000, 0x1000, 0x10000}}, false},
		{"uva contained", []reg{{0, 0x1000, 0x10000}, {0x5000, 0x100000, 0x8000}}, false},
	} {
		var rs []*Region
		for _, r := range c.rs {
			rs = append(rs, fakeRegion(r.gpa, r.size, r.uva))
		}
		tbl, err := NewTable(rs)
		if (err == nil) != c.ok {
			t.Errorf("%s: NewTable err %v, want ok=%v", c.name, err, c.ok)
		}
		if err == nil {
			got := tbl.Regions()
			for i := 1; i < len(got); i++ {
				if got[i-1].GPA >= got[i].GPA {
					t.Errorf("%s: Regions not sorted by GPA", c.name)
				}
			}
		}
	}
	many := make([]*Region, MaxRegions+1)
	for i := range many {
		many[i] = &Region{GPA: uint64(i) << 12, UVA: uint64(i) << 12, Size: 1 << 12}
	}
	if _, err := NewTable(many); err == nil {
		t.Errorf("NewTable accepted %d regions", len(many))
	}
	if tbl, err := NewTable(many[:MaxRegions]); err != nil || tbl.Len() != MaxRegions {
		t.Errorf("NewTable of %d regions: %v", MaxRegions, err)
	}
}

func TestWithWithout(t *testing.T) {
	a := fakeRegion(0, 0x1000, 0x10000)
	b := fakeRegion(0x4000, 0x2000, 0x20000)
	t0, err := NewTable([]*Region{a})
	if err != nil {
		t.Fatal(err)
	}
	t1, err := t0.With(b)
	if err != nil || t1.Len() != 2 || t0.Len() != 1 {
		t.Fatalf("With: %v; lens %d %d", err, t1.Len(), t0.Len())
	}
	if _, err := t0.Slice(0x4000, 1); err == nil {
		t.Errorf("With changed the original table")
	}
	if s, err := t1.Slice(0x5fff, 1); err != nil || addr(s) != addr(b.data)+0x1fff {
		t.Errorf("new region not translated: %v", err)
	}
	if _, err := t1.With(fakeRegion(0x5000, 0x1000, 0x90000)); err == nil {
		t.Errorf("With accepted a GPA overlap")
	}
	if _, err := t1.With(fakeRegion(0x9000, 0x1000, 0x20fff)); err == nil {
		t.Errorf("With accepted a UVA overlap")
	}
	for _, c := range []struct{ gpa, size, uva uint64 }{
		{0x4000, 0x1000, 0x20000}, // size differs
		{0x4000, 0x2000, 0x20001}, // uva differs
		{0x4001, 0x2000, 0x20000},
		{0x8000, 0x1000, 0x30000},
	} {
		if _, _, err := t1.Without(c.gpa, c.size, c.uva); err == nil {
			t.Errorf("Without(%#x, %#x, %#x) matched", c.gpa, c.size, c.uva)
		}
	}
	t2, gone, err := t1.Without(0x4000, 0x2000, 0x20000)
	if err != nil || gone != b || t2.Len() != 1 || t1.Len() != 2 {
		t.Fatalf("Without: %v, gone %v, lens %d %d", err, gone, t2.Len(), t1.Len())
	}
	if _, err := t2.Slice(0x4000, 1); err == nil {
		t.Errorf("removed region still translated")
	}
	if _, err := t1.Slice(0x4000, 1); err != nil {
		t.Errorf("Without changed the original table")
	}
	t3, gone, err := t2.Without(0, 0x1000, 0x10000)
	if err != nil || gone != a || t3.Len() != 0 {
		t.Errorf("removing the last region: %v, %d left", err, t3.Len())
	}
}

// Tables above 8 regions use binary search; check every translation
// against a linear scan over random layouts.
func TestLookupAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for round := range 60 {
		n := 1 + rng.IntN(40)
		if round < 4 {
			n = 7 + round // 7, 8, 9, 10 around the switch to binary search
		}
		var rs []*Region
		next := uint64(rng.IntN(3)) << 12
		for range n {
			size := uint64(1+rng.IntN(4)) << 12
			rs = append(rs, &Region{GPA: next, UVA: 0x7f0000000000 + next*2, Size: size, data: make([]byte, size)})
			next += size
			if rng.IntN(2) == 0 {
				next += uint64(rng.IntN(3)) << 12 // a hole
			}
		}
		rng.Shuffle(len(rs), func(i, j int) { rs[i], rs[j] = rs[j], rs[i] })
		tbl, err := NewTable(rs)
		if err != nil {
			t.Fatal(err)
		}
		model := func(gpa uint64) *Region {
			for _, r := range rs {
				if gpa >= r.GPA && gpa < r.GPA+r.Size {
					return r
				}
			}
			return nil
		}
		var probes []uint64
		for _, r := range rs {
			probes = append(probes, r.GPA, r.GPA-1, r.GPA+r.Size-1, r.GPA+r.Size)
		}
		for range 100 {
			probes = append(probes, uint64(rng.Int64N(int64(next+0x2000))))
		}
		probes = append(probes, 1<<64-1, 1<<63)
		for _, gpa := range probes {
			r := model(gpa)
			k := uint64(1 + rng.IntN(0x2000))
			s, err := tbl.Slice(gpa, k)
			wantOK := r != nil && gpa+k <= r.GPA+r.Size
			if wantOK != (err == nil) || (wantOK && addr(s) != addr(r.data)+uintptr(gpa-r.GPA)) {
				t.Fatalf("%d regions: Slice(%#x, %#x) = %v, want ok=%v", n, gpa, k, err, wantOK)
			}
			sp := tbl.Span(gpa, k)
			if r == nil {
				if sp != nil {
					t.Fatalf("Span(%#x) in a hole = %d bytes", gpa, len(sp))
				}
				continue
			}
			if want := min(k, r.GPA+r.Size-gpa); uint64(len(sp)) != want || addr(sp) != addr(r.data)+uintptr(gpa-r.GPA) {
				t.Fatalf("Span(%#x, %#x) = %d bytes, want %d", gpa, k, len(sp), want)
			}
			u := r.UVA + (gpa - r.GPA) // the same byte through its UVA
			if su, err := tbl.SliceUVA(u, 1); err != nil || addr(su) != addr(sp) {
				t.Fatalf("SliceUVA(%#x) = %v", u, err)
			}
		}
	}
}

// Translation never allocates.
func TestLookupAllocs(t *testing.T) {
	var rs []*Region
	for i := range 20 {
		rs = append(rs, &Region{GPA: uint64(i) << 16, UVA: uint64(i) << 20, Size: 1 << 12, data: make([]byte, 1<<12)})
	}
	tbl, err := NewTable(rs)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := tbl.Slice(5<<16+8, 8); err != nil {
			panic(err)
		}
		if tbl.Span(19<<16, 1<<20) == nil {
			panic("span")
		}
		if _, err := tbl.SliceUVA(3<<20, 1); err != nil {
			panic(err)
		}
		if _, err := tbl.Slice(7<<16+1<<12, 1); err == nil {
			panic("hole translated")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per translation, want 0", allocs)
	}
}

// TestCursorNeverStale: a cursor filled from one table must not serve that
// table's region after the owner swapped in another table, whether the new
// table maps the same guest address elsewhere, drops it, or is nil.
func TestCursorNeverStale(t *testing.T) {
	old := fakeRegion(0x10000, 0x1000, 0x7000_0000)
	moved := fakeRegion(0x10000, 0x1000, 0x9000_0000) // same GPA, other memory
	other := fakeRegion(0x40000, 0x1000, 0x8000_0000)
	t1, err := NewTable([]*Region{old})
	if err != nil {
		t.Fatal(err)
	}
	t2, err := NewTable([]*Region{moved, other})
	if err != nil {
		t.Fatal(err)
	}
	t3, err := NewTable([]*Region{other})
	if err != nil {
		t.Fatal(err)
	}
	var c Cursor
	b := c.Span(t1, 0x10010, 8)
	if len(b) != 8 || addr(b) != addr(old.data)+0x10 {
		t.Fatalf("t1: got %d bytes at %#x, want 8 in the old region", len(b), addr(b))
	}
	// swapped: the same GPA now lives in another region
	b = c.Span(t2, 0x10010, 8)
	if len(b) != 8 || addr(b) != addr(moved.data)+0x10 {
		t.Fatalf("after swap to t2: got %d bytes at %#x, want the moved region %#x (old %#x)", len(b), addr(b), addr(moved.data)+0x10, addr(old.data)+0x10)
	}
	if s, err := c.Slice(t2, 0x10020, 16); err != nil || addr(s) != addr(moved.data)+0x20 {
		t.Fatalf("t2 Slice: %#x, %v", addr(s), err)
	}
	// swapped back and forth between translations
	for i := range 4 {
		tbl, want := t1, old
		if i%2 == 1 {
			tbl, want = t2, moved
		}
		s, err := c.Slice(tbl, 0x10100, 4)
		if err != nil || addr(s) != addr(want.data)+0x100 {
			t.Fatalf("swap %d: got %#x, %v; want %#x", i, addr(s), err, addr(want.data)+0x100)
		}
	}
	// swapped to a table without that GPA, or to none: nothing
	if b := c.Span(t3, 0x10010, 8); b != nil {
		t.Fatalf("t3 has no region at 0x10010, got %d bytes at %#x", len(b), addr(b))
	}
	if _, err := c.Slice(t3, 0x10010, 8); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("t3 Slice: err %v, want ErrOutOfBounds", err)
	}
	c.Span(t2, 0x10010, 8) // remember t2's region again
	if b := c.Span(nil, 0x10010, 8); b != nil {
		t.Fatalf("nil table served %d bytes", len(b))
	}
	if _, err := c.Slice(nil, 0x10010, 8); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("nil table Slice: err %v", err)
	}
}

// TestCursorBounds: a cached hit is bounds-checked like a search: a range
// running past the remembered region is refused (Slice) or cut (Span), and
// addresses just outside it are not served from it.
func TestCursorBounds(t *testing.T) {
	r := fakeRegion(0x10000, 0x1000, 0)
	tbl, err := NewTable([]*Region{r})
	if err != nil {
		t.Fatal(err)
	}
	var c Cursor
	if _, err := c.Slice(tbl, 0x10000, 1); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		gpa, n uint64
		ok     bool
		span   int
	}{
		{0x10ff0, 0x10, true, 0x10},
		{0x10ff0, 0x11, false, 0x10},
		{0x10ff0, 1 << 63, false, 0x10},
		{0x10fff, ^uint64(0), false, 1},
		{0x11000, 1, false, 0},
		{0xffff, 1, false, 0},
		{0xffff, 2, false, 0},
		{^uint64(0), 1, false, 0},
	} {
		_, err := c.Slice(tbl, x.gpa, x.n)
		if (err == nil) != x.ok {
			t.Errorf("Slice(%#x, %#x): err %v, want ok=%v", x.gpa, x.n, err, x.ok)
		}
		if got := len(c.Span(tbl, x.gpa, x.n)); got != x.span {
			t.Errorf("Span(%#x, %#x): %d bytes, want %d", x.gpa, x.n, got, x.span)
		}
	}
}

// TestCursorAgainstTable: through a cursor, random translations over a
// table of many regions give exactly what the table's own search gives.
func TestCursorAgainstTable(t *testing.T) {
	var rs []*Region
	for i := range uint64(20) {
		rs = append(rs, fakeRegion(0x100000*i+0x1000*(i%3), 0x8000+0x1000*(i%5), 0x1_0000_0000+0x100000*i))
	}
	tbl, err := NewTable(rs)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var c Cursor
	gpa := uint64(0)
	for range 20000 {
		if rng.IntN(4) == 0 {
			gpa = rng.Uint64N(0x100000 * 21)
		} else {
			gpa += rng.Uint64N(0x2000) // mostly nearby, like a guest's buffers
		}
		n := rng.Uint64N(0x3000)
		ws, werr := tbl.Slice(gpa, n)
		gs, gerr := c.Slice(tbl, gpa, n)
		if (werr == nil) != (gerr == nil) || addr(ws) != addr(gs) || len(ws) != len(gs) {
			t.Fatalf("Slice(%#x, %#x): cursor %#x/%d/%v, table %#x/%d/%v", gpa, n, addr(gs), len(gs), gerr, addr(ws), len(ws), werr)
		}
		wb, gb := tbl.Span(gpa, n), c.Span(tbl, gpa, n)
		if addr(wb) != addr(gb) || len(wb) != len(gb) {
			t.Fatalf("Span(%#x, %#x): cursor %#x/%d, table %#x/%d", gpa, n, addr(gb), len(gb), addr(wb), len(wb))
		}
	}
}

func TestCursorAllocs(t *testing.T) {
	tbl, err := NewTable([]*Region{fakeRegion(0x10000, 0x1000, 0), fakeRegion(0x20000, 0x1000, 0x10000)})
	if err != nil {
		t.Fatal(err)
	}
	var c Cursor
	if a := testing.AllocsPerRun(100, func() {
		c.Span(tbl, 0x10010, 8)
		c.Span(tbl, 0x20010, 8)
		c.Slice(tbl, 0x20020, 8)
	}); a != 0 {
		t.Fatalf("%v allocations per run", a)
	}
}
