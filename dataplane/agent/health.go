package agent

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// healthMonitor turns the dataplane's worker health into slot health and
// pushes every change to WatchHealth streams.
type healthMonitor struct {
	a *Agent

	mu      sync.Mutex
	current *agentv1.Health
	last    []dataplane.WorkerHealth
	subs    map[chan struct{}]struct{}
}

// healthInterval is how often the workers are checked; device plugins
// relay changes to kubelet at once.
const healthInterval = 500 * time.Millisecond

func newHealthMonitor(a *Agent) *healthMonitor {
	h := &healthMonitor{a: a, subs: map[chan struct{}]struct{}{}}
	h.current = h.compute()
	return h
}

func (h *healthMonitor) compute() *agentv1.Health {
	a := h.a
	byCPU := map[int]string{} // cpu -> reason, "" healthy
	healthyWorkers := 0
	ws := a.dp.WorkerHealth()
	h.mu.Lock()
	h.last = ws
	h.mu.Unlock()
	for _, w := range ws {
		byCPU[w.CPU] = w.Reason
		if w.Healthy {
			healthyWorkers++
		}
	}
	out := &agentv1.Health{Healthy: healthyWorkers > 0}
	switch {
	case healthyWorkers == 0:
		out.Reason = "no dataplane worker is healthy"
	case healthyWorkers < len(byCPU):
		out.Reason = fmt.Sprintf("%d of %d workers unhealthy", len(byCPU)-healthyWorkers, len(byCPU))
	}
	if a.state.aside != "" {
		if out.Reason != "" {
			out.Reason += "; "
		}
		out.Reason += "the state file was corrupt and was kept as " + a.state.aside
	}
	a.mu.Lock()
	nfailed := len(a.failed)
	claimed := map[*slot]string{} // held by a DRA claim: not for the device plugin
	for _, s := range a.slots {
		if strings.HasPrefix(s.reserved, agentv1.OwnerClaim) {
			claimed[s] = s.reserved
		}
	}
	a.mu.Unlock()
	if nfailed > 0 {
		if out.Reason != "" {
			out.Reason += "; "
		}
		out.Reason += fmt.Sprintf("%d stored ports could not be restored", nfailed)
	}
	// A broken uplink leaves the node's VMs (and its slots) working: it is
	// reported, and new ports on uplinked networks are refused.
	if err := a.dp.UplinkHealth(); err != nil {
		if out.Reason != "" {
			out.Reason += "; "
		}
		out.Reason += "uplink: " + err.Error()
	}
	for _, s := range a.slots {
		reason := byCPU[s.cpu]
		if c, ok := claimed[s]; ok && reason == "" {
			reason = "held by DRA " + c
		}
		out.Slots = append(out.Slots, &agentv1.SlotHealth{Id: s.id, Healthy: reason == "", Reason: reason})
	}
	return out
}

// run re-checks health until ctx ends and wakes watchers on changes.
func (h *healthMonitor) run(ctx context.Context) {
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		next := h.compute()
		h.mu.Lock()
		if !proto.Equal(next, h.current) {
			h.current = next
			for c := range h.subs {
				select {
				case c <- struct{}{}:
				default:
				}
			}
			h.a.log.Info("health changed", "healthy", next.Healthy, "reason", next.Reason)
		}
		h.mu.Unlock()
	}
}

// workers returns the worker health of the last check.
func (h *healthMonitor) workers() []dataplane.WorkerHealth {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// get returns the latest health.
func (h *healthMonitor) get() *agentv1.Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	return proto.Clone(h.current).(*agentv1.Health)
}

func (h *healthMonitor) subscribe() (chan struct{}, func()) {
	c := make(chan struct{}, 1)
	h.mu.Lock()
	h.subs[c] = struct{}{}
	h.mu.Unlock()
	return c, func() {
		h.mu.Lock()
		delete(h.subs, c)
		h.mu.Unlock()
	}
}

// Health returns the current health.
func (a *Agent) Health() *agentv1.Health { return a.health.get() }
