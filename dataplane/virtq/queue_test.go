package virtq

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

func TestNewQueueSize(t *testing.T) {
	m := newTestMem(t, regionSpec{gpa: 0, size: 1 << 20})
	rings := func(size int) (desc, avail, used []byte) {
		return m.bytes(t, 0, uint64(virtio.DescSize*size)),
			m.bytes(t, 0x80000, uint64(virtio.AvailRingSize(size))),
			m.bytes(t, 0xa0000, uint64(virtio.UsedRingSize(size)))
	}
	for _, size := range []int{1, 2, 256, 4096, 32768} {
		d, a, u := rings(size)
		q, err := New(m.tbl, size, d, a, u, 0, Features{})
		if err != nil {
			t.Errorf("size %d: %v", size, err)
			continue
		}
		if q.Size() != size {
			t.Errorf("Size() = %d, want %d", q.Size(), size)
		}
	}
	for _, size := range []int{-1, 0, 3, 6, 1000, 32767, 65536} {
		d, a, u := rings(max(size, 1) % 32768)
		if _, err := New(m.tbl, size, d, a, u, 0, Features{}); !errors.Is(err, errBadQueueSize) {
			t.Errorf("size %d: err %v, want errBadQueueSize", size, err)
		}
	}
}

func TestNewRingLengths(t *testing.T) {
	m := newStdMem(t)
	const size = 16
	desc := m.bytes(t, 0, virtio.DescSize*size)
	avail := m.bytes(t, stdAvailGPA, uint64(virtio.AvailRingSize(size)))
	used := m.bytes(t, stdUsedGPA, uint64(virtio.UsedRingSize(size)))
	cases := []struct {
		name              string
		desc, avail, used []byte
	}{
		{"short desc", desc[:len(desc)-1], avail, used},
		{"long desc", m.bytes(t, 0, virtio.DescSize*size+16), avail, used},
		{"short avail", desc, avail[:len(avail)-2], used},
		{"avail without used_event", desc, avail[:4+2*size], used},
		{"short used", desc, avail, used[:len(used)-2]},
		{"long used", desc, avail, m.bytes(t, stdUsedGPA, uint64(virtio.UsedRingSize(size)+8))},
		{"nil rings", nil, nil, nil},
	}
	for _, c := range cases {
		q, err := New(m.tbl, size, c.desc, c.avail, c.used, 0, Features{})
		if err == nil || q != nil {
			t.Errorf("%s: New succeeded", c.name)
		}
	}
}

func TestNewAlignment(t *testing.T) {
	m := newStdMem(t)
	const size = 8
	desc := m.bytes(t, 0, virtio.DescSize*size)
	availAt := func(gpa uint64) []byte { return m.bytes(t, gpa, uint64(virtio.AvailRingSize(size))) }
	usedAt := func(gpa uint64) []byte { return m.bytes(t, gpa, uint64(virtio.UsedRingSize(size))) }
	for _, c := range []struct {
		availGPA, usedGPA uint64
		ok                bool
	}{
		{stdAvailGPA, stdUsedGPA, true},
		{stdAvailGPA + 2, stdUsedGPA, true}, // avail.idx then sits in a 4-aligned word
		{stdAvailGPA + 6, stdUsedGPA + 4, true},
		{stdAvailGPA + 1, stdUsedGPA, false},
		{stdAvailGPA + 3, stdUsedGPA, false},
		{stdAvailGPA, stdUsedGPA + 2, false},
		{stdAvailGPA, stdUsedGPA + 1, false},
	} {
		_, err := New(m.tbl, size, desc, availAt(c.availGPA), usedAt(c.usedGPA), 0, Features{})
		if c.ok && err != nil {
			t.Errorf("avail %#x used %#x: %v", c.availGPA, c.usedGPA, err)
		}
		if !c.ok && !errors.Is(err, errMisalignedRings) {
			t.Errorf("avail %#x used %#x: err %v, want errMisalignedRings", c.availGPA, c.usedGPA, err)
		}
	}
}

// An available ring at 2 mod 4 makes avail.idx the low half of an aligned
// word (the other loadAcquire16 case); Pending must still see it.
func TestPendingAvailAt2Mod4(t *testing.T) {
	m := newStdMem(t)
	for _, off := range []uint64{0, 2} {
		d := newDriver(t, m, 8, stdDescGPA, stdAvailGPA+0x100+off, stdUsedGPA)
		q := d.queue(t, 0, Features{})
		d.setAvailRing(0, 0x1234) // ring[0] shares the word with idx when off is 2
		d.setAvailFlags(0xffff)   // flags share it when off is 0
		for _, idx := range []uint16{0, 1, 5, 8} {
			d.setAvailIdx(idx)
			if n, err := q.Pending(); err != nil || n != int(idx) {
				t.Errorf("avail at +%d, idx %d: Pending = %d, %v", off, idx, n, err)
			}
		}
	}
}

