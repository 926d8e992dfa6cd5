package ctl

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// queues: which slot and worker serve which port queue pair and how
// loaded they are, after ovs-appctl dpif-netdev/pmd-rxq-show, and what
// the rebalancer did. Placement comes from GetCapacity, load from two
// GetStats samples, the moves from GetRebalance.

type slotLoadJSON struct {
	Slot     string `json:"slot"`
	CPU      int32  `json:"cpu"`
	NumaNode *int32 `json:"numa_node"` // null: the slot is not in the capacity report
	PortID   string `json:"port_id"`   // "": free
	// BusyPercent sums the pairs' busy shares (of one CPU); absent
	// without an interval.
	BusyPercent *float64        `json:"busy_percent,omitempty"`
	Queues      []queueLoadJSON `json:"queues"`
}

type queueLoadJSON struct {
	Port      string `json:"port"`
	Pair      uint32 `json:"pair"`
	RxEnabled bool   `json:"rx_enabled"`
	TxEnabled bool   `json:"tx_enabled"`
	BusyNs    uint64 `json:"busy_ns"`
	RxPackets uint64 `json:"rx_packets"` // toward the guest
	TxPackets uint64 `json:"tx_packets"` // from the guest
	// Over the interval; absent with --interval 0 or when the pair has
	// no stats in both samples.
	BusyPercent        *float64 `json:"busy_percent,omitempty"`
	RxPacketsPerSecond *float64 `json:"rx_packets_per_second,omitempty"`
	TxPacketsPerSecond *float64 `json:"tx_packets_per_second,omitempty"`
	// The worker serving the pair now: its CPU differs from the slot's
	// when the rebalancer moved the pair. Absent from an older agent.
	WorkerCPU *int32 `json:"worker_cpu,omitempty"`
	NumaNode  *int32 `json:"worker_numa_node,omitempty"`
	Bursts    uint64 `json:"bursts"`
	// NsPerBurst is the cost of a burst that moved frames: over the
	// interval, or since the start with --interval 0; absent without
	// bursts.
	NsPerBurst *float64 `json:"ns_per_burst,omitempty"`
	// What offloads did for the frames toward the guest (the software
	// part of it is in busy_ns); absent without stats, the rates also
	// without an interval.
	Offload          *offloadJSON[uint64]  `json:"offload,omitempty"`
	OffloadPerSecond *offloadJSON[float64] `json:"offload_per_second,omitempty"`

	noStats bool // the agent reported no stats for the pair
}

type queuesJSON struct {
	TimeUnixNano    int64          `json:"time_unix_nano"`
	IntervalSeconds float64        `json:"interval_seconds"`
	Slots           []slotLoadJSON `json:"slots"`
	Workers         []workerJSON   `json:"workers,omitempty"`
	Rebalance       *rebalanceJSON `json:"rebalance,omitempty"` // absent from an agent without a rebalancer
}

type workerJSON struct {
	CPU          int32  `json:"cpu"`
	NumaNode     int32  `json:"numa_node"`
	QueuePairs   uint32 `json:"queue_pairs"`
	ActiveRings  uint32 `json:"active_rings"` // TX rings its passes visit; the rest are parked
	BusyNs       uint64 `json:"busy_ns"`
	UplinkBusyNs uint64 `json:"uplink_busy_ns"`
	// Over the interval (share of its CPU); absent with --interval 0.
	BusyPercent       *float64 `json:"busy_percent,omitempty"`
	UplinkBusyPercent *float64 `json:"uplink_busy_percent,omitempty"`
}

type rebalanceJSON struct {
	IntervalSeconds    float64         `json:"interval_seconds"` // 0: automatic rebalancing is off
	ThresholdPercent   uint32          `json:"threshold_percent"`
	ImprovementPercent uint32          `json:"improvement_percent"`
	CrossNUMA          bool            `json:"cross_numa"`
	Runs               uint64          `json:"runs"`
	LastRun            *rebalanceRun   `json:"last_run,omitempty"`
	LastMoves          []queueMoveJSON `json:"last_moves"`
}

