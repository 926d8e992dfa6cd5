package guestmem

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Log is a frontend's dirty-page log for live migration (vhost-user
// SET_LOG_BASE with LOG_SHMFD): one bit per 4 KiB page of guest physical
// memory, bit (gpa/4096)%8 of byte (gpa/4096)/8, which the device sets
// after it wrote into that page while VHOST_F_LOG_ALL is negotiated. QEMU
// reads and clears the bits concurrently, so every update is an atomic OR
// of a whole 64-bit word (64 pages); Cache batches them per burst.
type Log struct {
	mapping []byte
	words   []uint64 // the log, as 64-page words
	// fd and offset: MapLog's duplicate of the log's file and where the
	// log starts in it, for a successor process (closed by Unmap)
	fd     int
	offset uint64
	seals  Seals // the file's seals when mapped
}

// PageShift is the log's page size, 4 KiB (VHOST_LOG_PAGE).
const PageShift = 12

// maxLogBytes caps a log: enough for 16 TiB of guest memory (maxRegionBytes).
const maxLogBytes = maxRegionBytes >> PageShift >> 3

// MapLog maps the log of size bytes at offset in fd (the SET_LOG_BASE
// payload). The words are updated atomically, so the log must start on an
// 8-byte boundary (QEMU's is a whole memfd at offset 0).
func MapLog(fd int, size, offset uint64) (*Log, error) {
	switch {
	case size == 0:
		return nil, fmt.Errorf("log: mmap_size is 0")
	case size > maxLogBytes:
		return nil, fmt.Errorf("log: mmap_size %#x exceeds %#x (16 TiB of guest memory)", size, uint64(maxLogBytes))
	case offset > maxLogBytes || offset+size < offset:
		return nil, fmt.Errorf("log: mmap_offset %#x + mmap_size %#x overflows", offset, size)
	case size%8 != 0:
		return nil, fmt.Errorf("log: mmap_size %#x is not a whole number of 64-page words (8 bytes)", size)
	case offset%8 != 0:
		return nil, fmt.Errorf("log: mmap_offset %#x is not 8-byte aligned", offset)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("log: fstat: %w", err)
	}
	end := offset + size
	if st.Size < 0 || uint64(st.Size) < end {
		return nil, fmt.Errorf("log: %w: file has %d bytes, the log needs %d (mmap_offset %#x + mmap_size %#x)", ErrShortFile, st.Size, end, offset, size)
	}
	m, err := unix.Mmap(fd, 0, int(end), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("log: mmap %d bytes: %w", end, err)
	}
	own, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Munmap(m)
		return nil, fmt.Errorf("log: dup: %w", err)
	}
	b := m[offset:end]
	return &Log{mapping: m, words: unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), size/8), fd: own, offset: offset, seals: SealsOf(own)}, nil
}

// Seals are the log file's seals.
func (l *Log) Seals() Seals { return l.seals }

// File returns the log's file (the log keeps owning it), and its size and
// offset there, as SET_LOG_BASE gave them.
func (l *Log) File() (fd int, size, offset uint64) { return l.fd, uint64(len(l.words)) * 8, l.offset }

// Unmap releases the log. No queue may use it any more.
func (l *Log) Unmap() error {
	if l == nil || l.mapping == nil {
		return nil
	}
	err := unix.Munmap(l.mapping)
	unix.Close(l.fd)
	l.mapping, l.words, l.fd = nil, nil, -1
	return err
}

// Pages reports how many pages the log covers.
func (l *Log) Pages() uint64 { return uint64(len(l.words)) * 64 }

// or sets bits in word i (< len(l.words): LogCache.Mark clamps).
func (l *Log) or(i, bits uint64) { atomic.OrUint64(&l.words[i], bits) }

// LogCache gathers a burst's dirty pages as 64-page words, so that a
// burst costs one atomic OR per word it touched (DPDK's vhost log cache
// does the same); it is flushed before the burst's used index is
// published, and whenever it is full. Not safe for concurrent use: one per
// queue, under its vring's lock.
type LogCache struct {
	log   *Log
	n     int
	words [logCacheSize]uint64 // word index
	bits  [logCacheSize]uint64
}

const logCacheSize = 32

// NewLogCache returns an empty cache for l.
func NewLogCache(l *Log) LogCache { return LogCache{log: l} }

// Mark records that [gpa, gpa+n) was written (n > 0).
func (c *LogCache) Mark(gpa, n uint64) {
	first, last := gpa>>PageShift, (gpa+n-1)>>PageShift
	if gpa+n-1 < gpa { // wraps: up to the end of the address space
		last = ^uint64(0) >> PageShift
	}
	// Pages past the log's end cannot hold guest memory the frontend
	// mapped; they are not marked (nor looped over).
	pages := c.log.Pages()
	if first >= pages {
		return
	}
	last = min(last, pages-1)
	for p := first; ; {
		w := p / 64
		hi := min(last, w*64+63) // the pages of [p, last] in word w
		c.add(w, ^uint64(0)>>(63-(hi-p))<<(p%64))
		if hi == last {
			return
		}
		p = hi + 1
	}
}

func (c *LogCache) add(w, bits uint64) {
	for i := range c.n {
		if c.words[i] == w {
			c.bits[i] |= bits
			return
		}
	}
	if c.n == logCacheSize {
		c.Flush()
	}
	c.words[c.n], c.bits[c.n] = w, bits
	c.n++
}

// Flush ORs the gathered words into the log and empties the cache.
func (c *LogCache) Flush() {
	for i := range c.n {
		c.log.or(c.words[i], c.bits[i])
	}
	c.n = 0
}