func TestNewLastAvailFollowsUsedIdx(t *testing.T) {
	m := newStdMem(t)
	d := newDriver(t, m, 16, stdDescGPA, stdAvailGPA, stdUsedGPA)
	for _, c := range []struct{ used, base, want uint16 }{
		{0, 0, 0},
		{5, 5, 5},
		{5, 9, 5},
		{5, 0, 5},
		{0xffff, 3, 0xffff},
	} {
		d.setUsedIdx(c.used)
		q := d.queue(t, c.base, Features{})
		if q.LastAvail() != c.want || q.UsedIdx() != c.used {
			t.Errorf("used.idx %d, base %d: LastAvail %d UsedIdx %d, want %d and %d",
				c.used, c.base, q.LastAvail(), q.UsedIdx(), c.want, c.used)
		}
	}
}

func TestPopPushPublish(t *testing.T) {
	_, d, q := newRing(t, 8, Features{})
	if n, err := q.Pending(); n != 0 || err != nil {
		t.Fatalf("empty ring: Pending = %d, %v", n, err)
	}
	d.add(3)
	d.add(5)
	if n, err := q.Pending(); n != 2 || err != nil {
		t.Fatalf("Pending = %d, %v, want 2", n, err)
	}
	for _, want := range []uint16{3, 5} {
		if h, err := q.Pop(); h != want || err != nil {
			t.Fatalf("Pop = %d, %v, want %d", h, err, want)
		}
	}
	if n, _ := q.Pending(); n != 0 || q.LastAvail() != 2 {
		t.Fatalf("after 2 pops: Pending %d LastAvail %d", n, q.LastAvail())
	}

	q.Push(3, 100)
	q.Push(5, 200)
	if d.usedIdx() != 0 {
		t.Fatalf("used.idx %d visible before Publish", d.usedIdx())
	}
	if q.UsedIdx() != 2 {
		t.Fatalf("UsedIdx() = %d, want 2", q.UsedIdx())
	}
	q.Publish()
	if d.usedIdx() != 2 || d.usedFlags() != 0 {
		t.Fatalf("after Publish: used.idx %d flags %#x", d.usedIdx(), d.usedFlags())
	}
	for i, want := range [][2]uint32{{3, 100}, {5, 200}} {
		if id, n := d.usedElem(i); id != want[0] || n != want[1] {
			t.Errorf("used[%d] = (%d, %d), want %v", i, id, n, want)
		}
	}

	// Unpop gives a head back; the next Pop takes it again.
	d.add(1)
	d.add(2)
	if h, _ := q.Pop(); h != 1 {
		t.Fatalf("Pop = %d, want 1", h)
	}
	if h, _ := q.Pop(); h != 2 {
		t.Fatalf("Pop = %d, want 2", h)
	}
	q.Unpop(2)
	if n, _ := q.Pending(); n != 2 {
		t.Fatalf("after Unpop(2): Pending %d", n)
	}
	if h, _ := q.Pop(); h != 1 {
		t.Fatalf("Pop after Unpop = %d, want 1", h)
	}

	// Unpush forgets an unpublished element; its slot is reused.
	q.Push(1, 7)
	q.Unpush(1)
	if q.UsedIdx() != 2 {
		t.Fatalf("after Unpush: UsedIdx %d", q.UsedIdx())
	}
	q.Publish()
	if d.usedIdx() != 2 {
		t.Fatalf("unpushed element published: used.idx %d", d.usedIdx())
	}
	q.Push(1, 9)
	q.Publish()
	if id, n := d.usedElem(2); id != 1 || n != 9 || d.usedIdx() != 3 {
		t.Fatalf("used[2] = (%d, %d), used.idx %d; want (1, 9), 3", id, n, d.usedIdx())
	}
}

func TestIndexWraparound(t *testing.T) {
	m := newStdMem(t)
	d := newDriver(t, m, 8, stdDescGPA, stdAvailGPA, stdUsedGPA)
	d.setUsedIdx(65534)
	d.setAvailIdx(65534)
	q := d.queue(t, 65534, Features{})
	heads := []uint16{7, 0, 4, 2}
	for _, h := range heads {
		d.add(h)
	}
	if d.availIdx != 2 {
		t.Fatalf("driver avail idx %d, want 2", d.availIdx)
	}
	if n, err := q.Pending(); n != 4 || err != nil {
		t.Fatalf("Pending = %d, %v, want 4", n, err)
	}
	for i, want := range heads {
		h, err := q.Pop()
		if h != want || err != nil {
			t.Fatalf("Pop %d = %d, %v, want %d", i, h, err, want)
		}
		q.Push(h, uint32(i))
	}
	q.Publish()
	if d.usedIdx() != 2 || q.LastAvail() != 2 {
		t.Fatalf("used.idx %d LastAvail %d, want 2 and 2", d.usedIdx(), q.LastAvail())
	}
	for i, slot := range []int{6, 7, 0, 1} {
		if id, n := d.usedElem(slot); id != uint32(heads[i]) || n != uint32(i) {
			t.Errorf("used slot %d = (%d, %d), want (%d, %d)", slot, id, n, heads[i], i)
		}
	}
}

