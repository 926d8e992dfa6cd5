package vswitch

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
)

// macModel is the slow, obviously correct MAC table the real one is
// compared against.
type macModel struct {
	max     int
	limits  map[int]int
	refresh int64
	m       map[MAC]modelEntry
	static  map[MAC]bool
}

type modelEntry struct {
	port int
	last int64
}

func newMacModel(max int) *macModel {
	return &macModel{max: max, limits: map[int]int{}, refresh: 1e9, m: map[MAC]modelEntry{}, static: map[MAC]bool{}}
}

func (md *macModel) limit(port int) int {
	if n, ok := md.limits[port]; ok {
		return n
	}
	return md.max
}

func (md *macModel) owned(port int) int {
	n := 0
	for _, e := range md.m {
		if e.port == port {
			n++
		}
	}
	return n
}

func (md *macModel) learn(mac MAC, port int, now int64, static bool) bool {
	if mac[0]&1 != 0 || mac == (MAC{}) {
		return false
	}
	e, ok := md.m[mac]
	if ok && e.port == port {
		if md.static[mac] != static {
			md.m[mac], md.static[mac] = modelEntry{port, now}, static
		} else if now-e.last > md.refresh {
			md.m[mac] = modelEntry{port, now}
		}
		return true
	}
	if md.owned(port) >= md.limit(port) {
		return false
	}
	md.m[mac], md.static[mac] = modelEntry{port, now}, static
	return true
}

func (md *macModel) age(now, maxAge int64) int {
	n := 0
	for k, e := range md.m {
		if !md.static[k] && now-e.last > maxAge {
			delete(md.m, k)
			n++
		}
	}
	return n
}

func (md *macModel) forget(port int) int {
	n := 0
	for k, e := range md.m {
		if e.port == port {
			delete(md.m, k)
			n++
		}
	}
	return n
}

func snapshot(t *Table[int]) map[MAC]modelEntry {
	got := map[MAC]modelEntry{}
	t.Entries(func(mac MAC, port int, last int64) { got[mac] = modelEntry{port, last} })
	return got
}

func TestTableAgainstModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 99))
		const maxPerPort = 5
		tbl := NewTable[int](maxPerPort)
		md := newMacModel(maxPerPort)
		// port 3 stands for an uplink: enough addresses to rebuild the
		// slots several times
		tbl.SetLimit(3, 100)
		md.limits[3] = 100
		pool := make([]MAC, 300)
		for i := range pool {
			pool[i] = MAC{0x52, 0x54, 0, 0, byte(i >> 8), byte(i)}
		}
		pool[0] = MAC{}                                   // never a source
		pool[1] = MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} // broadcast
		pool[2] = MAC{0x01, 0x00, 0x5e, 0, 0, 1}          // IPv4 multicast
		pool[3] = MAC{0x33, 0x33, 0, 0, 0, 1}             // IPv6 multicast
		now := int64(1e12)
		for step := range 2000 {
			now += rng.Int64N(3e8)
			if rng.IntN(50) == 0 {
				now -= rng.Int64N(1e9) // a clock that steps back
			}
			var what string
			switch op := rng.IntN(20); {
			case op < 10:
				mac, port := pool[rng.IntN(len(pool))], rng.IntN(4)
				got, want := tbl.Learn(mac, port, now), md.learn(mac, port, now, false)
				what = fmt.Sprintf("Learn(%v, %d, %d)", mac, port, now)
				if got != want {
					t.Fatalf("seed %d step %d: %s = %v, want %v", seed, step, what, got, want)
				}
			case op < 14:
				mac, port := pool[rng.IntN(40)], rng.IntN(4)
				got, want := tbl.Pin(mac, port, now), md.learn(mac, port, now, true)
				what = fmt.Sprintf("Pin(%v, %d, %d)", mac, port, now)
				if got != want {
					t.Fatalf("seed %d step %d: %s = %v, want %v", seed, step, what, got, want)
				}
			case op < 18:
				maxAge := rng.Int64N(4e9)
				got, want := tbl.Age(now, maxAge), md.age(now, maxAge)
				what = fmt.Sprintf("Age(%d, %d)", now, maxAge)
				if got != want {
					t.Fatalf("seed %d step %d: %s = %d, want %d", seed, step, what, got, want)
				}
			default:
				port := rng.IntN(4)
				got, want := tbl.Forget(port), md.forget(port)
				what = fmt.Sprintf("Forget(%d)", port)
				if got != want {
					t.Fatalf("seed %d step %d: %s = %d, want %d", seed, step, what, got, want)
				}
			}
			for port := range 4 {
				if got, want := tbl.Owned(port), md.owned(port); got != want {
					t.Fatalf("seed %d step %d after %s: Owned(%d) = %d, want %d", seed, step, what, port, got, want)
				}
			}
			if tbl.Len() != len(md.m) {
				t.Fatalf("seed %d step %d after %s: Len %d, want %d", seed, step, what, tbl.Len(), len(md.m))
			}
			for _, mac := range pool {
				p, ok := tbl.Lookup(mac)
				e, want := md.m[mac]
				if ok != want || (ok && p != e.port) {
					t.Fatalf("seed %d step %d after %s: Lookup(%v) = %d, %v; want %d, %v", seed, step, what, mac, p, ok, e.port, want)
				}
			}
			if got := snapshot(tbl); !maps.Equal(got, md.m) {
				t.Fatalf("seed %d step %d after %s: entries\n got %v\nwant %v", seed, step, what, got, md.m)
			}
		}
	}
}

