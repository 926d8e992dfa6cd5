package ctl

import (
	"context"
	"flag"
	"fmt"
	"sort"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// queues: which slot serves which port queue pair and how loaded it is,
// after ovs-appctl dpif-netdev/pmd-rxq-show. Placement comes from
// GetCapacity, load from two GetStats samples.

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

	noStats bool // the agent reported no stats for the pair
}

type queuesJSON struct {
	TimeUnixNano    int64          `json:"time_unix_nano"`
	IntervalSeconds float64        `json:"interval_seconds"`
	Slots           []slotLoadJSON `json:"slots"`
}

// queueRowsBy indexes queue rows by port and pair.
type pairKey struct {
	port string
	pair uint32
}

func queuesSetup(fs *flag.FlagSet) runFunc {
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
		j.BusyNs, j.RxPackets, j.TxPackets = q.cur.busyNs, q.cur.rxPkts, q.cur.txPkts
		if q.delta != nil {
			r := q.delta.per(s.seconds)
			busy, rx, tx := round3(r.busyPct), round3(r.rxPps), round3(r.txPps)
			j.BusyPercent, j.RxPacketsPerSecond, j.TxPacketsPerSecond = &busy, &rx, &tx
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

func (c *cli) queuesTable(out queuesJSON, rated bool) error {
	t := newTable(c.stdout)
	if rated {
		t.row("CPU", "NUMA", "SLOT", "PORT", "PAIR", "ENABLED", "BUSY", "RX PPS", "TX PPS")
	} else {
		t.row("CPU", "NUMA", "SLOT", "PORT", "PAIR", "ENABLED", "BUSY TIME", "RX PKTS", "TX PKTS")
	}
	for _, s := range out.Slots {
		numa := ""
		if s.NumaNode != nil {
			numa = fmt.Sprint(*s.NumaNode)
		}
		lead := []string{fmt.Sprint(s.CPU), numa, s.Slot}
		if len(s.Queues) == 0 {
			t.row(append(lead, "(free)", "", "", "", "", "")...)
			continue
		}
		for _, q := range s.Queues {
			en := enabled(&agentv1.QueueStats{RxEnabled: q.RxEnabled, TxEnabled: q.TxEnabled})
			if q.noStats {
				en = ""
			}
			row := append(lead[:3:3], q.Port, fmt.Sprint(q.Pair), en)
			switch {
			case q.noStats:
				row = append(row, "", "", "")
			case !rated:
				row = append(row, busyTime(q.BusyNs), count(q.RxPackets), count(q.TxPackets))
			case q.BusyPercent == nil:
				row = append(row, "", "", "")
			default:
				row = append(row, percent(*q.BusyPercent), pps(*q.RxPacketsPerSecond), pps(*q.TxPacketsPerSecond))
			}
			t.row(row...)
		}
	}
	return t.flush()
}
