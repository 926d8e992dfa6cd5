package dataplane

// The rebalancer: every interval it measures each queue pair's busy share
// (the busy time its bursts took, a clock read per burst, none per frame)
// and each worker's, asks dataplane/balance for a plan and moves the
// planned pairs to their new workers.
//
// A move never loses or reorders a pair's frames: the pair's TX ring is
// served under its lock by one worker at a time. The old worker drops the
// pair from its list and is waited for until it has started a loop
// iteration with the new list (it can then neither serve the ring nor ask
// its guest not to kick); the ring's kick eventfd moves to the new
// worker's epoll set under the ring's lock (where the kick hooks read the
// pair's worker); then the new worker gets the pair and a wake-up, serves
// what waited in the ring and re-arms the guest's kicks before it sleeps.
// Frames the guest sends meanwhile wait in its ring, in order.

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/balance"
)

// RebalanceConfig configures the rebalancer.
type RebalanceConfig struct {
	// Interval between two looks at the loads; 0 turns the automatic
	// rebalancer off (Rebalance still runs on demand).
	Interval time.Duration
	// Threshold is the busy share (percent of one CPU) above which a
	// worker counts as overloaded; default 95.
	Threshold int
	// Improvement is how much (percent) the variance of the workers'
	// loads must drop for the moves to happen; default 25.
	Improvement int
	// CrossNUMA lets pairs move to (and be placed on) workers of another
	// NUMA node.
	CrossNUMA bool
}

// Rebalancer defaults, as Open vSwitch's pmd-auto-lb has them.
const (
	DefaultRebalanceThreshold   = 95
	DefaultRebalanceImprovement = 25
	// MinRebalanceInterval bounds how often queues may move.
	MinRebalanceInterval = 100 * time.Millisecond
)

// Validate names the field that is out of range.
func (c RebalanceConfig) Validate() error {
	var errs []error
	if c.Interval < 0 || (c.Interval > 0 && c.Interval < MinRebalanceInterval) {
		errs = append(errs, fmt.Errorf("rebalance.interval: %v is neither 0 (off) nor at least %v", c.Interval, MinRebalanceInterval))
	}
	if c.Threshold < 0 || c.Threshold > 100 {
		errs = append(errs, fmt.Errorf("rebalance.threshold: %d is outside 0..100 (percent of a CPU; 0 = default %d)", c.Threshold, DefaultRebalanceThreshold))
	}
	if c.Improvement < 0 || c.Improvement > 100 {
		errs = append(errs, fmt.Errorf("rebalance.improvement: %d is outside 0..100 (percent; 0 = default %d)", c.Improvement, DefaultRebalanceImprovement))
	}
	return errors.Join(errs...)
}

func (c RebalanceConfig) withDefaults() RebalanceConfig {
	if c.Threshold == 0 {
		c.Threshold = DefaultRebalanceThreshold
	}
	if c.Improvement == 0 {
		c.Improvement = DefaultRebalanceImprovement
	}
	return c
}

func (c RebalanceConfig) String() string {
	if c.Interval == 0 {
		return fmt.Sprintf("off (on demand: improvement %d%%, crossNUMA %v)", c.Improvement, c.CrossNUMA)
	}
	return fmt.Sprintf("every %v, threshold %d%%, improvement %d%%, crossNUMA %v", c.Interval, c.Threshold, c.Improvement, c.CrossNUMA)
}

// QueueMove is one pair the rebalancer moved.
type QueueMove struct {
	Time     time.Time
	Port     string
	Pair     int
	FromCPU  int
	ToCPU    int
	Load     float64 // the pair's busy share of a CPU when it moved (0..1)
	Manual   bool    // asked for (Rebalance), not automatic
	Failures string  // non-empty: the move did not happen, and why
}

// RebalanceRun is the outcome of one look at the loads.
type RebalanceRun struct {
	Time     time.Time
	Manual   bool
	Interval time.Duration // the loads were measured over it
	// Worker loads (busy share of a CPU, by worker) before and, as
	// planned, after the moves.
	Before, After []float64
	Moves         []QueueMove
	Reason        string // why nothing moved
}

// RebalanceStatus is the rebalancer's configuration and history.
type RebalanceStatus struct {
	Config  RebalanceConfig
	Runs    uint64
	Moved   uint64        // pairs moved since start
	LastRun *RebalanceRun // nil before the first
	// LastMoves are the most recent moves, oldest first (at most
	// keepMoves).
	LastMoves []QueueMove
}

const keepMoves = 32

// moveTimeout bounds the wait for the old worker to let go of a pair;
// a loop iteration takes microseconds, and a worker that does not finish
// one in this time is stuck (health reports it): the pair stays.
const moveTimeout = time.Second