func TestPendingAvailIdxJump(t *testing.T) {
	const size = 8
	m := newStdMem(t)
	d := newDriver(t, m, size, stdDescGPA, stdAvailGPA, stdUsedGPA)
	d.setUsedIdx(100)
	q := d.queue(t, 100, Features{})
	for _, c := range []struct {
		idx  uint16
		want int
		err  error
	}{
		{100, 0, nil},
		{100 + size, size, nil},
		{100 + size + 1, 0, ErrAvailIdx},
		{99, 0, ErrAvailIdx}, // moved backwards
		{100 + 0x8000, 0, ErrAvailIdx},
	} {
		d.setAvailIdx(c.idx)
		n, err := q.Pending()
		if n != c.want || !errors.Is(err, c.err) || (c.err == nil && err != nil) {
			t.Errorf("avail idx %d: Pending = %d, %v; want %d, %v", c.idx, n, err, c.want, c.err)
		}
	}
}

func TestPopHeadOutOfRange(t *testing.T) {
	const size = 8
	_, d, q := newRing(t, size, Features{})
	for _, bad := range []uint16{size, size + 1, 0xffff} {
		d.add(bad)
		if _, err := q.Pop(); !errors.Is(err, ErrHeadOutOfRange) {
			t.Errorf("head %d: err %v, want ErrHeadOutOfRange", bad, err)
		}
		if q.LastAvail() != d.availIdx-1 {
			t.Errorf("head %d: LastAvail advanced to %d", bad, q.LastAvail())
		}
		// Replace the bad entry so the next round starts from a clean ring.
		d.setAvailRing(int(d.availIdx-1)%size, size-1)
		if h, err := q.Pop(); h != size-1 || err != nil {
			t.Fatalf("Pop = %d, %v", h, err)
		}
	}
}

func TestNeedsCallFlags(t *testing.T) {
	_, d, q := newRing(t, 8, Features{})
	for _, c := range []struct {
		flags uint16
		want  bool
	}{
		{0, true},
		{virtio.AvailFNoInterrupt, false},
		{2, true},
		{0xfffe, true},
		{0xffff, false},
	} {
		d.setAvailFlags(c.flags)
		// used_event is only meaningful with EVENT_IDX: make it say "no".
		d.setUsedEvent(0x8000)
		q.Push(0, 1)
		q.Publish()
		if got := q.NeedsCall(); got != c.want {
			t.Errorf("avail.flags %#x: NeedsCall = %v, want %v", c.flags, got, c.want)
		}
	}
}

// wantEvent is the obviously correct reading of "interrupt when used idx
// passes used_event": some index in [old, new) equals event (mod 2^16).
func wantEvent(event, newIdx, old uint16) bool {
	for i := old; i != newIdx; i++ {
		if i == event {
			return true
		}
	}
	return false
}

func TestNeedsCallEventIdx(t *testing.T) {
	const size = 256
	m := newStdMem(t)
	d := newDriver(t, m, size, stdDescGPA, stdAvailGPA, stdUsedGPA)

	// setup returns a queue whose last interrupt decision was at used idx old.
	setup := func(old uint16) *Queue {
		d.setUsedIdx(old)
		d.setAvailIdx(old)
		q := d.queue(t, old, Features{EventIdx: true})
		d.setUsedEvent(old + 0x8000)
		d.setAvailFlags(virtio.AvailFNoInterrupt) // ignored with EVENT_IDX
		if !q.NeedsCall() {
			t.Fatalf("first decision after New must interrupt")
		}
		return q
	}
	check := func(old, n, event uint16) {
		t.Helper()
		q := setup(old)
		for range n {
			q.Push(0, 0)
		}
		q.Publish()
		d.setUsedEvent(event)
		want := wantEvent(event, old+n, old)
		if got := q.NeedsCall(); got != want {
			t.Errorf("old %d new %d used_event %d: NeedsCall = %v, want %v", old, old+n, event, got, want)
		}
		// Nothing new since that decision: never interrupt again.
		if q.NeedsCall() {
			t.Errorf("old %d new %d used_event %d: second NeedsCall without new elements interrupts", old, old+n, event)
		}
	}
	for _, c := range []struct{ old, n, event uint16 }{
		{0, 1, 0},
		{0, 1, 1},
		{0, 0, 0},
		{10, 5, 14},
		{10, 5, 15},
		{10, 5, 9},
		{65534, 4, 65535},
		{65534, 4, 1},
		{65534, 4, 2},
		{65534, 4, 65533},
		{65535, 1, 65535},
		{65535, 1, 0},
		{65535, 256, 254},
		{65535, 256, 255},
	} {
		check(c.old, c.n, c.event)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		old := uint16(rng.Uint32())
		n := uint16(rng.IntN(size + 1))
		event := old + uint16(rng.IntN(2*size)) - size/2
		if rng.IntN(8) == 0 {
			event = uint16(rng.Uint32())
		}
		check(old, n, event)
	}
}

