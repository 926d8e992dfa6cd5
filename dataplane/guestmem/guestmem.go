// Package guestmem maps a frontend's guest memory regions and translates
// guest-physical and frontend-virtual addresses into host byte slices.
//
// Every translation is bounds- and overflow-checked: a guest or frontend
// address that is not wholly inside one mapped region yields no memory. A
// Table is immutable; changing the memory layout builds a new Table, and the
// owner (dataplane/netdev) swaps it in only while no worker touches guest
// memory, then unmaps what the new table no longer uses.
//
// Guest memory is shared with a process we do not trust: it can change under
// us at any time (so values are read once, by the callers), and a frontend
// could even shrink a non-sealed file so that an access faults with SIGBUS.
// Goroutines that touch guest memory run with debug.SetPanicOnFault so such a
// fault becomes a recoverable panic confined to one queue.
package guestmem

import (
	"errors"
	"fmt"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Region is one mapped guest memory region.
type Region struct {
	GPA  uint64 // guest physical address of the first byte
	UVA  uint64 // frontend user virtual address of the first byte
	Size uint64

	mapping []byte // whole mmap, from file offset 0
	data    []byte // mapping[mmapOffset : mmapOffset+Size]
	// fd is Map's own duplicate of the region's file and offset its
	// mmap_offset: a successor process maps the region from them
	// (dataplane/handoff); closed by Unmap.
	fd     int
	offset uint64
	// adds counts ADD_MEM_REG messages for this very region: QEMU before
	// 8.1 sends one per queue pair (one vhost_dev each) and a REM_MEM_REG
	// per pair too, so a region lives until its last REM. Only the owner
	// of the table (netdev, under its lock) touches it.
	adds int
	// seals are the file's seals when it was mapped (seals are never
	// removed, so a seal seen then holds for the mapping's life)
	seals Seals
}

// maxRegionBytes caps one mapping. No guest has 16 TiB of RAM per region;
// the cap keeps hostile sizes from reaching mmap at all.
const maxRegionBytes = 1 << 44

// ErrOutOfBounds is returned when an address range is not inside guest
// memory.
var ErrOutOfBounds = errors.New("guest address range outside mapped memory")

// ErrShortFile: a region's or log's file is shorter than what it is to be
// mapped from (a frontend sent too large a size, or took memory back).
var ErrShortFile = errors.New("the file does not back the whole mapping")

// Map maps size bytes of fd at mmapOffset as the region that the frontend
// sees at gpa (guest physical) and uva (its own virtual address). Map does
// not close fd; the caller does once Map returns (the region keeps a
// duplicate of its own, see File).
func Map(fd int, gpa, size, uva, mmapOffset uint64) (*Region, error) {
	switch {
	case size == 0:
		return nil, fmt.Errorf("region at gpa %#x: size is 0", gpa)
	case size > maxRegionBytes:
		return nil, fmt.Errorf("region at gpa %#x: size %#x exceeds %#x", gpa, size, uint64(maxRegionBytes))
	case gpa+size < gpa, uva+size < uva, mmapOffset+size < mmapOffset:
		return nil, fmt.Errorf("region at gpa %#x: address + size %#x overflows", gpa, size)
	case mmapOffset > maxRegionBytes:
		return nil, fmt.Errorf("region at gpa %#x: mmap_offset %#x exceeds %#x", gpa, mmapOffset, uint64(maxRegionBytes))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("region at gpa %#x: fstat: %w", gpa, err)
	}
	// Touching a page past the end of the file raises SIGBUS, so refuse a
	// region that the file does not back when we map it.
	end := mmapOffset + size
	if st.Size < 0 || uint64(st.Size) < end {
		return nil, fmt.Errorf("region at gpa %#x: %w: file has %d bytes, region needs %d (offset %#x + size %#x)", gpa, ErrShortFile, st.Size, end, mmapOffset, size)
	}
	// hugetlbfs wants lengths in whole huge pages (its st_blksize).
	length := end
	if bs := uint64(st.Blksize); bs > 0 && bs&(bs-1) == 0 {
		length = (end + bs - 1) &^ (bs - 1)
		if length > uint64(st.Size) {
			length = end
		}
	}
	m, err := unix.Mmap(fd, 0, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("region at gpa %#x: mmap %d bytes: %w", gpa, length, err)
	}
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Munmap(m)
		return nil, fmt.Errorf("region at gpa %#x: dup: %w", gpa, err)
	}
	return &Region{GPA: gpa, UVA: uva, Size: size, mapping: m, data: m[mmapOffset:end:end], fd: own, offset: mmapOffset, seals: SealsOf(own)}, nil
}

