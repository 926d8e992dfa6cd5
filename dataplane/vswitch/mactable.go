// Package vswitch holds the L2 switching decisions: a learning MAC table
// with aging and the flow hash that keeps a flow on one queue. It is pure
// logic over frame headers; moving bytes is the dataplane's job.
package vswitch

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
)

// MAC is an Ethernet address.
type MAC [6]byte

// IsMulticast reports whether m is a group address (broadcast included).
func (m MAC) IsMulticast() bool { return m[0]&1 != 0 }

// IsZero reports whether m is all zeros (never a valid source).
func (m MAC) IsZero() bool { return m == MAC{} }

// key packs a MAC into the table's map key: a uint64 key takes the map's
// 64-bit fast path (a [6]byte key is hashed byte-wise, about a third of
// the cost of switching a frame).
func key(m MAC) uint64 {
	return uint64(m[0])<<40 | uint64(m[1])<<32 | uint64(m[2])<<24 | uint64(m[3])<<16 | uint64(m[4])<<8 | uint64(m[5])
}

func macOf(k uint64) MAC {
	return MAC{byte(k >> 40), byte(k >> 32), byte(k >> 24), byte(k >> 16), byte(k >> 8), byte(k)}
}

type entry[P comparable] struct {
	port     P
	lastSeen atomic.Int64 // unix nanoseconds
}

// Table is a learning MAC table shared by every worker. Lookups are
// lock-free (a copy-on-write map behind an atomic pointer); learning a new
// address or a move copies the map, which is rare, and is bounded by a
// per-port limit so that a guest spraying source addresses cannot make it
// expensive.
type Table[P comparable] struct {
	m           atomic.Pointer[map[uint64]*entry[P]]
	gen         atomic.Uint64 // moves after every change of m: Cache validates against it
	mu          sync.Mutex    // serialises writers
	perPort     map[P]int
	maxPerPort  int
	refreshNano int64
}

// DefaultMaxPerPort bounds how many addresses one port may own.
const DefaultMaxPerPort = 256

// NewTable returns an empty table.
func NewTable[P comparable](maxPerPort int) *Table[P] {
	if maxPerPort <= 0 {
		maxPerPort = DefaultMaxPerPort
	}
	t := &Table[P]{perPort: map[P]int{}, maxPerPort: maxPerPort, refreshNano: 1e9}
	m := map[uint64]*entry[P]{}
	t.m.Store(&m)
	return t
}

// Key packs the address in b[0:6] (a frame's destination or, at b[6:],
// its source) the way the table keys it, reading each byte once: the
// address of a frame in guest memory is read once and decided on.
func Key(b []byte) uint64 {
	_ = b[5]
	return uint64(binary.BigEndian.Uint32(b))<<16 | uint64(binary.BigEndian.Uint16(b[4:]))
}

// KeyIsMulticast reports whether the address packed in k is a group
// address.
func KeyIsMulticast(k uint64) bool { return k&(1<<40) != 0 }

// MACOf unpacks a Key.
func MACOf(k uint64) MAC { return macOf(k) }

// Lookup returns the port that owns mac.
func (t *Table[P]) Lookup(mac MAC) (P, bool) { return t.lookupKey(key(mac)) }

func (t *Table[P]) lookupKey(k uint64) (P, bool) {
	e, ok := (*t.m.Load())[k]
	if !ok {
		var zero P
		return zero, false
	}
	return e.port, true
}

// Learn records that mac was seen as a source on port at time now (unix
// nanoseconds). It reports false when the port is at its limit. The common
// case, an address seen again on the same port, only refreshes its
// timestamp at most once a second.
func (t *Table[P]) Learn(mac MAC, port P, now int64) bool {
	if mac.IsMulticast() || mac.IsZero() {
		return false
	}
	k := key(mac)
	if e, ok := (*t.m.Load())[k]; ok && e.port == port {
		if now-e.lastSeen.Load() > t.refreshNano {
			e.lastSeen.Store(now)
		}
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.m.Load()
	old, had := cur[k]
	if had && old.port == port {
		old.lastSeen.Store(now)
		return true
	}
	if t.perPort[port] >= t.maxPerPort {
		return false
	}
	next := make(map[uint64]*entry[P], len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	if had {
		t.perPort[old.port]--
	}
	e := &entry[P]{port: port}
	e.lastSeen.Store(now)
	next[k] = e
	t.perPort[port]++
	t.m.Store(&next)
	t.gen.Add(1)
	return true
}

// Age forgets addresses not seen since now-maxAge and returns how many.
func (t *Table[P]) Age(now, maxAge int64) int {
	return t.remove(func(_ MAC, e *entry[P]) bool { return now-e.lastSeen.Load() > maxAge })
}

// Forget removes every address owned by port (it went away).
func (t *Table[P]) Forget(port P) int {
	return t.remove(func(_ MAC, e *entry[P]) bool { return e.port == port })
}

func (t *Table[P]) remove(drop func(MAC, *entry[P]) bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.m.Load()
	n := 0
	for k, v := range cur {
		if drop(macOf(k), v) {
			n++
		}
	}
	if n == 0 {
		return 0
	}
	next := make(map[uint64]*entry[P], len(cur)-n)
	for k, v := range cur {
		if drop(macOf(k), v) {
			t.perPort[v.port]--
			if t.perPort[v.port] == 0 {
				delete(t.perPort, v.port)
			}
			continue
		}
		next[k] = v
	}
	t.m.Store(&next)
	t.gen.Add(1)
	return n
}

// Gen returns the table's generation: it changes after every learn of a
// new address, move, forget and age, never on a refresh.
func (t *Table[P]) Gen() uint64 { return t.gen.Load() }

// Len returns the number of learned addresses.
func (t *Table[P]) Len() int { return len(*t.m.Load()) }

// Entries calls f for every entry (for listings; not on the fast path).
func (t *Table[P]) Entries(f func(mac MAC, port P, lastSeen int64)) {
	for k, v := range *t.m.Load() {
		f(macOf(k), v.port, v.lastSeen.Load())
	}
}