// Several decisions in a row: each one covers only the elements published
// since the previous one.
func TestNeedsCallEventIdxSequence(t *testing.T) {
	_, d, q := newRing(t, 16, Features{EventIdx: true})
	q.NeedsCall()
	steps := []struct {
		push  int
		event uint16
		want  bool
	}{
		{2, 0, true},  // event 0 in [0, 2)
		{2, 1, false}, // event 1 in [2, 4)? no
		{1, 4, true},  // [4, 5)
		{3, 4, false}, // [5, 8)
		{1, 8, true},  // [8, 9)
		{0, 9, false}, // nothing new
		{1, 9, true},  // [9, 10)
	}
	for i, s := range steps {
		for range s.push {
			q.Push(0, 0)
		}
		q.Publish()
		d.setUsedEvent(s.event)
		if got := q.NeedsCall(); got != s.want {
			t.Errorf("step %d: NeedsCall = %v, want %v (used idx %d)", i, got, s.want, q.UsedIdx())
		}
	}
}

func TestSetNotifyFlags(t *testing.T) {
	_, d, q := newRing(t, 8, Features{})
	if more := q.SetNotify(false); more {
		t.Errorf("SetNotify(false) = true")
	}
	if d.usedFlags()&virtio.UsedFNoNotify == 0 {
		t.Fatalf("used.flags %#x: NO_NOTIFY not set", d.usedFlags())
	}
	// Publishing keeps the flag.
	d.add(0)
	h, _ := q.Pop()
	q.Push(h, 1)
	q.Publish()
	if d.usedFlags() != virtio.UsedFNoNotify || d.usedIdx() != 1 {
		t.Fatalf("after Publish: used.flags %#x used.idx %d", d.usedFlags(), d.usedIdx())
	}
	if more := q.SetNotify(true); more {
		t.Errorf("SetNotify(true) on an empty ring = true")
	}
	if d.usedFlags() != 0 || d.usedIdx() != 1 {
		t.Fatalf("after enable: used.flags %#x used.idx %d", d.usedFlags(), d.usedIdx())
	}
	// Work that arrives while kicks are off is reported when enabling.
	q.SetNotify(false)
	d.add(1)
	if more := q.SetNotify(true); !more {
		t.Errorf("SetNotify(true) with a pending chain = false")
	}
	// So is a broken ring: the caller must look at it.
	q.SetNotify(false)
	d.setAvailIdx(d.availIdx + 100)
	if more := q.SetNotify(true); !more {
		t.Errorf("SetNotify(true) with a broken avail idx = false")
	}
	// No avail_event is written without EVENT_IDX.
	if d.availEvent() != 0 {
		t.Errorf("avail_event written without EVENT_IDX: %d", d.availEvent())
	}
}

func TestSetNotifyEventIdx(t *testing.T) {
	_, d, q := newRing(t, 8, Features{EventIdx: true})
	d.setAvailEvent(0xabcd)
	if more := q.SetNotify(false); more {
		t.Errorf("SetNotify(false) = true")
	}
	if d.availEvent() != 0xabcd || d.usedFlags() != 0 {
		t.Errorf("disable touched the ring: avail_event %#x used.flags %#x", d.availEvent(), d.usedFlags())
	}
	d.add(4)
	d.add(5)
	if more := q.SetNotify(true); !more {
		t.Errorf("SetNotify(true) with 2 pending = false")
	}
	if d.availEvent() != 0 {
		t.Errorf("avail_event = %d, want lastAvail 0", d.availEvent())
	}
	q.Pop()
	q.Pop()
	if more := q.SetNotify(true); more {
		t.Errorf("SetNotify(true) on a drained ring = true")
	}
	if d.availEvent() != 2 {
		t.Errorf("avail_event = %d, want lastAvail 2", d.availEvent())
	}
	if d.usedFlags() != 0 {
		t.Errorf("used.flags = %#x with EVENT_IDX, want 0", d.usedFlags())
	}
}
