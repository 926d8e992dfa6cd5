package balance

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var auto = Config{Threshold: 0.95, Improvement: 0.25}

func twoWorkers() []Worker {
	return []Worker{{ID: 0, CPU: 0}, {ID: 1, CPU: 1}}
}

func TestNoMoveBelowThreshold(t *testing.T) {
	qs := []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 0.45}, {Port: "b", Pair: 0, Worker: 0, Load: 0.45}}
	p := Compute(twoWorkers(), qs, auto)
	if len(p.Moves) != 0 {
		t.Fatalf("moves %+v with the busiest worker at 90%% (threshold 95%%)", p.Moves)
	}
	if !strings.Contains(p.Reason, "no worker above 95%") {
		t.Errorf("reason %q", p.Reason)
	}
	// The same loads with a lower threshold are moved.
	if p := Compute(twoWorkers(), qs, Config{Threshold: 0.8, Improvement: 0.25}); len(p.Moves) != 1 {
		t.Fatalf("threshold 80%%: moves %+v, want 1", p.Moves)
	}
}

func TestOverloadedWorkerSheds(t *testing.T) {
	qs := []Queue{
		{Port: "a", Pair: 0, Worker: 0, Load: 0.6},
		{Port: "b", Pair: 0, Worker: 0, Load: 0.3},
		{Port: "c", Pair: 0, Worker: 0, Load: 0.2},
		{Port: "d", Pair: 0, Worker: 1, Load: 0.1},
	}
	p := Compute(twoWorkers(), qs, auto)
	if len(p.Moves) == 0 {
		t.Fatalf("no moves: %s", p.Reason)
	}
	if p.Moves[0].From != 0 || p.Moves[0].To != 1 || p.Moves[0].Port != "a" {
		t.Errorf("first move %+v: want a 0 -> 1", p.Moves[0])
	}
	// 1.1 | 0.1 is split 0.6 | 0.6 (a to worker 1, then d to worker 0).
	if math.Abs(p.After[0]-0.6) > 1e-9 || math.Abs(p.After[1]-0.6) > 1e-9 {
		t.Errorf("loads after %v, want [0.6 0.6]", p.After)
	}
	if p.VarAfter >= p.VarBefore {
		t.Errorf("variance %v -> %v", p.VarBefore, p.VarAfter)
	}
	// Hysteresis: the balanced result plans nothing.
	if p2 := Compute(twoWorkers(), apply(qs, p.Moves), Config{Threshold: 0, Improvement: 0}); len(p2.Moves) != 0 {
		t.Errorf("second plan moves %+v back", p2.Moves)
	}
}

func TestOneHeavyQueueStays(t *testing.T) {
	// Nothing to gain: the queue alone fills its worker.
	qs := []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 0.99}, {Port: "b", Pair: 0, Worker: 1, Load: 0.05}}
	if p := Compute(twoWorkers(), qs, auto); len(p.Moves) != 0 {
		t.Fatalf("moves %+v", p.Moves)
	}
}

func TestStayingQueuesNeverMove(t *testing.T) {
	qs := []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 0.6, Stay: true}, {Port: "b", Pair: 0, Worker: 0, Load: 0.6}}
	p := Compute(twoWorkers(), qs, auto)
	if len(p.Moves) != 1 || p.Moves[0].Port != "b" {
		t.Fatalf("moves %+v, want b only", p.Moves)
	}
	qs[1].Stay = true
	if p := Compute(twoWorkers(), qs, auto); len(p.Moves) != 0 {
		t.Fatalf("moves %+v, want none", p.Moves)
	}
}

func TestIdleQueuesNeverMove(t *testing.T) {
	qs := []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 1.0}, {Port: "b", Pair: 0, Worker: 0, Load: 0}}
	if p := Compute(twoWorkers(), qs, Config{}); len(p.Moves) != 0 {
		t.Fatalf("moves %+v", p.Moves)
	}
}

func TestImprovementThreshold(t *testing.T) {
	// 0.99+0.01 | 0.9: moving the small queue shrinks the spread from
	// 0.1 to 0.08, the variance by 36%.
	ws := twoWorkers()
	qs := []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 0.99}, {Port: "b", Pair: 0, Worker: 0, Load: 0.01}, {Port: "c", Pair: 0, Worker: 1, Load: 0.9}}
	p := Compute(ws, qs, Config{Threshold: 0.95, Improvement: 0.5})
	if len(p.Moves) != 0 || !strings.Contains(p.Reason, "less than the 50% required") {
		t.Fatalf("improvement 50%%: moves %+v reason %q", p.Moves, p.Reason)
	}
	if p := Compute(ws, qs, Config{Threshold: 0.95, Improvement: 0.25}); len(p.Moves) != 1 || p.Moves[0].Port != "b" {
		t.Fatalf("improvement 25%%: moves %+v reason %q", p.Moves, p.Reason)
	}
}