// settleRuns is how many looks a moved pair stays where it went: its
// load there is measured at least once before it may move again.
const settleRuns = 2

type rebalancer struct {
	d     *Dataplane
	mu    sync.Mutex // one run at a time; guards the fields below
	prev  loadSample
	runs  uint64
	moves uint64                 // pairs moved since start
	moved map[*assignment]uint64 // the run that last moved it
	last  *RebalanceRun
	hist  []QueueMove

	quit chan struct{}
	done chan struct{}
}

// loadSample is every counter a plan needs, at one time.
type loadSample struct {
	at      time.Time
	workers []uint64 // busyNs by worker index
	uplink  []uint64 // upBusyNs by worker index
	queues  map[*assignment]uint64
}

func (d *Dataplane) sample() loadSample {
	s := loadSample{at: time.Now(), workers: make([]uint64, len(d.workers)), uplink: make([]uint64, len(d.workers)), queues: map[*assignment]uint64{}}
	for i, w := range d.workers {
		s.workers[i], s.uplink[i] = w.busyNs.Load(), w.upBusyNs.Load()
	}
	d.mu.Lock()
	for _, p := range d.byName {
		for _, a := range p.assigns {
			s.queues[a] = a.busyNs.Load()
		}
	}
	d.mu.Unlock()
	return s
}

func (d *Dataplane) startRebalancer() *rebalancer {
	r := &rebalancer{d: d, prev: d.sample(), moved: map[*assignment]uint64{}, quit: make(chan struct{}), done: make(chan struct{})}
	if d.rebal.Interval == 0 {
		close(r.done)
		return r
	}
	go r.routine()
	return r
}

func (r *rebalancer) stop() {
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	<-r.done
}

func (r *rebalancer) routine() {
	defer close(r.done)
	t := time.NewTicker(r.d.rebal.Interval)
	defer t.Stop()
	for {
		select {
		case <-r.quit:
			return
		case <-t.C:
			r.mu.Lock()
			r.runLocked(false)
			r.mu.Unlock()
		}
	}
}

// Rebalance measures the loads over window (from the last automatic look
// when window is 0 and the rebalancer runs, else over one second) and
// moves pairs if that lowers the variance of the worker loads by the
// configured improvement; the overload threshold does not apply.
func (d *Dataplane) Rebalance(window time.Duration) RebalanceRun {
	r := d.balance
	r.mu.Lock()
	defer r.mu.Unlock()
	if window > 0 || d.rebal.Interval == 0 {
		if window <= 0 {
			window = time.Second
		}
		r.prev = d.sample()
		r.mu.Unlock()
		select {
		case <-time.After(window):
		case <-r.quit:
		}
		r.mu.Lock()
	}
	return r.runLocked(true)
}

// RebalanceStatus returns the configuration, the last run and the last
// moves.
func (d *Dataplane) RebalanceStatus() RebalanceStatus {
	r := d.balance
	r.mu.Lock()
	defer r.mu.Unlock()
	st := RebalanceStatus{Config: d.rebal, Runs: r.runs, Moved: r.moves, LastMoves: append([]QueueMove(nil), r.hist...)}
	if r.last != nil {
		l := *r.last
		st.LastRun = &l
	}
	return st
}

