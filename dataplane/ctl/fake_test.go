package ctl

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// fakeAgent is an in-memory agentv1.AgentServer with deterministic data:
// two ports (4 and 2 queue pairs) on 3 CPUs × 2 slots, stats that grow by
// fixed amounts per GetStats call, stamped one second apart.
type fakeAgent struct {
	agentv1.UnimplementedAgentServer

	mu         sync.Mutex
	ports      map[string]*agentv1.Port
	statsCalls int64

	health []*agentv1.Health // WatchHealth sends these, then waits
	// endHealth: WatchHealth returns after sending health (the agent
	// ends the stream).
	endHealth bool
	// block: GetCapacity waits for the request's end (timeouts).
	block bool
	// rebalanceWindows: the window of every Rebalance call
	rebalanceWindows []uint32
	// handoff: what GetHandoff answers (nil: none happened)
	handoff *agentv1.Handoff
	// bandwidthSets: every SetPortBandwidth request
	bandwidthSets []*agentv1.SetPortBandwidthRequest
	// overlay: what GetOverlay answers (nil: no vxlan uplink)
	overlay *agentv1.Overlay
}

var (
	// statsEpoch is the agent's clock at the first GetStats.
	statsEpoch = time.Date(2026, 8, 20, 10, 0, 0, 0, time.UTC)
	u32        = func(v uint32) *uint32 { return &v }
)

func newFakeAgent() *fakeAgent {
	f := &fakeAgent{ports: map[string]*agentv1.Port{}}
	f.ports["vm1-net0"] = &agentv1.Port{
		Spec: &agentv1.PortSpec{
			Id: "vm1-net0", SocketPath: "/run/vhostmq/sockets/vm1-net0/vhost.sock", Role: agentv1.Role_ROLE_CLIENT,
			QueuePairs: 4, Slots: []string{"c2-s0", "c3-s0"}, Mac: "52:54:00:12:34:01", Mtu: 1500,
			SocketUid: u32(107), SocketGid: u32(107), SocketMode: 0o770, Polling: agentv1.PollingMode_POLLING_ADAPTIVE,
			Ip: &agentv1.IPConfig{Addresses: []string{"10.1.2.3/24", "fd00::3/64"}},
			Labels: map[string]string{
				"k8s.pod.namespace": "prod", "k8s.pod.name": "virt-launcher-vm1-7xk2p",
				"k8s.pod.uid": "0b8f5f3e-52c1-4c1e-9a57-1f0e6a3c2d11", "interface": "net0",
			},
		},
		Status: &agentv1.PortStatus{
			Connected: true, Connects: 1, EnabledPairs: 4, Mtu: 1500,
			Queues: []*agentv1.QueueAssignment{
				{Pair: 0, Slot: "c2-s0", Cpu: 2}, {Pair: 1, Slot: "c3-s0", Cpu: 3},
				{Pair: 2, Slot: "c2-s0", Cpu: 2}, {Pair: 3, Slot: "c3-s0", Cpu: 3},
			},
			Memory: &agentv1.MemorySeals{Regions: 2, ShrinkSealed: 2},
		},
	}
	f.ports["vm2-net0"] = &agentv1.Port{
		Spec: &agentv1.PortSpec{
			Id: "vm2-net0", SocketPath: "/run/vhostmq/sockets/vm2-net0/vhost.sock", Role: agentv1.Role_ROLE_SERVER,
			QueuePairs: 2, Mtu: 9000, Polling: agentv1.PollingMode_POLLING_BUSY,
			Labels: map[string]string{"k8s.pod.namespace": "dev", "k8s.pod.name": "virt-launcher-vm2-q9zt4"},
			// containerd's burst for an annotation: above the dataplane's cap
			Bandwidth: &agentv1.Bandwidth{Ingress: &agentv1.Rate{BitsPerSecond: 100_000_000},
				Egress: &agentv1.Rate{BitsPerSecond: 50_000_000, BurstBits: 1<<32 - 1}},
		},
		Status: &agentv1.PortStatus{
			Connected: true, Connects: 3, EnabledPairs: 1, Mtu: 9000,
			Queues: []*agentv1.QueueAssignment{{Pair: 0, Slot: "c2-s1", Cpu: 2}, {Pair: 1, Slot: "c8-s0", Cpu: 8}},
			Memory: &agentv1.MemorySeals{Regions: 1, ShrinkSealed: 0}, // hugetlbfs: cannot be sealed
			Faults: &agentv1.PortFaults{GuestMemory: 1},
		},
	}
	f.health = []*agentv1.Health{{
		Healthy: true,
		Slots: []*agentv1.SlotHealth{
			{Id: "c2-s0", Healthy: true}, {Id: "c2-s1", Healthy: true},
			{Id: "c3-s0", Healthy: true}, {Id: "c3-s1", Healthy: true},
			{Id: "c8-s0", Healthy: true}, {Id: "c8-s1", Healthy: false, Reason: "CPU 8 is isolated but has a pinned task"},
		},
	}, {
		Healthy: false, Reason: "a slot serving a port is unhealthy",
		Slots: []*agentv1.SlotHealth{
			{Id: "c2-s0", Healthy: true}, {Id: "c2-s1", Healthy: true},
			{Id: "c3-s0", Healthy: false, Reason: "worker stalled for 2s"}, {Id: "c3-s1", Healthy: true},
			{Id: "c8-s0", Healthy: true}, {Id: "c8-s1", Healthy: false, Reason: "CPU 8 is isolated but has a pinned task"},
		},
	}}
	return f
}

