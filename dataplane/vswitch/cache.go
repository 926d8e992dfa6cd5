package vswitch

// Cache is a small direct-mapped cache of a Table's lookups for one
// worker's queue: a frame's destination costs a compare instead of a
// table probe. It holds addresses found only: an address the table gains
// needs no invalidation, so a flood of new source addresses (a LAN behind
// the uplink, a guest spraying) leaves every pair's cache warm, and
// unknown destinations, which flood anyway, ask the table each time. It
// is valid for one generation of the table (which moves when an address
// moves or goes); Sync, called once per burst, empties it when the table
// changed. A lookup made while the table changes may cache the new
// answer under the old generation; the next Sync drops it, so an answer
// is at most one burst stale, as a table lookup racing a change would
// be. Not safe for concurrent use.
type Cache[P comparable] struct {
	gen  uint64
	keys [cacheSize]uint64 // key(mac) | cacheValid; 0: empty
	vals [cacheSize]P
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
		return c.vals[i], true
	}
	return c.miss(t, k, i)
}

// miss is kept out of Lookup so that Lookup inlines.
//
//go:noinline
func (c *Cache[P]) miss(t *Table[P], k, i uint64) (P, bool) {
	p, ok := t.lookupKey(k)
	if ok {
		c.keys[i], c.vals[i] = k|cacheValid, p
	}
	return p, ok
}
