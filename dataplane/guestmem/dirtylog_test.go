package guestmem

import "testing"

// pagesSet lists the set bits of the log.
func pagesSet(l *Log) []uint64 {
	var out []uint64
	for i, w := range l.words {
		for b := range 64 {
			if w&(1<<b) != 0 {
				out = append(out, uint64(i)*64+uint64(b))
			}
		}
	}
	return out
}

func TestLogMarksExactlyTheWrittenPages(t *testing.T) {
	l, err := MapLog(memfd(t, 4096), 64, 0) // 512 pages: 2 MiB of guest memory
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unmap()
	c := NewLogCache(l)
	c.Mark(0x1000, 1)         // page 1
	c.Mark(0x2fff, 2)         // pages 2 and 3
	c.Mark(63<<12, 2<<12)     // pages 63, 64 (across a word)
	c.Mark(100<<12+5, 4096*3) // pages 100..103
	c.Mark(511<<12, 1<<30)    // page 511, the rest is past the log
	c.Mark(1<<40, 4096)       // past the log: nothing
	c.Mark(^uint64(0)-10, 20) // wraps: nothing in the log
	if got := pagesSet(l); len(got) != 0 {
		t.Fatalf("pages marked before Flush: %v", got)
	}
	c.Flush()
	want := []uint64{1, 2, 3, 63, 64, 100, 101, 102, 103, 511}
	got := pagesSet(l)
	if len(got) != len(want) {
		t.Fatalf("marked %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("marked %v, want %v", got, want)
		}
	}
	// A bit QEMU cleared meanwhile is set again by the next write, others
	// QEMU set stay (OR, not store).
	l.words[0] = 1 << 40
	c.Mark(0x1000, 1)
	c.Flush()
	if l.words[0] != 1<<40|1<<1 {
		t.Fatalf("word 0 = %#x", l.words[0])
	}
}

// TestLogCacheFlushesWhenFull: more words than the cache holds lose none.
func TestLogCacheFlushesWhenFull(t *testing.T) {
	l, err := MapLog(memfd(t, 8192), 8192, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unmap()
	c := NewLogCache(l)
	for i := range uint64(100) {
		c.Mark(i*64<<12, 1) // the first page of 100 different words
	}
	c.Flush()
	if got := pagesSet(l); len(got) != 100 {
		t.Fatalf("%d pages marked, want 100", len(got))
	}
}

func TestMapLogRefuses(t *testing.T) {
	fd := memfd(t, 4096)
	for _, c := range []struct {
		name         string
		size, offset uint64
	}{
		{"empty", 0, 0},
		{"past the file", 4096, 8},
		{"larger than the file", 8192, 0},
		{"offset overflows", 8, ^uint64(0) - 3},
		{"misaligned", 64, 4},
		{"huge", 1 << 40, 0},
	} {
		if l, err := MapLog(fd, c.size, c.offset); err == nil {
			l.Unmap()
			t.Errorf("%s: mapped", c.name)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}