// serve starts a real gRPC server for f on a unix socket in a fresh
// temporary directory and returns the socket's path.
func (f *fakeAgent) serve(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ctl") // short: unix socket paths are < 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "api.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return sock
}

func (f *fakeAgent) CreatePort(_ context.Context, req *agentv1.CreatePortRequest) (*agentv1.Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := req.GetSpec()
	if n := s.GetQueuePairs(); n < 1 || n > 128 {
		return nil, status.Errorf(codes.InvalidArgument, "spec.queue_pairs: %d is outside 1..128", n)
	}
	if p, ok := f.ports[s.GetId()]; ok {
		if !proto.Equal(p.Spec, s) {
			if p.Spec.QueuePairs != s.QueuePairs {
				return nil, status.Errorf(codes.AlreadyExists, "port %q exists with a different spec: queue_pairs is %d, not %d", s.GetId(), p.Spec.QueuePairs, s.QueuePairs)
			}
			return nil, status.Errorf(codes.AlreadyExists, "port %q exists with a different spec", s.GetId())
		}
		return proto.Clone(p).(*agentv1.Port), nil
	}
	p := &agentv1.Port{Spec: proto.Clone(s).(*agentv1.PortSpec), Status: &agentv1.PortStatus{Mtu: s.GetMtu()}}
	if p.Status.Mtu == 0 {
		p.Status.Mtu = 1500
	}
	slots := s.GetSlots()
	if len(slots) == 0 {
		slots = []string{"c3-s1"}
	}
	for i := range s.GetQueuePairs() {
		slot := slots[int(i)%len(slots)]
		var cpu, idx int32
		fmt.Sscanf(slot, "c%d-s%d", &cpu, &idx)
		p.Status.Queues = append(p.Status.Queues, &agentv1.QueueAssignment{Pair: i, Slot: slot, Cpu: cpu})
	}
	f.ports[s.GetId()] = p
	return proto.Clone(p).(*agentv1.Port), nil
}

func (f *fakeAgent) SetPortBandwidth(_ context.Context, req *agentv1.SetPortBandwidthRequest) (*agentv1.Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.ports[req.GetId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "id: no port %q", req.GetId())
	}
	if r := req.GetBandwidth().GetEgress(); r.GetBitsPerSecond() == 0 && r.GetBurstBits() != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "bandwidth.egress: a burst (%d bits) without a rate", r.GetBurstBits())
	}
	f.bandwidthSets = append(f.bandwidthSets, proto.Clone(req).(*agentv1.SetPortBandwidthRequest))
	p.Spec.Bandwidth = req.GetBandwidth()
	return proto.Clone(p).(*agentv1.Port), nil
}

func (f *fakeAgent) DeletePort(_ context.Context, req *agentv1.DeletePortRequest) (*agentv1.DeletePortResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.ports[req.GetId()]
	delete(f.ports, req.GetId())
	return &agentv1.DeletePortResponse{Existed: ok}, nil
}

func (f *fakeAgent) GetPort(_ context.Context, req *agentv1.GetPortRequest) (*agentv1.Port, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.ports[req.GetId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "port %q not found", req.GetId())
	}
	return proto.Clone(p).(*agentv1.Port), nil
}

func (f *fakeAgent) ListPorts(context.Context, *agentv1.ListPortsRequest) (*agentv1.ListPortsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	resp := &agentv1.ListPortsResponse{}
	// Reverse order: the CLI sorts.
	ids := sortedKeys(f.ports)
	for i := len(ids) - 1; i >= 0; i-- {
		resp.Ports = append(resp.Ports, proto.Clone(f.ports[ids[i]]).(*agentv1.Port))
	}
	return resp, nil
}

