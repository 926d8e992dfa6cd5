package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// Serve answers the API on the unix socket (mode 0600: root only) and runs
// the health monitor until ctx ends.
//
// A takeover New began (a predecessor handing its ports over) is finished
// first; an error then means the predecessor goes on serving and this
// process must not. Once it hands its own ports to a successor
// (handoff.sock), Serve returns nil and the process serves nothing more.
func (a *Agent) Serve(ctx context.Context) error {
	defer a.lock.release()
	tookOver := a.take != nil
	if tookOver {
		t := a.take
		a.take = nil
		if err := t.finish(a); err != nil {
			return err
		}
	}
	ln, err := listenAPI(a.cfg.APISocket)
	if tookOver {
		// The predecessor lets go of its API just after Released: the
		// ports are served already, the API follows.
		ln, err = retryInUse(ln, err, func() (net.Listener, error) { return listenAPI(a.cfg.APISocket) })
	}
	if err != nil {
		return err
	}
	hln, err := listenHandoff(a.cfg.StateDir)
	if err != nil {
		ln.Close()
		return err
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServer(srv, a)
	go a.health.run(ctx)
	a.stopping = ctx.Done()
	handoffStop := make(chan struct{})
	var closeHandoff sync.Once
	stopHandoffs := func() { closeHandoff.Do(func() { close(handoffStop) }) }
	a.closeHandoffs = stopHandoffs
	// In this order: a successor listens on the API socket once it is
	// free, then on handoff.sock (serveHandoffs keeps that path, the
	// successor's by then).
	a.onStop(stopHandoffs)
	a.onStop(srv.Stop)
	go a.serveHandoffs(hln, handoffStop)
	go func() {
		<-ctx.Done()
		stopHandoffs()
		// Streams (WatchHealth) end on ctx; give unary calls a moment.
		t := time.AfterFunc(2*time.Second, srv.Stop)
		srv.GracefulStop()
		t.Stop()
	}()
	a.log.Info("API listening", "socket", a.cfg.APISocket)
	a.ready.Store(true)
	close(a.served)
	err = srv.Serve(ln)
	a.ready.Store(false)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// onStop registers what stopServing ends.
func (a *Agent) onStop(f func()) {
	a.stopMu.Lock()
	a.stops = append(a.stops, f)
	a.stopMu.Unlock()
}

// stopServing ends the API, metrics and handoff.sock (once): after a
// handoff the successor answers on them.
func (a *Agent) stopServing() {
	a.ready.Store(false)
	a.stopMu.Lock()
	stops := a.stops
	a.stops = nil
	a.stopMu.Unlock()
	for _, f := range stops {
		f()
	}
}

// errInUse: a socket or address another process still serves.
var errInUse = errors.New("in use")

// retryInUse calls listen again while the first try's err says the
// address is in use, for up to handoffMargin: after a takeover the
// predecessor lets go of its API socket and metrics address moments after
// the ports.
func retryInUse(ln net.Listener, err error, listen func() (net.Listener, error)) (net.Listener, error) {
	for deadline := time.Now().Add(handoffMargin); err != nil && (errors.Is(err, errInUse) || errors.Is(err, syscall.EADDRINUSE)) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		ln, err = listen()
	}
	return ln, err
}

func listenAPI(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("API socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("API socket: %s exists and is not a socket", path)
		}
		// A live agent answers on it; a stale socket of a killed one does not.
		if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
			c.Close()
			return nil, fmt.Errorf("API socket: %s is %w by a running agent", path, errInUse)
		}
		os.Remove(path)
	}
	// Create it with no permissions for group and others from the start.
	old := umask(0o177)
	ln, err := net.Listen("unix", path)
	umask(old)
	if err != nil {
		return nil, fmt.Errorf("API socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("API socket: %w", err)
	}
	return ln, nil
}

// CreatePort implements the API.
func (a *Agent) CreatePort(_ context.Context, req *agentv1.CreatePortRequest) (*agentv1.Port, error) {
	return a.Create(req.GetSpec())
}

// DeletePort implements the API.
func (a *Agent) DeletePort(_ context.Context, req *agentv1.DeletePortRequest) (*agentv1.DeletePortResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id: must not be empty")
	}
	existed, err := a.Delete(req.GetId())
	if err != nil {
		return nil, err
	}
	return &agentv1.DeletePortResponse{Existed: existed}, nil
}

// GetPort implements the API.
func (a *Agent) GetPort(_ context.Context, req *agentv1.GetPortRequest) (*agentv1.Port, error) {
	p, ok := a.Get(req.GetId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "id: no port %q", req.GetId())
	}
	return p, nil
}