// Seals are the region's file's seals: whether the frontend can shrink
// it (take the memory back).
func (r *Region) Seals() Seals { return r.seals }

// File returns the region's file (the region keeps owning it) and the
// offset in it where the region starts.
func (r *Region) File() (fd int, mmapOffset uint64) { return r.fd, r.offset }

// Adds is how many ADD_MEM_REG messages for this region still await their
// REM_MEM_REG.
func (r *Region) Adds() int { return r.adds }

// Unmap releases the mapping. The region must no longer be reachable from a
// table in use.
func (r *Region) Unmap() error {
	if r.mapping == nil {
		return nil
	}
	err := unix.Munmap(r.mapping)
	unix.Close(r.fd)
	r.mapping, r.data, r.fd = nil, nil, -1
	return err
}

// Bytes returns the whole region's memory.
func (r *Region) Bytes() []byte { return r.data }

// Table is an immutable set of non-overlapping regions.
type Table struct {
	regions []*Region // sorted by GPA
}

// MaxRegions bounds a table: GET_MAX_MEM_SLOTS answers this, the same
// number rust-vmm and QEMU use for virtio-mem.
const MaxRegions = 509

// NewTable builds a table, refusing overlapping regions in either address
// space.
func NewTable(regions []*Region) (*Table, error) {
	if len(regions) > MaxRegions {
		return nil, fmt.Errorf("%d regions exceed the limit of %d", len(regions), MaxRegions)
	}
	rs := append([]*Region(nil), regions...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].GPA < rs[j].GPA })
	for i := 1; i < len(rs); i++ {
		if rs[i].GPA < rs[i-1].GPA+rs[i-1].Size {
			return nil, fmt.Errorf("region gpa %#x overlaps region gpa %#x size %#x", rs[i].GPA, rs[i-1].GPA, rs[i-1].Size)
		}
	}
	byUVA := append([]*Region(nil), rs...)
	sort.Slice(byUVA, func(i, j int) bool { return byUVA[i].UVA < byUVA[j].UVA })
	for i := 1; i < len(byUVA); i++ {
		if byUVA[i].UVA < byUVA[i-1].UVA+byUVA[i-1].Size {
			return nil, fmt.Errorf("region uva %#x overlaps region uva %#x size %#x", byUVA[i].UVA, byUVA[i-1].UVA, byUVA[i-1].Size)
		}
	}
	return &Table{regions: rs}, nil
}

// Regions returns the regions, sorted by GPA. Callers must not modify it.
func (t *Table) Regions() []*Region {
	if t == nil {
		return nil
	}
	return t.regions
}

// Len returns the number of regions.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.regions)
}

// Unmap unmaps every region of the table.
func (t *Table) Unmap() {
	if t == nil {
		return
	}
	for _, r := range t.regions {
		r.Unmap()
	}
}

// regionGPA returns the region holding gpa.
func (t *Table) regionGPA(gpa uint64) *Region {
	rs := t.regions
	if len(rs) <= 8 {
		for _, r := range rs {
			if gpa-r.GPA < r.Size && gpa >= r.GPA {
				return r
			}
		}
		return nil
	}
	i := sort.Search(len(rs), func(i int) bool { return rs[i].GPA+rs[i].Size > gpa })
	if i < len(rs) && gpa >= rs[i].GPA {
		return rs[i]
	}
	return nil
}

// GPAOf returns the guest physical address of b's first byte, which must
// be memory of one of t's regions (a buffer a translation returned).
func (t *Table) GPAOf(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	for _, r := range t.Regions() {
		if len(r.data) == 0 {
			continue
		}
		base := uintptr(unsafe.Pointer(unsafe.SliceData(r.data)))
		if p >= base && p-base < uintptr(len(r.data)) {
			return r.GPA + uint64(p-base), true
		}
	}
	return 0, false
}

// Region returns the region holding gpa, or nil.
func (t *Table) Region(gpa uint64) *Region {
	if t == nil {
		return nil
	}
	return t.regionGPA(gpa)
}

// Slice returns the n bytes at guest physical address gpa if they lie in one
// region. It never allocates.
func (t *Table) Slice(gpa, n uint64) ([]byte, error) {
	if t == nil {
		return nil, ErrOutOfBounds
	}
	return sliceIn(t.regionGPA(gpa), gpa, n)
}