func TestTablePerPortLimit(t *testing.T) {
	tbl := NewTable[string](2)
	mac := func(i byte) MAC { return MAC{0x02, 0, 0, 0, 0, i} }
	if !tbl.Learn(mac(1), "a", 0) || !tbl.Learn(mac(2), "a", 0) {
		t.Fatal("learning within the limit failed")
	}
	if tbl.Learn(mac(3), "a", 0) {
		t.Errorf("third address on a port limited to 2 was learned")
	}
	if _, ok := tbl.Lookup(mac(3)); ok {
		t.Errorf("refused address is in the table")
	}
	if !tbl.Learn(mac(1), "a", 5e9) {
		t.Errorf("refreshing a known address at the limit failed")
	}
	// Other ports are not affected.
	if !tbl.Learn(mac(3), "b", 0) || !tbl.Learn(mac(4), "b", 0) {
		t.Errorf("port b could not learn")
	}
	// A move to a full port fails and leaves the address where it was.
	if tbl.Learn(mac(1), "b", 0) {
		t.Errorf("move to a full port succeeded")
	}
	if p, _ := tbl.Lookup(mac(1)); p != "a" {
		t.Errorf("address moved to %q", p)
	}
	// A move frees a slot on the old port.
	tbl.Forget("b")
	if !tbl.Learn(mac(1), "b", 0) {
		t.Fatal("move to port b failed")
	}
	if p, _ := tbl.Lookup(mac(1)); p != "b" {
		t.Errorf("address on %q after the move", p)
	}
	if !tbl.Learn(mac(5), "a", 0) {
		t.Errorf("port a still full after one of its addresses moved")
	}
	// Aging frees slots too.
	if n := tbl.Age(10e9, 1e9); n != 3 {
		t.Errorf("Age removed %d, want 3", n)
	}
	if !tbl.Learn(mac(6), "a", 10e9) || !tbl.Learn(mac(7), "a", 10e9) {
		t.Errorf("port a cannot learn after aging")
	}
	if tbl.Len() != 2 {
		t.Errorf("Len = %d, want 2", tbl.Len())
	}
}

func TestTableNeverLearnsGroupOrZero(t *testing.T) {
	tbl := NewTable[int](0) // default limit
	for _, m := range []MAC{
		{},
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		{0x01, 0x00, 0x5e, 0x00, 0x00, 0xfb},
		{0x33, 0x33, 0x00, 0x00, 0x00, 0x01},
		{0x01, 0x80, 0xc2, 0x00, 0x00, 0x00},
		{0x03, 0, 0, 0, 0, 0},
	} {
		if tbl.Learn(m, 1, 0) {
			t.Errorf("learned %v", m)
		}
		if _, ok := tbl.Lookup(m); ok {
			t.Errorf("%v is in the table", m)
		}
		if !m.IsMulticast() && !m.IsZero() {
			t.Errorf("%v is neither multicast nor zero", m)
		}
	}
	if tbl.Len() != 0 {
		t.Errorf("Len = %d", tbl.Len())
	}
	// Locally administered unicast is a normal source.
	if !tbl.Learn(MAC{0x02, 0, 0, 0, 0, 1}, 1, 0) {
		t.Errorf("locally administered unicast not learned")
	}
	for i := range DefaultMaxPerPort + 1 {
		ok := tbl.Learn(MAC{0x52, 0x54, 0, 0, byte(i >> 8), byte(i)}, 2, 0)
		if ok != (i < DefaultMaxPerPort) {
			t.Fatalf("address %d on port 2: Learn = %v with the default limit %d", i, ok, DefaultMaxPerPort)
		}
	}
}