// runLocked measures, plans and moves.
func (r *rebalancer) runLocked(manual bool) RebalanceRun {
	d := r.d
	// Moves and port changes wait for each other: the plan is made on the
	// assignments it moves.
	d.placeMu.Lock()
	defer d.placeMu.Unlock()
	cur := d.sample()
	prev := r.prev
	r.prev = cur
	run := RebalanceRun{Time: cur.at, Manual: manual, Interval: cur.at.Sub(prev.at)}
	ns := float64(run.Interval.Nanoseconds())
	ws := make([]balance.Worker, len(d.workers))
	for i, w := range d.workers {
		ws[i] = balance.Worker{ID: i, CPU: w.cpu, NUMA: d.topo.Node(w.cpu),
			Fixed: float64(cur.uplink[i]-prev.uplink[i]) / ns}
	}
	var qs []balance.Queue
	var as []*assignment
	for a, busy := range cur.queues {
		before, ok := prev.queues[a]
		if !ok || ns <= 0 {
			continue // new since the last look: no measurement yet
		}
		last, wasMoved := r.moved[a]
		qs = append(qs, balance.Queue{Port: a.port.dev.Config().Name, Pair: a.pair, Worker: a.port.workers[a.pair].Load().id,
			Load: float64(busy-before) / ns, Stay: wasMoved && r.runs-last < settleRuns})
		as = append(as, a)
	}
	cfg := balance.Config{Threshold: float64(d.rebal.Threshold) / 100, Improvement: float64(d.rebal.Improvement) / 100, CrossNUMA: d.rebal.CrossNUMA}
	if manual {
		cfg.Threshold = 0
	}
	plan := balance.Compute(ws, sortQueues(qs, as), cfg)
	run.Before, run.After, run.Reason = plan.Before, plan.After, plan.Reason
	for _, m := range plan.Moves {
		a := findAssignment(as, qs, m)
		mv := QueueMove{Time: time.Now(), Port: m.Port, Pair: m.Pair, FromCPU: d.workers[m.From].cpu, ToCPU: d.workers[m.To].cpu, Load: m.Load, Manual: manual}
		if err := d.move(a, d.workers[m.From], d.workers[m.To]); err != nil {
			mv.Failures = err.Error()
			d.log.Warn("queue pair not moved", "port", m.Port, "pair", m.Pair, "fromCPU", mv.FromCPU, "toCPU", mv.ToCPU, "err", err)
		} else {
			r.moved[a] = r.runs
			r.moves++
			d.log.Info("queue pair moved to another worker", "port", m.Port, "pair", m.Pair, "fromCPU", mv.FromCPU, "toCPU", mv.ToCPU,
				"load", fmt.Sprintf("%.1f%%", 100*m.Load), "manual", manual)
		}
		run.Moves = append(run.Moves, mv)
		r.hist = append(r.hist, mv)
	}
	if len(r.hist) > keepMoves {
		r.hist = append([]QueueMove(nil), r.hist[len(r.hist)-keepMoves:]...)
	}
	if len(plan.Moves) > 0 {
		d.log.Info("rebalanced queue pairs", "moves", len(plan.Moves), "before", percents(plan.Before), "after", percents(plan.After), "manual", manual)
	} else if manual {
		d.log.Info("rebalance: nothing to move", "reason", plan.Reason, "loads", percents(plan.Before))
	} else {
		d.log.Debug("rebalance: nothing to move", "reason", plan.Reason, "loads", percents(plan.Before))
	}
	for a, last := range r.moved {
		if r.runs-last >= settleRuns || a.port.removed {
			delete(r.moved, a) // settled, or its port is gone
		}
	}
	r.runs++
	r.last = &run
	return run
}

// sortQueues orders the queues by port and pair (map order would make
// plans with ties differ from run to run), keeping as in step.
func sortQueues(qs []balance.Queue, as []*assignment) []balance.Queue {
	idx := make([]int, len(qs))
	for i := range idx {
		idx[i] = i
	}
	less := func(i, j int) bool {
		if qs[i].Port != qs[j].Port {
			return qs[i].Port < qs[j].Port
		}
		return qs[i].Pair < qs[j].Pair
	}
	// insertion sort on both slices: a node has tens of pairs
	for i := 1; i < len(qs); i++ {
		for j := i; j > 0 && less(j, j-1); j-- {
			qs[j], qs[j-1] = qs[j-1], qs[j]
			as[j], as[j-1] = as[j-1], as[j]
		}
	}
	return qs
}

func findAssignment(as []*assignment, qs []balance.Queue, m balance.Move) *assignment {
	for i, q := range qs {
		if q.Port == m.Port && q.Pair == m.Pair {
			return as[i]
		}
	}
	return nil
}

func percents(l []float64) []string {
	out := make([]string, len(l))
	for i, x := range l {
		out[i] = fmt.Sprintf("%.1f%%", 100*x)
	}
	return out
}

// move takes pair a from worker from and gives it to worker to (see the
// top of this file). The caller holds placeMu.
func (d *Dataplane) move(a *assignment, from, to *worker) error {
	if a == nil || a.port.removed {
		return errors.New("the port was removed")
	}
	p := a.port
	if p.workers[a.pair].Load() != from || from == to {
		return errors.New("the pair changed worker meanwhile")
	}
	if !from.take(a) {
		return errors.New("the pair is not on its worker's list")
	}
	if !from.quiesce(moveTimeout) {
		from.add(a)
		return fmt.Errorf("worker on CPU %d did not let go of the pair within %v", from.cpu, moveTimeout)
	}
	v := a.tx
	v.Lock()
	if fd := v.KickFD(); fd >= 0 {
		from.unwatch(v, fd)
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd), Pad: int32(v.ID)}
		if err := unix.EpollCtl(to.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			d.log.Error("cannot wait on kick eventfd", "port", v.Port.Name(), "vring", v.Index, "err", err)
		}
	}
	p.workers[a.pair].Store(to)
	v.Unlock()
	to.add(a)
	return nil
}

// NUMANode returns the NUMA node of cpu in the dataplane's topology.
func (d *Dataplane) NUMANode(cpu int) int { return d.topo.Node(cpu) }

// CrossNUMA reports whether a port's pairs may be placed on, and moved to,
// workers of several NUMA nodes.
func (d *Dataplane) CrossNUMA() bool { return d.rebal.CrossNUMA }