// ListPorts implements the API.
func (a *Agent) ListPorts(context.Context, *agentv1.ListPortsRequest) (*agentv1.ListPortsResponse, error) {
	return &agentv1.ListPortsResponse{Ports: a.List()}, nil
}

// GetStats implements the API.
func (a *Agent) GetStats(_ context.Context, req *agentv1.GetStatsRequest) (*agentv1.GetStatsResponse, error) {
	return a.Stats(req.GetIds())
}

// Stats returns per-port, per-queue counters; ids filters (empty: all).
func (a *Agent) Stats(ids []string) (*agentv1.GetStatsResponse, error) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	resp := &agentv1.GetStatsResponse{TimeUnixNano: time.Now().UnixNano()}
	a.mu.Lock()
	defer a.mu.Unlock()
	found := map[string]bool{}
	for _, ps := range a.dp.Stats() {
		r, ok := a.ports[ps.Name]
		if !ok || (len(want) > 0 && !want[ps.Name]) {
			continue
		}
		found[ps.Name] = true
		resp.Ports = append(resp.Ports, portStats(ps, r))
	}
	for id := range want {
		if !found[id] {
			return nil, status.Errorf(codes.NotFound, "ids: no port %q", id)
		}
	}
	for _, w := range a.dp.WorkerStats() {
		resp.Workers = append(resp.Workers, &agentv1.WorkerStats{Id: int32(w.ID), Cpu: int32(w.CPU), NumaNode: int32(w.NUMA),
			BusyNs: w.BusyNs, UplinkBusyNs: w.UplinkBusyNs, QueuePairs: uint32(w.Queues), ActiveRings: uint32(w.Active)})
	}
	return resp, nil
}

// GetOverlay implements the API.
func (a *Agent) GetOverlay(context.Context, *agentv1.GetOverlayRequest) (*agentv1.Overlay, error) {
	u, ok := a.dp.UplinkStats()
	if !ok || u.Kind != dataplane.UplinkVXLAN {
		return nil, status.Error(codes.FailedPrecondition, "this node has no vxlan uplink (agent config uplink.vxlan)")
	}
	out := &agentv1.Overlay{Local: u.Name, Mtu: uint32(a.dp.UplinkMTU()), RxUnknownVtep: u.RxUnknownVTEP, RxInvalid: u.RxInvalid, TxNoVtep: u.TxNoVTEP}
	for _, v := range u.VTEPs {
		out.Vteps = append(out.Vteps, &agentv1.VTEP{Address: v.Address, RxPackets: v.RxPackets, RxBytes: v.RxBytes, TxPackets: v.TxPackets,
			TxBytes: v.TxBytes, TxErrors: v.TxErrors, TxDropped: v.TxDropped, Macs: uint32(v.MACs)})
	}
	for _, e := range a.dp.OverlayTable(time.Now().UnixNano()) {
		out.Entries = append(out.Entries, &agentv1.OverlayEntry{Network: e.Network, Vni: e.VNI, Mac: e.MAC, Vtep: e.VTEP, AgeSeconds: uint32(max(e.AgeSec, 0))})
	}
	return out, nil
}

// GetRebalance implements the API.
func (a *Agent) GetRebalance(context.Context, *agentv1.GetRebalanceRequest) (*agentv1.RebalanceStatus, error) {
	st := a.dp.RebalanceStatus()
	c := st.Config
	out := &agentv1.RebalanceStatus{Runs: st.Runs, Config: &agentv1.RebalanceConfig{IntervalMs: uint32(c.Interval.Milliseconds()),
		ThresholdPercent: uint32(c.Threshold), ImprovementPercent: uint32(c.Improvement), CrossNuma: c.CrossNUMA}}
	if st.LastRun != nil {
		out.LastRun = a.rebalanceRun(*st.LastRun)
	}
	for _, m := range st.LastMoves {
		out.LastMoves = append(out.LastMoves, queueMove(m))
	}
	return out, nil
}

// maxRebalanceWindow bounds how long a Rebalance call measures.
const maxRebalanceWindow = 60 * time.Second