// queueStats is the stats of pair of port at GetStats call k: every
// counter is a base plus k times a per-second rate, so the rates between
// two consecutive calls (one second apart) are exact.
func queueStats(port string, a *agentv1.QueueAssignment, enabled bool, k uint64) *agentv1.QueueStats {
	p := uint64(a.Pair) + 1
	q := &agentv1.QueueStats{Pair: a.Pair, Slot: a.Slot, Cpu: a.Cpu, RxEnabled: enabled, TxEnabled: enabled, Drops: &agentv1.Drops{}, Offload: &agentv1.Offload{}}
	q.Worker, q.NumaNode = map[int32]int32{2: 0, 3: 1, 8: 2}[a.Cpu], map[int32]int32{8: 1}[a.Cpu]
	if port == "vm1-net0" && a.Pair == 3 { // the rebalancer moved it from CPU 3 to CPU 2
		q.Cpu, q.Worker = 2, 0
	}
	switch {
	case port == "vm1-net0":
		// RX (toward the guest) p×250 kpps of 1500 bytes, TX p×100 kpps
		// of 1000 bytes, busy p×10%.
		q.Rx = &agentv1.Direction{Packets: 1_000_000_000*p + k*250_000*p, Bytes: 1_500_000_000_000*p + k*250_000*p*1500}
		q.Tx = &agentv1.Direction{Packets: 400_000_000*p + k*100_000*p, Bytes: 400_000_000_000*p + k*100_000*p*1000}
		q.Kicks, q.Calls = 5_000_000*p+k*2_000*p, 9_000_000*p+k*3_500*p
		q.BusyNs = 3_600_000_000_000*p + k*100_000_000*p
		q.Bursts = 400_000_000*p + k*10_000*p // 9 µs a burst so far, 10 µs over an interval
		q.Drops.RxNoBuffer = 12_345*(p-1) + k*50*(p-1)
		if a.Pair == 0 {
			q.Drops.NoDestination = 777 + k*5
		}
		// The guest takes GSO on pair 0 only; the rest are segmented or
		// checksummed for it; pair 2's sender gets bad offload headers.
		if a.Pair == 0 {
			q.Offload.GsoWhole = 40_000 + k*2_000
		} else {
			q.Offload.GsoSegmented = 10_000*p + k*500*p
		}
		q.Offload.CsumSoftware = 3_000*p + k*100*p
		if a.Pair == 2 {
			q.Drops.BadOffload = 9 + k*3
		}
	case enabled: // vm2-net0 pair 0: 10 kpps of 64 bytes each way
		q.Rx = &agentv1.Direction{Packets: 20_000_000 + k*10_000, Bytes: 1_280_000_000 + k*640_000}
		q.Tx = &agentv1.Direction{Packets: 30_000_000 + k*10_000, Bytes: 1_920_000_000 + k*640_000}
		q.Kicks, q.Calls = 100_000+k*900, 80_000+k*700
		q.BusyNs = 50_000_000_000 + k*2_500_000
		q.Bursts = 25_000_000 + k*1_000
		q.Drops.Mtu, q.Drops.Runt = 3, 1
		q.Drops.Spoofed = 12 + k*4 // its guest sends from an address not its own
		// above its ingress limit; its egress one holds its guest back
		q.Drops.RateLimited, q.Shaped = 30+k*6, 500+k*25
	default: // vm2-net0 pair 1: the guest never enabled it
		q.Rx, q.Tx = &agentv1.Direction{}, &agentv1.Direction{}
		q.Drops.RxDisabled = 4_000 + k*20
	}
	return q
}

func (f *fakeAgent) GetStats(_ context.Context, req *agentv1.GetStatsRequest) (*agentv1.GetStatsResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := f.statsCalls
	f.statsCalls++
	ids := req.GetIds()
	if len(ids) == 0 {
		ids = sortedKeys(f.ports)
	}
	resp := &agentv1.GetStatsResponse{TimeUnixNano: statsEpoch.Add(time.Duration(k) * time.Second).UnixNano()}
	for _, id := range ids {
		p, ok := f.ports[id]
		if !ok {
			return nil, status.Errorf(codes.NotFound, "port %q not found", id)
		}
		ps := &agentv1.PortStats{Id: id, Connected: p.Status.Connected, Connects: p.Status.Connects, Labels: p.Spec.Labels, Bandwidth: p.Spec.Bandwidth}
		for _, a := range p.Status.Queues {
			ps.Queues = append(ps.Queues, queueStats(id, a, a.Pair < p.Status.EnabledPairs, uint64(k)))
		}
		// Pairs in descending order: the CLI sorts.
		sort.Slice(ps.Queues, func(i, j int) bool { return ps.Queues[i].Pair > ps.Queues[j].Pair })
		resp.Ports = append(resp.Ports, ps)
	}
	// Workers: CPU 2 serves 4 pairs at 80.25% busy, CPU 3 one at 25% (5%
	// of it its uplink queue), CPU 8 one, idle.
	for i, w := range []struct {
		cpu, numa, pairs int32
		pct, up          uint64
	}{{2, 0, 4, 8025, 0}, {3, 0, 1, 2500, 500}, {8, 1, 1, 0, 0}} {
		resp.Workers = append(resp.Workers, &agentv1.WorkerStats{Id: int32(i), Cpu: w.cpu, NumaNode: w.numa, QueuePairs: uint32(w.pairs),
			BusyNs: 7_000_000_000_000 + uint64(k)*w.pct*100_000, UplinkBusyNs: 10_000_000_000 + uint64(k)*w.up*100_000})
	}
	return resp, nil
}