// Span returns the longest host-contiguous prefix, at most n bytes, of the
// guest range starting at gpa: a buffer that is contiguous in guest physical
// memory may cross into an adjacent region mapped elsewhere. It returns nil
// when gpa is not mapped.
func (t *Table) Span(gpa, n uint64) []byte {
	if t == nil {
		return nil
	}
	return spanIn(t.regionGPA(gpa), gpa, n)
}

// sliceIn returns the n bytes at gpa from r, which holds gpa (or is nil).
func sliceIn(r *Region, gpa, n uint64) ([]byte, error) {
	if r == nil {
		return nil, ErrOutOfBounds
	}
	off := gpa - r.GPA
	if n > r.Size-off {
		return nil, ErrOutOfBounds
	}
	return r.data[off : off+n : off+n], nil
}

// spanIn returns at most n bytes at gpa from r, which holds gpa (or is nil).
func spanIn(r *Region, gpa, n uint64) []byte {
	if r == nil {
		return nil
	}
	off := gpa - r.GPA
	if n > r.Size-off {
		n = r.Size - off
	}
	return r.data[off : off+n : off+n]
}

// Cursor remembers the region of its last translation: a guest's buffers
// and descriptor tables mostly sit in one region, so consecutive
// translations skip the region search. A hit is checked exactly like a
// search result (gpa inside the region, the length within it). The cursor
// is keyed by the table it was filled from, so a translation in another
// table never sees a region of an old one. It is not safe for concurrent
// use: its owner (one vring's queue) serialises access under its lock, the
// same lock held when a table is swapped.
type Cursor struct {
	t *Table
	r *Region
}

// hit reports whether the remembered region of t holds gpa.
func (c *Cursor) hit(t *Table, gpa uint64) bool {
	r := c.r
	return c.t == t && r != nil && gpa >= r.GPA && gpa-r.GPA < r.Size
}

// search looks gpa up in t and remembers the region found.
func (c *Cursor) search(t *Table, gpa uint64) *Region {
	if t == nil {
		return nil
	}
	r := t.regionGPA(gpa)
	if r != nil {
		c.t, c.r = t, r
	}
	return r
}

// Slice is t.Slice(gpa, n) through the cursor.
func (c *Cursor) Slice(t *Table, gpa, n uint64) ([]byte, error) {
	r := c.r
	if !c.hit(t, gpa) {
		r = c.search(t, gpa)
	}
	return sliceIn(r, gpa, n)
}

// Span is t.Span(gpa, n) through the cursor.
func (c *Cursor) Span(t *Table, gpa, n uint64) []byte {
	r := c.r
	if !c.hit(t, gpa) {
		r = c.search(t, gpa)
	}
	return spanIn(r, gpa, n)
}

// SliceUVA translates a frontend virtual address range, used for ring
// addresses (SET_VRING_ADDR carries frontend virtual addresses).
func (t *Table) SliceUVA(uva, n uint64) ([]byte, error) {
	if t == nil {
		return nil, ErrOutOfBounds
	}
	for _, r := range t.regions {
		if uva >= r.UVA && uva-r.UVA < r.Size {
			off := uva - r.UVA
			if n > r.Size-off {
				return nil, ErrOutOfBounds
			}
			return r.data[off : off+n : off+n], nil
		}
	}
	return nil, ErrOutOfBounds
}

// Find returns the region with exactly this GPA, size and UVA.
func (t *Table) Find(gpa, size, uva uint64) *Region {
	for _, r := range t.Regions() {
		if r.GPA == gpa && r.Size == size && r.UVA == uva {
			return r
		}
	}
	return nil
}

// With returns a new table holding t's regions plus r.
func (t *Table) With(r *Region) (*Table, error) {
	r.adds = 1
	return NewTable(append(append([]*Region(nil), t.Regions()...), r))
}

// AddAgain records one more ADD_MEM_REG of a region already in the table.
func (r *Region) AddAgain() { r.adds++ }

// Release records one REM_MEM_REG and reports whether it was the last.
func (r *Region) Release() (last bool) {
	r.adds--
	return r.adds <= 0
}

// Without returns a new table without the region that matches gpa, size
// and uva exactly, and that region (to unmap once the new table is live).
func (t *Table) Without(gpa, size, uva uint64) (*Table, *Region, error) {
	var keep []*Region
	var gone *Region
	for _, r := range t.Regions() {
		if gone == nil && r.GPA == gpa && r.Size == size && r.UVA == uva {
			gone = r
			continue
		}
		keep = append(keep, r)
	}
	if gone == nil {
		return nil, nil, fmt.Errorf("no region at gpa %#x size %#x uva %#x", gpa, size, uva)
	}
	nt, err := NewTable(keep)
	return nt, gone, err
}
