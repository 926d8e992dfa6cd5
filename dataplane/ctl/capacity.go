package ctl

import (
	"context"
	"fmt"
	"sort"

	"github.com/spf13/pflag"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

type capacityJSON struct {
	CPUs       []cpuJSON `json:"cpus"`
	SlotsTotal uint32    `json:"slots_total"`
	SlotsUsed  uint32    `json:"slots_used"`
}

type cpuJSON struct {
	ID       int32      `json:"id"`
	NumaNode int32      `json:"numa_node"`
	Slots    []slotJSON `json:"slots"`
}

type slotJSON struct {
	ID     string   `json:"id"`
	PortID string   `json:"port_id"` // "": free
	Pairs  []uint32 `json:"pairs"`
	// ReservedBy: the device plugin's allocation ("alloc/<dir>") or DRA
	// claim ("claim/<uid>") that holds the slot; "": none
	ReservedBy string `json:"reserved_by,omitempty"`
}

func capacitySetup(*pflag.FlagSet) runFunc {
	return func(ctx context.Context, c *cli, _ []string) error {
		capacity, err := call(ctx, c, agentv1.AgentClient.GetCapacity, &agentv1.GetCapacityRequest{})
		if err != nil {
			return err
		}
		out := capacityJSON{CPUs: []cpuJSON{}, SlotsTotal: capacity.GetSlotsTotal(), SlotsUsed: capacity.GetSlotsUsed()}
		for _, cpu := range capacity.GetCpus() {
			cj := cpuJSON{ID: cpu.GetId(), NumaNode: cpu.GetNumaNode(), Slots: []slotJSON{}}
			for _, s := range cpu.GetSlots() {
				pairs := append([]uint32{}, s.GetPairs()...)
				sort.Slice(pairs, func(i, j int) bool { return pairs[i] < pairs[j] })
				cj.Slots = append(cj.Slots, slotJSON{ID: s.GetId(), PortID: s.GetPortId(), Pairs: pairs, ReservedBy: s.GetReservedBy()})
			}
			out.CPUs = append(out.CPUs, cj)
		}
		sort.SliceStable(out.CPUs, func(i, j int) bool { return out.CPUs[i].ID < out.CPUs[j].ID })
		if c.output == "json" {
			return writeJSON(c.stdout, out)
		}
		t := newTable(c.stdout)
		t.row("CPU", "NUMA", "SLOT", "PORT", "PAIRS")
		for _, cpu := range out.CPUs {
			if len(cpu.Slots) == 0 {
				t.row(fmt.Sprint(cpu.ID), fmt.Sprint(cpu.NumaNode), "(no slots)", "", "")
			}
			for _, s := range cpu.Slots {
				port := s.PortID
				switch {
				case port == "" && s.ReservedBy != "":
					port = "(reserved by " + s.ReservedBy + ")"
				case port == "":
					port = "(free)"
				}
				t.row(fmt.Sprint(cpu.ID), fmt.Sprint(cpu.NumaNode), s.ID, port, joinInts(s.Pairs))
			}
		}
		if err := t.flush(); err != nil {
			return err
		}
		_, err = fmt.Fprintf(c.stdout, "\n%d of %d slots used, %d free\n", out.SlotsUsed, out.SlotsTotal, out.SlotsTotal-min(out.SlotsUsed, out.SlotsTotal))
		return err
	}
}