// moveTime is when the fake rebalancer moved vm1-net0's pair 3.
var moveTime = time.Date(2026, 8, 20, 9, 58, 30, 0, time.UTC)

func (f *fakeAgent) GetRebalance(context.Context, *agentv1.GetRebalanceRequest) (*agentv1.RebalanceStatus, error) {
	mv := &agentv1.QueueMove{TimeUnixNano: moveTime.UnixNano(), PortId: "vm1-net0", Pair: 3, FromCpu: 3, ToCpu: 2, LoadPercent: 40}
	return &agentv1.RebalanceStatus{
		Config: &agentv1.RebalanceConfig{IntervalMs: 60_000, ThresholdPercent: 95, ImprovementPercent: 25},
		Runs:   12,
		LastRun: &agentv1.RebalanceRun{TimeUnixNano: moveTime.Add(time.Minute).UnixNano(), IntervalMs: 60_000,
			Reason: "NUMA node 0: no worker above 95% (busiest: CPU 3 at 60.0%)"},
		LastMoves: []*agentv1.QueueMove{mv},
	}, nil
}

func (f *fakeAgent) Rebalance(_ context.Context, req *agentv1.RebalanceRequest) (*agentv1.RebalanceRun, error) {
	f.mu.Lock()
	f.rebalanceWindows = append(f.rebalanceWindows, req.GetWindowMs())
	f.mu.Unlock()
	return &agentv1.RebalanceRun{TimeUnixNano: statsEpoch.UnixNano(), Manual: true, IntervalMs: req.GetWindowMs(),
		Workers: []*agentv1.WorkerLoad{{Cpu: 2, BeforePercent: 90, AfterPercent: 50}, {Cpu: 3, BeforePercent: 10, AfterPercent: 50}},
		Moves:   []*agentv1.QueueMove{{TimeUnixNano: statsEpoch.UnixNano(), PortId: "vm1-net0", Pair: 2, FromCpu: 2, ToCpu: 3, LoadPercent: 40, Manual: true}},
	}, nil
}

func (f *fakeAgent) GetOverlay(context.Context, *agentv1.GetOverlayRequest) (*agentv1.Overlay, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.overlay == nil {
		return nil, status.Error(codes.FailedPrecondition, "this node has no vxlan uplink (agent config uplink.vxlan)")
	}
	return f.overlay, nil
}

func (f *fakeAgent) GetHandoff(context.Context, *agentv1.GetHandoffRequest) (*agentv1.Handoff, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.handoff == nil {
		return &agentv1.Handoff{Build: "0123456789ab"}, nil
	}
	return f.handoff, nil
}

func (f *fakeAgent) GetCapacity(ctx context.Context, _ *agentv1.GetCapacityRequest) (*agentv1.Capacity, error) {
	f.mu.Lock()
	block := f.block
	f.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &agentv1.Capacity{}
	for _, cpu := range []struct{ id, numa int32 }{{8, 1}, {2, 0}, {3, 0}} { // unsorted: the CLI sorts
		pc := &agentv1.CPU{Id: cpu.id, NumaNode: cpu.numa}
		for s := range 2 {
			slot := &agentv1.Slot{Id: fmt.Sprintf("c%d-s%d", cpu.id, s)}
			for _, id := range sortedKeys(f.ports) {
				for _, a := range f.ports[id].Status.Queues {
					if a.Slot == slot.Id {
						slot.PortId = id
						slot.Pairs = append([]uint32{a.Pair}, slot.Pairs...) // descending
					}
				}
			}
			c.SlotsTotal++
			if slot.PortId != "" {
				c.SlotsUsed++
			}
			pc.Slots = append(pc.Slots, slot)
		}
		c.Cpus = append(c.Cpus, pc)
	}
	return c, nil
}

func (f *fakeAgent) WatchHealth(_ *agentv1.WatchHealthRequest, stream agentv1.Agent_WatchHealthServer) error {
	f.mu.Lock()
	health, end := f.health, f.endHealth
	f.mu.Unlock()
	for _, h := range health {
		if err := stream.Send(h); err != nil {
			return err
		}
	}
	if end {
		return nil
	}
	<-stream.Context().Done()
	return nil
}