// Rebalance implements the API.
func (a *Agent) Rebalance(ctx context.Context, req *agentv1.RebalanceRequest) (*agentv1.RebalanceRun, error) {
	window := time.Duration(req.GetWindowMs()) * time.Millisecond
	if window == 0 {
		window = time.Second
	}
	if window > maxRebalanceWindow {
		return nil, status.Errorf(codes.InvalidArgument, "window_ms: %d is more than %d", req.GetWindowMs(), maxRebalanceWindow.Milliseconds())
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < window {
		return nil, status.Errorf(codes.InvalidArgument, "window_ms: %d is longer than the call's deadline allows", req.GetWindowMs())
	}
	return a.rebalanceRun(a.dp.Rebalance(window)), nil
}

func (a *Agent) rebalanceRun(r dataplane.RebalanceRun) *agentv1.RebalanceRun {
	out := &agentv1.RebalanceRun{TimeUnixNano: r.Time.UnixNano(), Manual: r.Manual, IntervalMs: uint32(r.Interval.Milliseconds()), Reason: r.Reason}
	ws := a.dp.WorkerStats()
	for i := range r.Before {
		wl := &agentv1.WorkerLoad{BeforePercent: round1(100 * r.Before[i]), AfterPercent: round1(100 * r.After[i])}
		if i < len(ws) {
			wl.Cpu, wl.NumaNode = int32(ws[i].CPU), int32(ws[i].NUMA)
		}
		out.Workers = append(out.Workers, wl)
	}
	for _, m := range r.Moves {
		out.Moves = append(out.Moves, queueMove(m))
	}
	return out
}

func queueMove(m dataplane.QueueMove) *agentv1.QueueMove {
	return &agentv1.QueueMove{TimeUnixNano: m.Time.UnixNano(), PortId: m.Port, Pair: uint32(m.Pair), FromCpu: int32(m.FromCPU),
		ToCpu: int32(m.ToCPU), LoadPercent: round1(100 * m.Load), Manual: m.Manual, Error: m.Failures}
}

func round1(x float64) float64 { return math.Round(x*10) / 10 }

func portStats(ps dataplane.PortStats, r *record) *agentv1.PortStats {
	out := &agentv1.PortStats{Id: ps.Name, Connected: ps.Connected, Connects: ps.Connects, Labels: r.spec.Labels, Bandwidth: BandwidthSpec(ps.Bandwidth)}
	for _, q := range ps.Queues {
		d := q.Drops
		qs := &agentv1.QueueStats{
			Pair: uint32(q.Pair), Cpu: int32(q.CPU), RxEnabled: q.RxEnabled, TxEnabled: q.TxEnabled,
			Rx:    &agentv1.Direction{Packets: q.RxPackets, Bytes: q.RxBytes},
			Tx:    &agentv1.Direction{Packets: q.TxPackets, Bytes: q.TxBytes},
			Kicks: q.Kicks, Calls: q.Calls, BusyNs: q.BusyNs, Bursts: q.Bursts, Worker: int32(q.Worker), NumaNode: int32(q.NUMA),
			Drops: &agentv1.Drops{RxNoBuffer: d.RxNoBuffer, RxDisabled: d.RxDisabled, TxDisabled: d.TxDisabled,
				BadChain: d.BadChain, Mtu: d.MTU, Runt: d.Runt, NoDestination: d.NoDestination, BadOffload: d.BadOffload,
				RxHoldExpired: d.RxHoldExpired, Spoofed: d.Spoofed, RateLimited: d.RateLimited},
			Stalls: q.Stalls, Held: q.Held, Shaped: q.Shaped,
			Offload: &agentv1.Offload{GsoWhole: q.Offload.GSOWhole, GsoSegmented: q.Offload.GSOSegmented, CsumSoftware: q.Offload.CsumSoftware},
		}
		if q.Pair < len(r.slots) {
			qs.Slot = r.slots[q.Pair].id
		}
		out.Queues = append(out.Queues, qs)
	}
	return out
}

// GetCapacity implements the API.
func (a *Agent) GetCapacity(context.Context, *agentv1.GetCapacityRequest) (*agentv1.Capacity, error) {
	return a.Capacity(), nil
}

// Capacity lists the worker CPUs, their NUMA nodes and slots.
func (a *Agent) Capacity() *agentv1.Capacity {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweepAllocationsLocked()
	c := &agentv1.Capacity{SlotsTotal: uint32(len(a.slots))}
	var cur *agentv1.CPU
	for _, s := range a.slots {
		if cur == nil || cur.Id != int32(s.cpu) {
			cur = &agentv1.CPU{Id: int32(s.cpu), NumaNode: int32(s.numa)}
			c.Cpus = append(c.Cpus, cur)
		}
		cur.Slots = append(cur.Slots, &agentv1.Slot{Id: s.id, PortId: s.owner, Pairs: append([]uint32(nil), s.pairs...), ReservedBy: s.reserved})
		if s.owner != "" {
			c.SlotsUsed++
		}
	}
	return c
}

// WatchHealth implements the API: the current health at once, then every
// change.
func (a *Agent) WatchHealth(_ *agentv1.WatchHealthRequest, stream agentv1.Agent_WatchHealthServer) error {
	changed, cancel := a.health.subscribe()
	defer cancel()
	for {
		if err := stream.Send(a.health.get()); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-a.stopping:
			return status.Error(codes.Unavailable, "the agent is shutting down")
		case <-changed:
		}
	}
}
