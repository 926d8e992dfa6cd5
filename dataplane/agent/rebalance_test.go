package agent

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/balance"
)

func startTopo(t *testing.T, topo balance.Topology, cross bool) *env {
	t.Helper()
	dp, err := dataplane.New(dataplane.Config{CPUs: []int{0, 1}, Topology: topo, Rebalance: dataplane.RebalanceConfig{CrossNUMA: cross}, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	return startOn(t, shortDir(t), dp, 2)
}

func cpusOf(p *agentv1.Port) []int32 {
	var out []int32
	for _, q := range p.Status.Queues {
		out = append(out, q.Cpu)
	}
	return out
}

// TestFreeSlotsStayOnOneNUMANode: without slots, a port's pairs take free
// slots of one NUMA node (distinct CPUs there first); across nodes only
// with crossNUMA. The topology is injected: this machine has one node.
func TestFreeSlotsStayOnOneNUMANode(t *testing.T) {
	e := startTopo(t, balance.Topology{0: 0, 1: 1}, false)
	c, err := e.client.GetCapacity(context.Background(), &agentv1.GetCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Cpus[0].NumaNode != 0 || c.Cpus[1].NumaNode != 1 {
		t.Fatalf("capacity NUMA nodes %d, %d; want the injected 0, 1", c.Cpus[0].NumaNode, c.Cpus[1].NumaNode)
	}
	p, err := e.create(e.spec("a", 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := cpusOf(p); got[0] != got[1] {
		t.Errorf("pairs on CPUs %v: across NUMA nodes", got)
	}
	// The node with more free CPUs... both have one; node 1 now has more
	// free slots.
	p, err = e.create(e.spec("b", 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := cpusOf(p); got[0] != 1 || got[1] != 1 {
		t.Errorf("second port on CPUs %v, want node 1's CPU 1", got)
	}

	e = startTopo(t, balance.Topology{0: 0, 1: 1}, true)
	p, err = e.create(e.spec("a", 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := cpusOf(p); got[0] == got[1] {
		t.Errorf("crossNUMA: pairs on CPUs %v, want distinct", got)
	}
}

// TestGivenSlotsDistinctCPUsFirst: slots c0-s0, c0-s1, c1-s0 for four
// pairs (more pairs than slots share them) put pairs 0 and 1 on CPUs 0
// and 1, not both on CPU 0.
func TestGivenSlotsDistinctCPUsFirst(t *testing.T) {
	e := startTopo(t, balance.Topology{0: 0, 1: 0}, false)
	s := e.spec("a", 4)
	s.Slots = []string{"c0-s0", "c0-s1", "c1-s0"}
	p, err := e.create(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := cpusOf(p); got[0] != 0 || got[1] != 1 || got[2] != 0 || got[3] != 0 {
		t.Errorf("pairs on CPUs %v, want [0 1 0 0]", got)
	}
}

func TestRebalanceAPI(t *testing.T) {
	e := startTopo(t, balance.Topology{0: 0, 1: 0}, false)
	if _, err := e.create(e.spec("a", 2)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := e.client.GetRebalance(ctx, &agentv1.GetRebalanceRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Runs != 0 || st.LastRun != nil || st.Config.IntervalMs != 0 || st.Config.ThresholdPercent != dataplane.DefaultRebalanceThreshold {
		t.Errorf("before any run: %v", st)
	}
	if _, err := e.client.Rebalance(ctx, &agentv1.RebalanceRequest{WindowMs: 61000}); code(err) != codes.InvalidArgument {
		t.Errorf("61 s window: %v, want InvalidArgument", err)
	}
	run, err := e.client.Rebalance(ctx, &agentv1.RebalanceRequest{WindowMs: 100})
	if err != nil {
		t.Fatal(err)
	}
	// No traffic: nothing to move, and it says why.
	if len(run.Moves) != 0 || run.Reason == "" || !run.Manual || len(run.Workers) != 2 || run.IntervalMs < 100 {
		t.Errorf("idle run: %v", run)
	}
	st, err = e.client.GetRebalance(ctx, &agentv1.GetRebalanceRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Runs != 1 || st.LastRun == nil || st.LastRun.Reason != run.Reason {
		t.Errorf("after a run: %v", st)
	}
	stats, err := e.client.GetStats(ctx, &agentv1.GetStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(stats.Workers) != 2 || stats.Workers[1].Cpu != 1 || stats.Workers[0].QueuePairs+stats.Workers[1].QueuePairs != 2 {
		t.Errorf("workers %v", stats.Workers)
	}
	for _, q := range stats.Ports[0].Queues {
		if q.Cpu != stats.Workers[q.Worker].Cpu {
			t.Errorf("pair %d: cpu %d, worker %d on CPU %d", q.Pair, q.Cpu, q.Worker, stats.Workers[q.Worker].Cpu)
		}
	}
}
