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
	key      uint64 // never changes: a move or a pin puts a new entry in the slot
	port     P
	static   bool         // pinned: the port's own configured address, never aged
	lastSeen atomic.Int64 // unix nanoseconds
}

// slots is an open-addressing hash table (linear probing) of entries,
// at most half full, so that every probe ends at an empty slot. Readers
// load slots without a lock; the one writer (Table.mu) fills an empty
// slot, replaces an entry, or leaves a tombstone (an entry whose key no
// address has), and builds a new slots when tombstones and entries would
// fill more than half.
type slots[P comparable] struct {
	s     []atomic.Pointer[entry[P]]
	shift uint
}

func newSlots[P comparable](n int) *slots[P] {
	size, bits := 16, uint(4)
	for size < 2*n {
		size, bits = size*2, bits+1
	}
	return &slots[P]{s: make([]atomic.Pointer[entry[P]], size), shift: 64 - bits}
}

// home is k's first slot: Fibonacci hashing of the 48-bit key.
func (t *slots[P]) home(k uint64) uint64 { return (k * 0x9E3779B97F4A7C15) >> t.shift }

func (t *slots[P]) find(k uint64) *entry[P] {
	mask := uint64(len(t.s) - 1)
	for i := t.home(k); ; i = (i + 1) & mask {
		e := t.s[i].Load()
		if e == nil || e.key == k {
			return e
		}
	}
}

// Table is a MAC table shared by every worker. Lookups are lock-free;
// learning a new address, a move, a pin or a removal costs O(1)
// (amortised: the slots are rebuilt when they fill), whatever the
// table's size, so a source-address flood costs the table no more per
// frame than it would a small one. Each port may own a bounded number of
// addresses (SetLimit; NewTable's default otherwise).
type Table[P comparable] struct {
	tab         atomic.Pointer[slots[P]]
	gen         atomic.Uint64 // moves when an address moves or goes (not when one is added): Cache validates against it
	mu          sync.Mutex    // serialises writers
	live, dead  int           // entries and tombstones in tab, under mu
	tomb        *entry[P]     // the tombstone: key noAddress
	perPort     map[P]int
	limits      map[P]int // per-port limits other than maxPerPort
	maxPerPort  int
	refreshNano int64
}

// noAddress is no 48-bit address's key: the tombstone's.
const noAddress = ^uint64(0)

// DefaultMaxPerPort bounds how many addresses one port may own.
const DefaultMaxPerPort = 256

// NewTable returns an empty table whose ports may own maxPerPort
// addresses each (0: DefaultMaxPerPort).
func NewTable[P comparable](maxPerPort int) *Table[P] {
	if maxPerPort <= 0 {
		maxPerPort = DefaultMaxPerPort
	}
	t := &Table[P]{perPort: map[P]int{}, limits: map[P]int{}, maxPerPort: maxPerPort, refreshNano: 1e9,
		tomb: &entry[P]{key: noAddress}}
	t.tab.Store(newSlots[P](0))
	return t
}

// SetLimit sets how many addresses port may own (an uplink's stand-in
// holds a LAN's); 0 restores the table's default.
func (t *Table[P]) SetLimit(port P, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n <= 0 {
		delete(t.limits, port)
		return
	}
	t.limits[port] = n
}

