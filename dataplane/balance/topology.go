package balance

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Topology maps a CPU to its NUMA node. It is injected where placement
// rules need it, so tests can describe machines this one is not.
type Topology map[int]int

// Node returns cpu's NUMA node; a CPU the topology does not list (or -1,
// an unpinned worker) is on node 0.
func (t Topology) Node(cpu int) int { return t[cpu] }

// ReadTopology reads root/devices/system/node/node*/cpulist (root is
// "/sys" on a real machine). A machine without that directory (no NUMA
// support in the kernel) is one node: an empty Topology.
func ReadTopology(root string) (Topology, error) {
	dirs, err := filepath.Glob(filepath.Join(root, "devices/system/node/node[0-9]*"))
	if err != nil {
		return nil, err
	}
	t := Topology{}
	for _, dir := range dirs {
		node, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), "node"))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "cpulist"))
		if err != nil {
			return nil, err
		}
		cpus, err := ParseCPUList(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "cpulist"), err)
		}
		for _, c := range cpus {
			t[c] = node
		}
	}
	return t, nil
}

// maxCPU bounds a CPU list (the kernel's default NR_CPUS maximum).
const maxCPU = 8192

// ParseCPUList parses the kernel's CPU list format ("0-3,8,10-11"; empty
// is no CPU).
func ParseCPUList(s string) ([]int, error) {
	var out []int
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 || a >= maxCPU {
			return nil, fmt.Errorf("CPU list %q: %q is not a CPU number below %d", s, lo, maxCPU)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b >= maxCPU {
				return nil, fmt.Errorf("CPU list %q: %q is not a range of CPUs below %d", s, part, maxCPU)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	return out, nil
}
