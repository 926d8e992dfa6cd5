package plugin

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func layout(numas, cpusPerNUMA, slotsPerCPU int) map[string]slotRef {
	m := map[string]slotRef{}
	cpu := 0
	for n := range numas {
		for range cpusPerNUMA {
			for s := range slotsPerCPU {
				id := fmt.Sprintf("c%d-s%d", cpu, s)
				m[id] = slotRef{id: id, cpu: cpu, numa: n}
			}
			cpu++
		}
	}
	return m
}

// TestPreferProperties checks the allocator against its rules on random
// nodes, free sets and requests.
func TestPreferProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 3000 {
		slots := layout(1+r.IntN(2), 1+r.IntN(4), 1+r.IntN(4))
		var avail []string
		for id := range slots {
			if r.IntN(4) != 0 {
				avail = append(avail, id)
			}
		}
		var must []string
		for _, id := range avail {
			if r.IntN(10) == 0 && len(must) < 2 {
				must = append(must, id)
			}
		}
		size := 1 + r.IntN(6)
		if size > len(avail) {
			size = len(avail)
		}
		if len(must) > size {
			must = must[:size]
		}
		got := Prefer(slots, avail, must, size)
		ctx := fmt.Sprintf("iter %d: avail %v must %v size %d -> %v", iter, avail, must, size, got)
		if len(got) != size {
			t.Fatalf("%s: %d slots, want %d", ctx, len(got), size)
		}
		seen := map[string]bool{}
		perCPU := map[int]int{}
		for _, id := range got {
			if seen[id] {
				t.Fatalf("%s: %s twice", ctx, id)
			}
			seen[id] = true
			perCPU[slots[id].cpu]++
		}
		for _, id := range must {
			if !seen[id] {
				t.Fatalf("%s: must-include %s missing", ctx, id)
			}
		}
		// No CPU holds two of our slots while a CPU with a free slot is
		// unused by us (must-include slots may force a doubling).
		mustPerCPU := map[int]int{}
		for _, id := range must {
			mustPerCPU[slots[id].cpu]++
		}
		doubled := false
		for cpu, n := range perCPU {
			if n > 1 && n > mustPerCPU[cpu] {
				doubled = true
			}
		}
		if doubled {
			for _, id := range avail {
				if !seen[id] && perCPU[slots[id].cpu] == 0 {
					t.Fatalf("%s: a CPU got two slots while CPU %d had a free slot", ctx, slots[id].cpu)
				}
			}
		}
		// One NUMA node when the chosen node alone has enough distinct CPUs
		// and nothing forces another.
		if len(must) == 0 {
			nodes := map[int]bool{}
			for _, id := range got {
				nodes[slots[id].numa] = true
			}
			distinctOn := map[int]map[int]bool{}
			for _, id := range avail {
				s := slots[id]
				if distinctOn[s.numa] == nil {
					distinctOn[s.numa] = map[int]bool{}
				}
				distinctOn[s.numa][s.cpu] = true
			}
			enough := false
			for _, cpus := range distinctOn {
				if len(cpus) >= size {
					enough = true
				}
			}
			if enough && len(nodes) > 1 {
				t.Fatalf("%s: spans NUMA nodes %v although one node had %d distinct CPUs", ctx, nodes, size)
			}
		}
	}
}

func TestPreferPacksRequests(t *testing.T) {
	// 4 CPUs x 2 slots; two 2-slot VMs then a 4-slot VM: each gets distinct CPUs.
	slots := layout(1, 4, 2)
	var avail []string
	for id := range slots {
		avail = append(avail, id)
	}
	remove := func(ids []string) {
		for _, id := range ids {
			for i, a := range avail {
				if a == id {
					avail = append(avail[:i], avail[i+1:]...)
					break
				}
			}
		}
	}
	for _, size := range []int{2, 2, 4} {
		got := Prefer(slots, avail, nil, size)
		cpus := map[int]bool{}
		for _, id := range got {
			cpus[slots[id].cpu] = true
		}
		if len(cpus) != size {
			t.Errorf("request of %d got %v (CPUs %v), want distinct CPUs", size, got, cpus)
		}
		remove(got)
	}
}

func TestAllocationDir(t *testing.T) {
	a := AllocationDir([]string{"c1-s0", "c0-s2", "c3-s1"})
	b := AllocationDir([]string{"c3-s1", "c1-s0", "c0-s2"})
	if a != b {
		t.Errorf("order changes the name: %s vs %s", a, b)
	}
	if c := AllocationDir([]string{"c1-s0", "c0-s2"}); c == a {
		t.Errorf("different sets share a name %s", c)
	}
	// /var/run/vhostmq/<dir>/<pod interface name>.sock must fit in sun_path
	if p := "/var/run/vhostmq/" + a + "/pod1234567890a.sock"; len(p) >= 108 {
		t.Errorf("socket path %q is %d bytes", p, len(p))
	}
}

func TestParseSlotID(t *testing.T) {
	for _, bad := range []string{"", "c1", "c-1-s0", "c1-s", "x1-s0", "c01-s0", "c1-s0x"} {
		if _, _, err := parseSlotID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if c, n, err := parseSlotID("c12-s3"); err != nil || c != 12 || n != 3 {
		t.Errorf("c12-s3: %d %d %v", c, n, err)
	}
}