// Seeing an address again refreshes its age at most once a second.
func TestTableRefresh(t *testing.T) {
	tbl := NewTable[int](4)
	m := MAC{0x02, 0, 0, 0, 0, 9}
	last := func() int64 { return snapshot(tbl)[m].last }
	tbl.Learn(m, 1, 10e9)
	tbl.Learn(m, 1, 10e9+5e8)
	if last() != 10e9 {
		t.Errorf("refreshed after half a second: %d", last())
	}
	tbl.Learn(m, 1, 11e9+1)
	if last() != 11e9+1 {
		t.Errorf("not refreshed after a second: %d", last())
	}
	if n := tbl.Age(12e9+1, 1e9); n != 0 {
		t.Errorf("Age at exactly maxAge removed %d", n)
	}
	if n := tbl.Age(12e9+2, 1e9); n != 1 {
		t.Errorf("Age past maxAge removed %d", n)
	}
}

// Learning, lookups and aging from many goroutines (run with -race).
func TestTableConcurrent(t *testing.T) {
	const maxPerPort = 16
	tbl := NewTable[int](maxPerPort)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range 3000 {
				m := MAC{0x02, 0, 0, 0, byte(w), byte(rng.IntN(40))}
				port := rng.IntN(3)
				tbl.Learn(m, port, int64(i)*1e7)
				if p, ok := tbl.Lookup(m); ok && (p < 0 || p > 2) {
					panic("bad port")
				}
				if i%500 == 0 {
					tbl.Age(int64(i)*1e7, 1e9)
				}
				if i%1000 == 999 {
					tbl.Forget(port)
				}
			}
		}()
	}
	wg.Wait()
	counts := map[int]int{}
	tbl.Entries(func(_ MAC, p int, _ int64) { counts[p]++ })
	for p, n := range counts {
		if n > maxPerPort {
			t.Errorf("port %d owns %d addresses, limit %d", p, n, maxPerPort)
		}
	}
	// The per-port counters agree with the entries: every port can fill
	// up exactly to its limit.
	for p := range 3 {
		learned := 0
		for i := range 64 {
			if tbl.Learn(MAC{0x06, 0, 0, 1, byte(p), byte(i)}, p, 1e12) {
				learned++
			}
		}
		if counts[p]+learned != maxPerPort {
			t.Errorf("port %d: %d entries + %d new = %d, want the limit %d", p, counts[p], learned, counts[p]+learned, maxPerPort)
		}
	}
}

func TestLookupAllocs(t *testing.T) {
	tbl := NewTable[int](0)
	m := MAC{0x52, 0x54, 0, 0, 0, 1}
	tbl.Learn(m, 3, 0)
	allocs := testing.AllocsPerRun(100, func() {
		if p, ok := tbl.Lookup(m); !ok || p != 3 {
			panic("lookup")
		}
		tbl.Learn(m, 3, 5e8) // a known address on its port
	})
	if allocs != 0 {
		t.Errorf("%v allocations per lookup+learn, want 0", allocs)
	}
}

// TestLearnCostFlat: learning a new address costs the same in a table of
// a thousand addresses as in one of sixty thousand (a source-address flood
// on an uplink must not make each new address cost a copy of the table).
// Memory allocated per learn is the measure (deterministic, unlike time).
func TestLearnCostFlat(t *testing.T) {
	perLearn := func(size int) float64 {
		tbl := NewTable[int](1)
		tbl.SetLimit(0, 1<<20)
		mac := func(i int) MAC { return MAC{0x52, 0x54, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)} }
		for i := range size {
			tbl.Learn(mac(i), 0, 1)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		const n = 4096
		for i := range n {
			tbl.Learn(mac(size+i), 0, 1)
		}
		runtime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / n
	}
	small, large := perLearn(1000), perLearn(60000)
	t.Logf("bytes allocated per new address: %.0f at 1000 addresses, %.0f at 60000", small, large)
	if large > 4*small+256 {
		t.Errorf("learning at 60000 addresses allocates %.0f bytes per address, at 1000 %.0f: the cost grows with the table", large, small)
	}
}

// BenchmarkLearnNew: learning one new address into a table that already
// holds size addresses (a source-address flood on an uplink).
func BenchmarkLearnNew(b *testing.B) {
	for _, size := range []int{1000, 8000, 60000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			mac := func(i int) MAC { return MAC{0x52, 0x54, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)} }
			tbl := NewTable[int](0)
			for i := range size {
				tbl.Learn(mac(i), i/200, 1) // 200 per port: under any per-port limit
			}
			b.ResetTimer()
			for i := range b.N {
				tbl.Learn(mac(size+i), (size+i)/200, 1)
				if i%size == size-1 { // keep the table at its size
					b.StopTimer()
					tbl.Forget(-1)
					b.StartTimer()
				}
			}
		})
	}
}
