package vswitch

// Cache is a small direct-mapped cache of a Table's lookups, negative
// results included, for one worker's queue: a frame's destination costs a
// compare instead of a map lookup. It is valid for one generation of the
// table; Sync, called once per burst, empties it when the table changed.
// A lookup made while the table changes may cache the new answer under
// the old generation; the next Sync drops it, so an answer is at most one
// burst stale, as a map lookup racing a change would be. Not safe for
// concurrent use.
type Cache[P comparable] struct {
	gen  uint64
	keys [cacheSize]uint64 // key(mac) | cacheValid; 0: empty
	vals [cacheSize]cached[P]
}

type cached[P comparable] struct {
	port  P
	found bool
}

const (
	cacheSize  = 64
	cacheValid = 1 << 63
)

// Sync empties c if t changed since c was filled.
func (c *Cache[P]) Sync(t *Table[P]) {
	if g := t.Gen(); g != c.gen {
		c.keys = [cacheSize]uint64{}
		c.gen = g
	}
}

// Lookup is t.Lookup for the address whose Key is k, through the cache.
// The hit decides inline; a miss asks the table.
func (c *Cache[P]) Lookup(t *Table[P], k uint64) (P, bool) {
	i := (k ^ k>>6 ^ k>>12) & (cacheSize - 1)
	if c.keys[i] == k|cacheValid {
		return c.vals[i].port, c.vals[i].found
	}
	return c.miss(t, k, i)
}

// miss is kept out of Lookup so that Lookup inlines.
//
//go:noinline
func (c *Cache[P]) miss(t *Table[P], k, i uint64) (P, bool) {
	p, ok := t.lookupKey(k)
	c.keys[i], c.vals[i] = k|cacheValid, cached[P]{port: p, found: ok}
	return p, ok
}
