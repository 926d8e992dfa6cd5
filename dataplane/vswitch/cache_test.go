package vswitch

import "testing"

// TestCacheFollowsTheTable: a cached answer, found or not, lasts until the
// table changes: a learn of a new address, a move, a forget and an age
// each make the next Sync drop it; a refresh does not.
func TestCacheFollowsTheTable(t *testing.T) {
	tab := NewTable[int](0)
	var c Cache[int]
	x := MAC{0x02, 0, 0, 0, 0, 7}
	kx := key(x)
	lookup := func() (int, bool) {
		c.Sync(tab)
		return c.Lookup(tab, kx)
	}
	if _, ok := lookup(); ok {
		t.Fatal("found an address never learned")
	}
	steps := []struct {
		name   string
		change func()
		port   int
		found  bool
	}{
		{"learned", func() { tab.Learn(x, 1, 1) }, 1, true},
		{"moved", func() { tab.Learn(x, 2, 2) }, 2, true},
		{"forgotten", func() { tab.Forget(2) }, 0, false},
		{"learned again", func() { tab.Learn(x, 3, 10) }, 3, true},
		{"aged", func() { tab.Age(100, 5) }, 0, false},
	}
	for _, s := range steps {
		s.change()
		if p, ok := lookup(); p != s.port || ok != s.found {
			t.Fatalf("after the address was %s: %d, %v; want %d, %v", s.name, p, ok, s.port, s.found)
		}
	}
	// A refresh and a new address leave the generation (and so the
	// cache) alone: a flood of new source addresses keeps caches warm.
	tab.Learn(x, 4, 200)
	g := tab.Gen()
	tab.Learn(x, 4, 5e9)
	for i := range 1000 {
		tab.Learn(MAC{0x02, 0xee, 0, 0, byte(i >> 8), byte(i)}, 9, 5e9)
	}
	if tab.Gen() != g {
		t.Fatal("a refresh or a new address changed the table's generation")
	}
	// Without a Sync the cached answer stays (at most one burst stale).
	if p, ok := lookup(); p != 4 || !ok {
		t.Fatalf("after learning again: %d, %v", p, ok)
	}
	tab.Forget(4)
	if p, ok := c.Lookup(tab, kx); p != 4 || !ok {
		t.Fatalf("cache between Syncs: %d, %v; want the cached 4, true", p, ok)
	}
	if _, ok := lookup(); ok {
		t.Fatal("after Sync the forgotten address is still found")
	}
}

// TestCacheCollisions: addresses that share a slot evict each other and
// each still gets its own answer.
func TestCacheCollisions(t *testing.T) {
	tab := NewTable[int](0)
	var c Cache[int]
	for i := range 1000 {
		m := MAC{0x02, byte(i >> 16), 0, byte(i >> 8), byte(i), 1}
		if i%3 == 0 {
			tab.Learn(m, i, 1)
		}
	}
	c.Sync(tab)
	for round := range 2 {
		for i := range 1000 {
			m := MAC{0x02, byte(i >> 16), 0, byte(i >> 8), byte(i), 1}
			p, ok := c.Lookup(tab, key(m))
			if ok != (i%3 == 0) || (ok && p != i) {
				t.Fatalf("round %d, address %d: %d, %v", round, i, p, ok)
			}
		}
	}
}

func TestKey(t *testing.T) {
	m := MAC{0x01, 0x23, 0x45, 0x67, 0x89, 0xab}
	if Key(m[:]) != key(m) || MACOf(Key(m[:])) != m || !KeyIsMulticast(Key(m[:])) {
		t.Fatalf("Key(%v) = %#x, key = %#x", m, Key(m[:]), key(m))
	}
	if KeyIsMulticast(Key([]byte{0x02, 0, 0, 0, 0, 1})) {
		t.Fatal("a unicast address reads as multicast")
	}
}