func TestNUMARule(t *testing.T) {
	ws := []Worker{{ID: 0, CPU: 0, NUMA: 0}, {ID: 1, CPU: 1, NUMA: 1}, {ID: 2, CPU: 2, NUMA: 0}, {ID: 3, CPU: 3, NUMA: 1}}
	qs := []Queue{
		{Port: "a", Pair: 0, Worker: 0, Load: 0.5},
		{Port: "b", Pair: 0, Worker: 0, Load: 0.5},
		{Port: "c", Pair: 0, Worker: 2, Load: 0.4},
	}
	p := Compute(ws, qs, auto)
	if len(p.Moves) != 0 {
		// 1.0 | 0.4 on node 0: moving 0.5 gives 0.5 | 0.9, variance 0.09 -> 0.04.
		for _, m := range p.Moves {
			if ws[m.To].NUMA != ws[m.From].NUMA {
				t.Errorf("move %+v crosses NUMA nodes", m)
			}
		}
	} else {
		t.Fatalf("no move on node 0: %s", p.Reason)
	}
	// Alone on its node, worker 0 cannot shed to node 1's idle workers...
	ws2 := []Worker{{ID: 0, CPU: 0, NUMA: 0}, {ID: 1, CPU: 1, NUMA: 1}}
	qs2 := []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 0.6}, {Port: "b", Pair: 0, Worker: 0, Load: 0.6}}
	if p := Compute(ws2, qs2, auto); len(p.Moves) != 0 || !strings.Contains(p.Reason, "NUMA node 0: one worker") {
		t.Fatalf("moves %+v reason %q", p.Moves, p.Reason)
	}
	// ...unless configured.
	cross := auto
	cross.CrossNUMA = true
	if p := Compute(ws2, qs2, cross); len(p.Moves) != 1 || p.Moves[0].To != 1 {
		t.Fatalf("crossNUMA: moves %+v reason %q", p.Moves, p.Reason)
	}
}

func TestPortPairsStayApart(t *testing.T) {
	// Port a's pairs sit on workers 0 and 1; worker 0 is overloaded by b.
	// Moving b is fine; moving a/0 next to a/1 is not.
	ws := []Worker{{ID: 0, CPU: 0}, {ID: 1, CPU: 1}}
	qs := []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 0.5}, {Port: "b", Pair: 0, Worker: 0, Load: 0.6}, {Port: "a", Pair: 1, Worker: 1, Load: 0.1}}
	p := Compute(ws, qs, auto)
	if len(p.Moves) != 1 || p.Moves[0].Port != "b" {
		t.Fatalf("moves %+v reason %q", p.Moves, p.Reason)
	}
	// Both pairs of a on worker 0: one may go to worker 1.
	qs = []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 0.5}, {Port: "a", Pair: 1, Worker: 0, Load: 0.5}}
	p = Compute(ws, qs, auto)
	if len(p.Moves) != 1 || p.Moves[0].Port != "a" || p.Moves[0].To != 1 {
		t.Fatalf("moves %+v reason %q", p.Moves, p.Reason)
	}
}

func TestFixedLoadCounts(t *testing.T) {
	// Worker 0's uplink keeps it at 70%; its queue moves to worker 1.
	ws := []Worker{{ID: 0, CPU: 0, Fixed: 0.7}, {ID: 1, CPU: 1}}
	qs := []Queue{{Port: "a", Pair: 0, Worker: 0, Load: 0.3}}
	p := Compute(ws, qs, auto)
	if len(p.Moves) != 1 || p.Moves[0].To != 1 {
		t.Fatalf("moves %+v reason %q", p.Moves, p.Reason)
	}
}

func TestPlanProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		nw := 2 + r.IntN(6)
		ws := make([]Worker, nw)
		for i := range ws {
			ws[i] = Worker{ID: 10 + i, CPU: i, NUMA: r.IntN(2), Fixed: r.Float64() * 0.3}
		}
		qs := make([]Queue, r.IntN(12))
		for i := range qs {
			qs[i] = Queue{Port: string(rune('a' + r.IntN(4))), Pair: i, Worker: 10 + r.IntN(nw), Load: r.Float64() * 0.6}
		}
		cfg := Config{Threshold: r.Float64(), Improvement: r.Float64() * 0.5, CrossNUMA: r.IntN(2) == 0}
		p := Compute(ws, qs, cfg)
		moved := map[int]bool{}
		for _, m := range p.Moves {
			if m.From == m.To {
				t.Fatalf("move %+v to itself", m)
			}
			if !cfg.CrossNUMA && ws[m.From-10].NUMA != ws[m.To-10].NUMA {
				t.Fatalf("move %+v crosses NUMA nodes", m)
			}
			if moved[m.Pair] {
				t.Fatalf("queue %d moved twice", m.Pair)
			}
			moved[m.Pair] = true
		}
		if len(p.Moves) > 0 && p.VarAfter > p.VarBefore+1e-12 {
			t.Fatalf("variance rose %v -> %v", p.VarBefore, p.VarAfter)
		}
		if len(p.Moves) == 0 && p.Reason == "" {
			t.Fatalf("no moves and no reason")
		}
		// Loads after are the loads of the moved assignment.
		want := make([]float64, nw)
		for i, w := range ws {
			want[i] = w.Fixed
		}
		for _, q := range apply(qs, p.Moves) {
			want[q.Worker-10] += q.Load
		}
		for i := range want {
			if math.Abs(want[i]-p.After[i]) > 1e-9 {
				t.Fatalf("after %v, recomputed %v", p.After, want)
			}
		}
	}
}

func apply(qs []Queue, moves []Move) []Queue {
	out := append([]Queue(nil), qs...)
	for _, m := range moves {
		for i := range out {
			if out[i].Port == m.Port && out[i].Pair == m.Pair {
				if out[i].Worker != m.From {
					panic("move from the wrong worker")
				}
				out[i].Worker = m.To
			}
		}
	}
	return out
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{"": nil, "0": {0}, "0-3": {0, 1, 2, 3}, "0-1,4,6-7": {0, 1, 4, 6, 7}} {
		got, err := ParseCPUList(in)
		if err != nil || (len(got) != 0 || len(want) != 0) && !reflect.DeepEqual(got, want) {
			t.Errorf("ParseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"x", "1-", "-1", "3-1", "0,,1", "99999", "1-99999"} {
		if _, err := ParseCPUList(bad); err == nil {
			t.Errorf("ParseCPUList(%q): no error", bad)
		}
	}
}

func TestReadTopology(t *testing.T) {
	root := t.TempDir()
	for node, list := range map[string]string{"node0": "0-1,4\n", "node1": "2-3\n"} {
		dir := filepath.Join(root, "devices/system/node", node)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte(list), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	topo, err := ReadTopology(root)
	if err != nil {
		t.Fatal(err)
	}
	want := Topology{0: 0, 1: 0, 4: 0, 2: 1, 3: 1}
	if !reflect.DeepEqual(topo, want) {
		t.Fatalf("topology %v, want %v", topo, want)
	}
	if topo.Node(7) != 0 || topo.Node(-1) != 0 {
		t.Errorf("unknown CPUs are not on node 0")
	}
	// This machine: every CPU it has is on some node.
	if _, err := ReadTopology("/sys"); err != nil {
		t.Fatal(err)
	}
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range []string{"", "0", "0-3,8", "1-", "3-1", "0-8191"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		cpus, err := ParseCPUList(s)
		if err != nil {
			return
		}
		for _, c := range cpus {
			if c < 0 || c >= maxCPU {
				t.Fatalf("%q gave CPU %d", s, c)
			}
		}
	})
}

// BenchmarkCompute: a plan for 128 pairs on 8 workers of 2 nodes, all
// nodes overloaded on one worker.
func BenchmarkCompute(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	ws := make([]Worker, 8)
	for i := range ws {
		ws[i] = Worker{ID: i, CPU: i, NUMA: i % 2}
	}
	qs := make([]Queue, 128)
	for i := range qs {
		w := 0
		if i%2 == 1 {
			w = 1
		}
		if i%8 == 0 {
			w = r.IntN(8)
		}
		qs[i] = Queue{Port: string(rune('a' + i%26)), Pair: i, Worker: w, Load: r.Float64() * 0.1}
	}
	for b.Loop() {
		Compute(ws, qs, Config{Threshold: 0.95, Improvement: 0.25})
	}
}