type rebalanceRun struct {
	TimeUnixNano    int64            `json:"time_unix_nano"`
	Manual          bool             `json:"manual"`
	IntervalSeconds float64          `json:"interval_seconds"`
	Workers         []workerLoadJSON `json:"workers"`
	Moves           []queueMoveJSON  `json:"moves"`
	Reason          string           `json:"reason,omitempty"`
}

type workerLoadJSON struct {
	CPU           int32   `json:"cpu"`
	NumaNode      int32   `json:"numa_node"`
	BeforePercent float64 `json:"before_percent"`
	AfterPercent  float64 `json:"after_percent"`
}

type queueMoveJSON struct {
	TimeUnixNano int64   `json:"time_unix_nano"`
	Port         string  `json:"port"`
	Pair         uint32  `json:"pair"`
	FromCPU      int32   `json:"from_cpu"`
	ToCPU        int32   `json:"to_cpu"`
	LoadPercent  float64 `json:"load_percent"`
	Manual       bool    `json:"manual"`
	Error        string  `json:"error,omitempty"`
}

// queueRowsBy indexes queue rows by port and pair.
type pairKey struct {
	port string
	pair uint32
}

func queuesSetup(fs *pflag.FlagSet) runFunc {
	interval := DefaultInterval
	fs.Var(&durationValue{p: &interval}, "interval", "measure the load over `DURATION`; 0 shows cumulative counters")
	return func(ctx context.Context, c *cli, args []string) error {
		var only string
		var ids []string
		if len(args) == 1 {
			only, ids = args[0], args
		}
		capacity, err := call(ctx, c, agentv1.AgentClient.GetCapacity, &agentv1.GetCapacityRequest{})
		if err != nil {
			return err
		}
		s, err := c.sampleStats(ctx, ids, interval)
		if err != nil {
			return err
		}
		ports := s.rows(nil)
		if only != "" && len(ports) == 0 {
			return fmt.Errorf("NotFound: no port %q", only)
		}
		out := queueLoads(capacity, s, ports, only)
		out.Workers = workerLoads(s)
		reb, err := call(ctx, c, agentv1.AgentClient.GetRebalance, &agentv1.GetRebalanceRequest{})
		switch {
		case status.Code(err) == codes.Unimplemented:
		case err != nil:
			return err
		default:
			out.Rebalance = rebalanceStatus(reb, only)
		}
		if c.output == "json" {
			return writeJSON(c.stdout, out)
		}
		return c.queuesTable(out, s.prev != nil)
	}
}

