// Package balance decides which worker serves which queue: a pure function
// from measured loads to queue moves, after Open vSwitch's
// pmd-rxq-assign=cycles with pmd-auto-lb. The dataplane measures and
// moves; nothing here touches a ring, so the rules are tested on numbers.
package balance

import (
	"fmt"
	"sort"
	"strings"
)

// Worker is one worker thread as the planner sees it.
type Worker struct {
	ID   int
	CPU  int
	NUMA int // the CPU's NUMA node
	// Fixed is the busy share (of one CPU, 0..1) that moving queues cannot
	// take away: the worker's own uplink queue.
	Fixed float64
}

// Queue is one movable queue (a port's queue pair) and its measured load.
type Queue struct {
	Port   string
	Pair   int
	Worker int // Worker.ID serving it now
	// Load is the busy share of one CPU spent serving it over the interval.
	Load float64
	// Stay keeps the queue where it is (its load still counts): the
	// dataplane sets it for a queue it moved lately, so that loads that
	// swing from one interval to the next do not bounce it back and forth.
	Stay bool
}

// Config are the rebalancer's thresholds.
type Config struct {
	// Threshold is the busy share (0..1) above which a worker counts as
	// overloaded; only then is a plan made. 0 plans always (a manual
	// rebalance).
	Threshold float64
	// Improvement is how much (0..1) the variance of the workers' loads
	// must drop for the plan to be worth its moves.
	Improvement float64
	// CrossNUMA lets queues move to a worker on another NUMA node.
	CrossNUMA bool
	// MaxMoves bounds the moves of one plan; 0 means no bound.
	MaxMoves int
}

// Move is one queue changing worker.
type Move struct {
	Port     string
	Pair     int
	From, To int // Worker.ID
	Load     float64
}

// Plan is Compute's answer.
type Plan struct {
	Moves []Move
	// Loads before and after the moves, by position in the workers given.
	Before, After []float64
	// Variance of the loads before and after.
	VarBefore, VarAfter float64
	// Reason says why there are no moves (empty when there are).
	Reason string
}

// Compute plans moves for queues on workers, per group of workers that
// queues may move between (a NUMA node; all workers with cfg.CrossNUMA).
// A group is left alone unless one of its workers' load (Fixed plus its
// queues) exceeds cfg.Threshold. Then queues move one at a time, always
// the move that lowers the variance of the group's loads most (a queue of
// load l from a worker at La to one at Lb helps exactly when l < La-Lb, so
// an idle queue never moves and a move is never undone while the loads
// stay), never onto a worker that already serves another pair of the same
// port unless that takes it from a worker serving two (a port's pairs stay
// on distinct CPUs where they were). A group's moves stand only if its
// variance drops by at least cfg.Improvement; that margin and the
// threshold are the hysteresis that keeps noise from moving queues.
func Compute(workers []Worker, queues []Queue, cfg Config) Plan {
	idx := map[int]int{}
	for i, w := range workers {
		idx[w.ID] = i
	}
	load := make([]float64, len(workers))
	for i, w := range workers {
		load[i] = w.Fixed
	}
	at := make([]int, len(queues)) // position in workers; -1: unknown worker (never moved)
	for i, q := range queues {
		wi, ok := idx[q.Worker]
		if !ok {
			at[i] = -1
			continue
		}
		at[i] = wi
		load[wi] += q.Load
	}
	plan := Plan{Before: append([]float64(nil), load...), VarBefore: variance(load)}
	if len(workers) < 2 {
		plan.After, plan.VarAfter, plan.Reason = plan.Before, plan.VarBefore, "fewer than two workers"
		return plan
	}
	var groups [][]int // positions in workers
	if cfg.CrossNUMA {
		all := make([]int, len(workers))
		for i := range all {
			all[i] = i
		}
		groups = [][]int{all}
	} else {
		byNode := map[int]int{}
		for i, w := range workers {
			g, ok := byNode[w.NUMA]
			if !ok {
				g = len(groups)
				byNode[w.NUMA] = g
				groups = append(groups, nil)
			}
			groups[g] = append(groups[g], i)
		}
	}
	var reasons []string
	final := append([]int(nil), at...)
	for _, g := range groups {
		if _, reason := planGroup(workers, queues, g, load, final, cfg); reason != "" {
			reasons = append(reasons, reason)
		}
	}
	for qi, q := range queues {
		if final[qi] != at[qi] {
			plan.Moves = append(plan.Moves, Move{Port: q.Port, Pair: q.Pair, From: workers[at[qi]].ID, To: workers[final[qi]].ID, Load: q.Load})
		}
	}
	sort.SliceStable(plan.Moves, func(i, j int) bool { return plan.Moves[i].Load > plan.Moves[j].Load })
	plan.After, plan.VarAfter = load, variance(load)
	if len(plan.Moves) == 0 {
		plan.Reason = strings.Join(reasons, "; ")
	}
	return plan
}

