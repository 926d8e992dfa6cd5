package plugin

import (
	"fmt"
	"sort"
)

// slotRef is a queue slot as the allocator sees it.
type slotRef struct {
	id   string
	cpu  int
	numa int
}

// Prefer picks size slots for one container out of available, keeping
// mustInclude, by these rules in order:
//
//  1. one NUMA node: the node of the must-include slots, else the node
//     offering the most distinct CPUs (ties: the most free slots, then the
//     lowest node);
//  2. distinct CPUs: no CPU gets a second slot of this request while a CPU
//     with a free slot is unused by it — first on the chosen node, then on
//     the others;
//  3. packing: among equally good CPUs, the one with the most free slots
//     (so later requests still find distinct CPUs), then the lowest CPU id
//     and slot id, which makes the answer deterministic.
//
// slots describes every slot of the node; IDs it does not know are ignored.
func Prefer(slots map[string]slotRef, available, mustInclude []string, size int) []string {
	avail := map[string]slotRef{}
	for _, id := range available {
		if s, ok := slots[id]; ok {
			avail[id] = s
		}
	}
	chosen := []string{}
	used := map[int]int{} // cpu -> slots of this request
	take := func(id string) {
		chosen = append(chosen, id)
		used[avail[id].cpu]++
		delete(avail, id)
	}
	for _, id := range mustInclude {
		if _, ok := avail[id]; ok && len(chosen) < size {
			take(id)
		}
	}
	node := -1
	if len(chosen) > 0 {
		node = slots[chosen[0]].numa
	} else {
		node = bestNode(avail)
	}
	freeOn := func(cpu int) int {
		n := 0
		for _, s := range avail {
			if s.cpu == cpu {
				n++
			}
		}
		return n
	}
	// pick the best slot among those that pass ok
	pick := func(ok func(s slotRef) bool) bool {
		var cands []slotRef
		for _, s := range avail {
			if ok(s) {
				cands = append(cands, s)
			}
		}
		if len(cands) == 0 {
			return false
		}
		sort.Slice(cands, func(i, j int) bool {
			a, b := cands[i], cands[j]
			if used[a.cpu] != used[b.cpu] {
				return used[a.cpu] < used[b.cpu]
			}
			if fa, fb := freeOn(a.cpu), freeOn(b.cpu); fa != fb {
				return fa > fb
			}
			if a.cpu != b.cpu {
				return a.cpu < b.cpu
			}
			return slotLess(a.id, b.id)
		})
		take(cands[0].id)
		return true
	}
	for len(chosen) < size && pick(func(s slotRef) bool { return s.numa == node && used[s.cpu] == 0 }) {
	}
	for len(chosen) < size && pick(func(s slotRef) bool { return used[s.cpu] == 0 }) {
	}
	for len(chosen) < size && pick(func(s slotRef) bool { return s.numa == node }) {
	}
	for len(chosen) < size && pick(func(slotRef) bool { return true }) {
	}
	return chosen
}

func bestNode(avail map[string]slotRef) int {
	cpus := map[int]map[int]bool{}
	free := map[int]int{}
	for _, s := range avail {
		if cpus[s.numa] == nil {
			cpus[s.numa] = map[int]bool{}
		}
		cpus[s.numa][s.cpu] = true
		free[s.numa]++
	}
	best := -1
	for n := range cpus {
		switch {
		case best < 0,
			len(cpus[n]) > len(cpus[best]),
			len(cpus[n]) == len(cpus[best]) && free[n] > free[best],
			len(cpus[n]) == len(cpus[best]) && free[n] == free[best] && n < best:
			best = n
		}
	}
	return best
}

// parseSlotID splits "c<cpu>-s<n>".
func parseSlotID(id string) (cpu, n int, err error) {
	if _, err := fmt.Sscanf(id, "c%d-s%d", &cpu, &n); err != nil || cpu < 0 || n < 0 || fmt.Sprintf("c%d-s%d", cpu, n) != id {
		return 0, 0, fmt.Errorf("%q is not a slot ID like c3-s1", id)
	}
	return cpu, n, nil
}

// slotLess orders slot IDs numerically (c2-s10 after c2-s9).
func slotLess(a, b string) bool {
	ac, an, errA := parseSlotID(a)
	bc, bn, errB := parseSlotID(b)
	if errA != nil || errB != nil {
		return a < b
	}
	if ac != bc {
		return ac < bc
	}
	return an < bn
}