func (t *Table[P]) limitOf(port P) int {
	if n, ok := t.limits[port]; ok {
		return n
	}
	return t.maxPerPort
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

// KeyOf packs mac the way Key does.
func KeyOf(mac MAC) uint64 { return key(mac) }

// Lookup returns the port that owns mac.
func (t *Table[P]) Lookup(mac MAC) (P, bool) { return t.lookupKey(key(mac)) }

func (t *Table[P]) lookupKey(k uint64) (P, bool) {
	if e := t.tab.Load().find(k); e != nil {
		return e.port, true
	}
	var zero P
	return zero, false
}

// Learn records that mac was seen as a source on port at time now (unix
// nanoseconds), taking it from another port if another had it (a move).
// It reports false when the port is at its limit. The common case, an
// address seen again on the same port, only refreshes its timestamp at
// most once a second.
func (t *Table[P]) Learn(mac MAC, port P, now int64) bool {
	return t.set(mac, port, now, false)
}

// Pin makes mac port's own address (a guest port's configured MAC, or
// one its port security allowed): like Learn, but the entry never ages.
// Pinning an address another port owns moves it (the port that announced
// itself last, as after a live migration, gets the frames).
func (t *Table[P]) Pin(mac MAC, port P, now int64) bool {
	return t.set(mac, port, now, true)
}

func (t *Table[P]) set(mac MAC, port P, now int64, static bool) bool {
	if mac.IsMulticast() || mac.IsZero() {
		return false
	}
	k := key(mac)
	if e := t.tab.Load().find(k); e != nil && e.port == port && e.static == static {
		if now-e.lastSeen.Load() > t.refreshNano {
			e.lastSeen.Store(now)
		}
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tab := t.tab.Load()
	mask := uint64(len(tab.s) - 1)
	free := -1
	for i := tab.home(k); ; i = (i + 1) & mask {
		e := tab.s[i].Load()
		if e == nil {
			break
		}
		if e == t.tomb {
			if free < 0 {
				free = int(i)
			}
			continue
		}
		if e.key != k {
			continue
		}
		if e.port == port {
			if e.static != static {
				tab.s[i].Store(t.newEntry(k, port, static, now)) // the same port: cached answers stay right
			} else {
				e.lastSeen.Store(now)
			}
			return true
		}
		if t.perPort[port] >= t.limitOf(port) {
			return false
		}
		t.release(e.port)
		t.perPort[port]++
		tab.s[i].Store(t.newEntry(k, port, static, now))
		t.gen.Add(1)
		return true
	}
	if t.perPort[port] >= t.limitOf(port) {
		return false
	}
	t.perPort[port]++
	if free < 0 && 2*(t.live+t.dead+1) > len(tab.s) {
		tab = t.rebuild(t.live + 1)
	}
	t.insert(tab, free, t.newEntry(k, port, static, now))
	return true // a new address: no cached answer is wrong (Cache holds found ones)
}

func (t *Table[P]) newEntry(k uint64, port P, static bool, now int64) *entry[P] {
	e := &entry[P]{key: k, port: port, static: static}
	e.lastSeen.Store(now)
	return e
}

// insert puts a new entry into free (a tombstone on its probe path), or
// else into the first empty slot of its probe. Caller holds mu.
func (t *Table[P]) insert(tab *slots[P], free int, e *entry[P]) {
	if free >= 0 && tab == t.tab.Load() {
		tab.s[free].Store(e)
		t.dead--
		t.live++
		return
	}
	mask := uint64(len(tab.s) - 1)
	i := tab.home(e.key)
	for tab.s[i].Load() != nil {
		i = (i + 1) & mask
	}
	tab.s[i].Store(e)
	t.live++
}

// rebuild puts the live entries into new slots sized for n and publishes
// them. Caller holds mu.
func (t *Table[P]) rebuild(n int) *slots[P] {
	old := t.tab.Load()
	tab := newSlots[P](max(n, 2*t.live))
	mask := uint64(len(tab.s) - 1)
	for i := range old.s {
		e := old.s[i].Load()
		if e == nil || e == t.tomb {
			continue
		}
		j := tab.home(e.key)
		for tab.s[j].Load() != nil {
			j = (j + 1) & mask
		}
		tab.s[j].Store(e)
	}
	t.tab.Store(tab)
	t.dead = 0
	return tab
}

// release counts one address less for port. Caller holds mu.
func (t *Table[P]) release(port P) {
	if t.perPort[port]--; t.perPort[port] <= 0 {
		delete(t.perPort, port)
	}
}

// Age forgets addresses not seen since now-maxAge and returns how many;
// pinned addresses stay.
func (t *Table[P]) Age(now, maxAge int64) int {
	return t.remove(func(e *entry[P]) bool { return !e.static && now-e.lastSeen.Load() > maxAge })
}

// Forget removes every address owned by port (it went away).
func (t *Table[P]) Forget(port P) int {
	return t.remove(func(e *entry[P]) bool { return e.port == port })
}

// Unpin removes mac if port owns it.
func (t *Table[P]) Unpin(mac MAC, port P) bool {
	k := key(mac)
	return t.remove(func(e *entry[P]) bool { return e.key == k && e.port == port }) > 0
}

func (t *Table[P]) remove(drop func(*entry[P]) bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	tab := t.tab.Load()
	n := 0
	for i := range tab.s {
		e := tab.s[i].Load()
		if e == nil || e == t.tomb || !drop(e) {
			continue
		}
		tab.s[i].Store(t.tomb)
		t.release(e.port)
		t.live--
		t.dead++
		n++
	}
	if n == 0 {
		return 0
	}
	if t.dead > t.live+16 {
		t.rebuild(t.live)
	}
	t.gen.Add(1)
	return n
}

// Owned returns how many addresses port owns.
func (t *Table[P]) Owned(port P) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.perPort[port]
}

// Gen returns the table's generation: it changes after every move,
// forget and age, never on a refresh or a new address.
func (t *Table[P]) Gen() uint64 { return t.gen.Load() }

// Len returns the number of addresses in the table.
func (t *Table[P]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live
}

// Entries calls f for every entry (for listings; not on the fast path).
// An entry that changes meanwhile may be seen once, twice or not at all.
func (t *Table[P]) Entries(f func(mac MAC, port P, lastSeen int64)) {
	tab := t.tab.Load()
	for i := range tab.s {
		if e := tab.s[i].Load(); e != nil && e.key != noAddress {
			f(macOf(e.key), e.port, e.lastSeen.Load())
		}
	}
}