func queueLoads(capacity *agentv1.Capacity, s statsSample, ports []portRow, only string) queuesJSON {
	rows := map[pairKey]queueRow{}
	for _, p := range ports {
		for _, q := range p.queues {
			rows[pairKey{p.ps.GetId(), q.q.GetPair()}] = q
		}
	}
	used := map[pairKey]bool{}
	load := func(port string, pair uint32) queueLoadJSON {
		key := pairKey{port, pair}
		used[key] = true
		j := queueLoadJSON{Port: port, Pair: pair}
		q, ok := rows[key]
		if !ok {
			j.noStats = true
			return j
		}
		j.RxEnabled, j.TxEnabled = q.q.GetRxEnabled(), q.q.GetTxEnabled()
		j.BusyNs, j.RxPackets, j.TxPackets, j.Bursts = q.cur.busyNs, q.cur.rxPkts, q.cur.txPkts, q.cur.bursts
		off := newOffloadJSON(q.cur.offload)
		j.Offload = &off
		if len(s.cur.GetWorkers()) > 0 { // an agent that reports the serving worker

			cpu, numa := q.q.GetCpu(), q.q.GetNumaNode()
			j.WorkerCPU, j.NumaNode = &cpu, &numa
		}
		cost := q.cur
		if q.delta != nil {
			r := q.delta.per(s.seconds)
			busy, rx, tx := round3(r.busyPct), round3(r.rxPps), round3(r.txPps)
			j.BusyPercent, j.RxPacketsPerSecond, j.TxPacketsPerSecond = &busy, &rx, &tx
			var o [len(offloadKinds)]float64
			for i, v := range r.offload {
				o[i] = round3(v)
			}
			offRate := newOffloadJSON(o)
			j.OffloadPerSecond = &offRate
			cost = *q.delta
		}
		if cost.bursts > 0 {
			ns := round3(float64(cost.busyNs) / float64(cost.bursts))
			j.NsPerBurst = &ns
		}
		return j
	}
	out := queuesJSON{TimeUnixNano: s.cur.GetTimeUnixNano(), IntervalSeconds: round3(s.seconds), Slots: []slotLoadJSON{}}
	cpus := append([]*agentv1.CPU(nil), capacity.GetCpus()...)
	sort.SliceStable(cpus, func(i, j int) bool { return cpus[i].GetId() < cpus[j].GetId() })
	for _, cpu := range cpus {
		for _, slot := range cpu.GetSlots() {
			if only != "" && slot.GetPortId() != only {
				continue
			}
			numa := cpu.GetNumaNode()
			sj := slotLoadJSON{Slot: slot.GetId(), CPU: cpu.GetId(), NumaNode: &numa, PortID: slot.GetPortId(), Queues: []queueLoadJSON{}}
			pairs := append([]uint32(nil), slot.GetPairs()...)
			sort.Slice(pairs, func(i, j int) bool { return pairs[i] < pairs[j] })
			for _, pair := range pairs {
				sj.Queues = append(sj.Queues, load(slot.GetPortId(), pair))
			}
			out.Slots = append(out.Slots, sj)
		}
	}
	// Pairs the capacity report did not place (it changed between the
	// requests): listed after the rest, under the slot their stats name.
	for _, p := range ports {
		for _, q := range p.queues {
			key := pairKey{p.ps.GetId(), q.q.GetPair()}
			if used[key] || (only != "" && key.port != only) {
				continue
			}
			out.Slots = append(out.Slots, slotLoadJSON{Slot: q.q.GetSlot(), CPU: q.q.GetCpu(), PortID: key.port, Queues: []queueLoadJSON{load(key.port, key.pair)}})
		}
	}
	if s.prev != nil {
		for i := range out.Slots {
			var sum float64
			for _, q := range out.Slots[i].Queues {
				if q.BusyPercent != nil {
					sum += *q.BusyPercent
				}
			}
			sum = round3(sum)
			out.Slots[i].BusyPercent = &sum
		}
	}
	return out
}

// workerLoads is every worker's load: cumulative, and over the interval.
func workerLoads(s statsSample) []workerJSON {
	prev := map[int32]*agentv1.WorkerStats{}
	for _, w := range s.prev.GetWorkers() {
		prev[w.GetId()] = w
	}
	var out []workerJSON
	for _, w := range s.cur.GetWorkers() {
		j := workerJSON{CPU: w.GetCpu(), NumaNode: w.GetNumaNode(), QueuePairs: w.GetQueuePairs(), ActiveRings: w.GetActiveRings(), BusyNs: w.GetBusyNs(), UplinkBusyNs: w.GetUplinkBusyNs()}
		if p, ok := prev[w.GetId()]; ok && s.seconds > 0 {
			d := func(cur, old uint64) float64 {
				if cur < old {
					return float64(cur)
				}
				return float64(cur - old)
			}
			busy := round3(100 * d(w.GetBusyNs(), p.GetBusyNs()) / 1e9 / s.seconds)
			up := round3(100 * d(w.GetUplinkBusyNs(), p.GetUplinkBusyNs()) / 1e9 / s.seconds)
			j.BusyPercent, j.UplinkBusyPercent = &busy, &up
		}
		out = append(out, j)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CPU < out[j].CPU })
	return out
}

// rebalanceStatus converts the agent's answer; only, when set, keeps the
// moves of that port.
func rebalanceStatus(r *agentv1.RebalanceStatus, only string) *rebalanceJSON {
	c := r.GetConfig()
	out := &rebalanceJSON{IntervalSeconds: round3(float64(c.GetIntervalMs()) / 1000), ThresholdPercent: c.GetThresholdPercent(),
		ImprovementPercent: c.GetImprovementPercent(), CrossNUMA: c.GetCrossNuma(), Runs: r.GetRuns(), LastMoves: []queueMoveJSON{}}
	if r.GetLastRun() != nil {
		run := runJSON(r.GetLastRun())
		out.LastRun = &run
	}
	for _, m := range r.GetLastMoves() {
		if only == "" || m.GetPortId() == only {
			out.LastMoves = append(out.LastMoves, moveJSON(m))
		}
	}
	return out
}