// planGroup moves queues among the workers at positions g, updating load
// and at (a queue's worker position) in place when the group's plan
// stands; otherwise it leaves them and says why.
func planGroup(workers []Worker, queues []Queue, g []int, load []float64, at []int, cfg Config) (moved bool, reason string) {
	in := make([]bool, len(workers))
	busiest := g[0]
	for _, i := range g {
		in[i] = true
		if load[i] > load[busiest] {
			busiest = i
		}
	}
	node := fmt.Sprintf("NUMA node %d", workers[g[0]].NUMA)
	if cfg.CrossNUMA {
		node = "all NUMA nodes"
	}
	if len(g) < 2 {
		return false, fmt.Sprintf("%s: one worker", node)
	}
	if load[busiest] <= cfg.Threshold {
		return false, fmt.Sprintf("%s: no worker above %.0f%% (busiest: CPU %d at %.1f%%)", node, 100*cfg.Threshold, workers[busiest].CPU, 100*load[busiest])
	}
	gl := make([]float64, len(workers))
	copy(gl, load)
	ga := append([]int(nil), at...)
	type portWorker struct {
		port string
		w    int
	}
	same := map[portWorker]int{} // pairs of a port on a worker
	for qi, q := range queues {
		if ga[qi] >= 0 {
			same[portWorker{q.Port, ga[qi]}]++
		}
	}
	maxMoves := cfg.MaxMoves
	if maxMoves <= 0 {
		maxMoves = len(queues)
	}
	for range maxMoves {
		bestQ, bestW, bestGain := -1, -1, 0.0
		for qi, q := range queues {
			from := ga[qi]
			if from < 0 || !in[from] || q.Load <= 0 || q.Stay {
				continue
			}
			for _, to := range g {
				if to == from {
					continue
				}
				if same[portWorker{q.Port, to}] > 0 && same[portWorker{q.Port, from}] < 2 {
					continue
				}
				// The sum of squared loads drops by 2·l·(La-Lb-l).
				gain := q.Load * (gl[from] - gl[to] - q.Load)
				if gain > bestGain+1e-12 {
					bestQ, bestW, bestGain = qi, to, gain
				}
			}
		}
		if bestQ < 0 {
			break
		}
		q, from := queues[bestQ], ga[bestQ]
		gl[from] -= q.Load
		gl[bestW] += q.Load
		same[portWorker{q.Port, from}]--
		same[portWorker{q.Port, bestW}]++
		ga[bestQ] = bestW
	}
	before, after := groupVariance(load, g), groupVariance(gl, g)
	improved := 0.0
	if before > 0 {
		improved = (before - after) / before
	}
	if improved <= 0 {
		return false, fmt.Sprintf("%s: no allowed move lowers the imbalance", node)
	}
	if improved < cfg.Improvement {
		return false, fmt.Sprintf("%s: moves would lower the load variance by %.1f%%, less than the %.0f%% required", node, 100*improved, 100*cfg.Improvement)
	}
	copy(load, gl)
	copy(at, ga)
	return true, ""
}

func groupVariance(load []float64, g []int) float64 {
	l := make([]float64, len(g))
	for i, w := range g {
		l[i] = load[w]
	}
	return variance(l)
}

// variance is the population variance of the loads.
func variance(l []float64) float64 {
	if len(l) == 0 {
		return 0
	}
	var sum float64
	for _, x := range l {
		sum += x
	}
	mean := sum / float64(len(l))
	var v float64
	for _, x := range l {
		v += (x - mean) * (x - mean)
	}
	return v / float64(len(l))
}