func runJSON(r *agentv1.RebalanceRun) rebalanceRun {
	out := rebalanceRun{TimeUnixNano: r.GetTimeUnixNano(), Manual: r.GetManual(), IntervalSeconds: round3(float64(r.GetIntervalMs()) / 1000),
		Reason: r.GetReason(), Workers: []workerLoadJSON{}, Moves: []queueMoveJSON{}}
	for _, w := range r.GetWorkers() {
		out.Workers = append(out.Workers, workerLoadJSON{CPU: w.GetCpu(), NumaNode: w.GetNumaNode(), BeforePercent: w.GetBeforePercent(), AfterPercent: w.GetAfterPercent()})
	}
	for _, m := range r.GetMoves() {
		out.Moves = append(out.Moves, moveJSON(m))
	}
	return out
}

func moveJSON(m *agentv1.QueueMove) queueMoveJSON {
	return queueMoveJSON{TimeUnixNano: m.GetTimeUnixNano(), Port: m.GetPortId(), Pair: m.GetPair(), FromCPU: m.GetFromCpu(), ToCPU: m.GetToCpu(),
		LoadPercent: m.GetLoadPercent(), Manual: m.GetManual(), Error: m.GetError()}
}

func (c *cli) queuesTable(out queuesJSON, rated bool) error {
	wide := c.output == "wide"
	t := newTable(c.stdout)
	head := []string{"CPU", "NUMA", "SLOT", "PORT", "PAIR", "ENABLED", "WORKER", "BUSY TIME", "NS/BURST", "RX PKTS", "TX PKTS", "OFFLOAD"}
	if rated {
		head = []string{"CPU", "NUMA", "SLOT", "PORT", "PAIR", "ENABLED", "WORKER", "BUSY", "NS/BURST", "RX PPS", "TX PPS", "OFFLOAD/S"}
	}
	if !wide {
		head = head[:len(head)-1]
	}
	t.row(head...)
	for _, s := range out.Slots {
		numa := ""
		if s.NumaNode != nil {
			numa = fmt.Sprint(*s.NumaNode)
		}
		lead := []string{fmt.Sprint(s.CPU), numa, s.Slot}
		if len(s.Queues) == 0 {
			t.row(append(lead, "(free)", "", "", "", "", "", "", "", "")[:len(head)]...)
			continue
		}
		for _, q := range s.Queues {
			en := enabled(&agentv1.QueueStats{RxEnabled: q.RxEnabled, TxEnabled: q.TxEnabled})
			if q.noStats {
				en = ""
			}
			worker := ""
			if q.WorkerCPU != nil {
				worker = fmt.Sprintf("cpu %d", *q.WorkerCPU)
				if *q.WorkerCPU != s.CPU {
					worker += " (moved)"
				}
			}
			cost := "-"
			if q.NsPerBurst != nil {
				cost = fmt.Sprintf("%.0f", *q.NsPerBurst)
			}
			row := append(lead[:3:3], q.Port, fmt.Sprint(q.Pair), en, worker)
			switch {
			case q.noStats:
				row = append(row, "", "", "", "")
			case !rated:
				row = append(row, busyTime(q.BusyNs), cost, count(q.RxPackets), count(q.TxPackets))
				if wide {
					row = append(row, offloadCounts([...]uint64{q.Offload.GSOWhole, q.Offload.GSOSegmented, q.Offload.CsumSoftware}))
				}
			case q.BusyPercent == nil:
				row = append(row, "", "", "", "")
			default:
				row = append(row, percent(*q.BusyPercent), cost, pps(*q.RxPacketsPerSecond), pps(*q.TxPacketsPerSecond))
				if wide {
					o := q.OffloadPerSecond
					row = append(row, offloadRates([...]float64{o.GSOWhole, o.GSOSegmented, o.CsumSoftware}))
				}
			}
			for len(row) < len(head) { // no stats: "-"
				row = append(row, "")
			}
			t.row(row...)
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	if len(out.Workers) > 0 {
		fmt.Fprintln(c.stdout)
		t = newTable(c.stdout)
		if rated {
			t.row("WORKER", "NUMA", "PAIRS", "ACTIVE", "BUSY", "UPLINK")
		} else {
			t.row("WORKER", "NUMA", "PAIRS", "ACTIVE", "BUSY TIME", "UPLINK")
		}
		for _, w := range out.Workers {
			row := []string{fmt.Sprintf("cpu %d", w.CPU), fmt.Sprint(w.NumaNode), fmt.Sprint(w.QueuePairs), fmt.Sprint(w.ActiveRings)}
			if rated && w.BusyPercent != nil {
				row = append(row, percent(*w.BusyPercent), percent(*w.UplinkBusyPercent))
			} else {
				row = append(row, busyTime(w.BusyNs), busyTime(w.UplinkBusyNs))
			}
			t.row(row...)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if r := out.Rebalance; r != nil {
		fmt.Fprintln(c.stdout)
		c.rebalanceSummary(r)
		if len(r.LastMoves) > 0 {
			return c.movesTable(r.LastMoves)
		}
	}
	return nil
}

func (c *cli) rebalanceSummary(r *rebalanceJSON) {
	numa := "within a NUMA node"
	if r.CrossNUMA {
		numa = "across NUMA nodes"
	}
	mode := fmt.Sprintf("every %gs when a worker is above %d%% busy", r.IntervalSeconds, r.ThresholdPercent)
	if r.IntervalSeconds == 0 {
		mode = "automatic off (vhostmqctl queues rebalance runs it)"
	}
	fmt.Fprintf(c.stdout, "Rebalancer: %s, if the load variance drops %d%%, %s; %d runs", mode, r.ImprovementPercent, numa, r.Runs)
	if l := r.LastRun; l != nil {
		fmt.Fprintf(c.stdout, ", last at %s: %d moves", clock(l.TimeUnixNano), len(l.Moves))
		if l.Reason != "" {
			fmt.Fprintf(c.stdout, " (%s)", l.Reason)
		}
	}
	fmt.Fprintln(c.stdout)
}

func (c *cli) movesTable(moves []queueMoveJSON) error {
	t := newTable(c.stdout)
	t.row("MOVED", "PORT", "PAIR", "FROM", "TO", "LOAD", "BY", "ERROR")
	for _, m := range moves {
		by := "auto"
		if m.Manual {
			by = "manual"
		}
		t.row(clock(m.TimeUnixNano), m.Port, fmt.Sprint(m.Pair), fmt.Sprintf("cpu %d", m.FromCPU), fmt.Sprintf("cpu %d", m.ToCPU),
			percent(m.LoadPercent), by, m.Error)
	}
	return t.flush()
}

// clock formats an agent timestamp as UTC time of day.
func clock(ns int64) string { return time.Unix(0, ns).UTC().Format("15:04:05") }

// queues rebalance: measure now and move if it helps.
func queuesRebalanceSetup(fs *pflag.FlagSet) runFunc {
	window := time.Second
	fs.Var(&durationValue{p: &window}, "window", "measure the loads over `DURATION` (at most 60s)")
	return func(ctx context.Context, c *cli, _ []string) error {
		if window <= 0 || window > 60*time.Second {
			return usageErrorf("--window: %v is outside (0, 60s]", window)
		}
		if c.timeout > 0 {
			c.timeout += window // the agent measures for window before it answers
		}
		r, err := call(ctx, c, agentv1.AgentClient.Rebalance, &agentv1.RebalanceRequest{WindowMs: uint32(window.Milliseconds())})
		if err != nil {
			return err
		}
		run := runJSON(r)
		if c.output == "json" {
			return writeJSON(c.stdout, run)
		}
		t := newTable(c.stdout)
		t.row("WORKER", "NUMA", "BEFORE", "AFTER")
		for _, w := range run.Workers {
			t.row(fmt.Sprintf("cpu %d", w.CPU), fmt.Sprint(w.NumaNode), percent(w.BeforePercent), percent(w.AfterPercent))
		}
		if err := t.flush(); err != nil {
			return err
		}
		if len(run.Moves) == 0 {
			fmt.Fprintf(c.stdout, "Nothing moved: %s\n", run.Reason)
			return nil
		}
		fmt.Fprintln(c.stdout)
		return c.movesTable(run.Moves)
	}
}
