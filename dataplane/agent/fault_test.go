package agent

import (
	"context"
	"testing"
	"time"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
)

// TestFaultAndSealsInStatusAndMetrics (#26): GetPort and the metrics say
// whether the frontend can take its memory back, and count the session a
// frontend that did so lost.
func TestFaultAndSealsInStatusAndMetrics(t *testing.T) {
	if raceDetector {
		t.Skip("a fault inside the race detector's atomics cannot become a panic: run without -race (make test-unit)")
	}
	e := start(t, shortDir(t), nil, 2)
	s := e.spec("m", 1)
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addr := serveMetrics(ctx, t, e)
	// value returns the metric's value for the port (and reason), -1 when absent.
	value := func(name, reason string) float64 {
		t.Helper()
		fams := scrape(t, addr)
		f := fams[name]
		if f == nil {
			return -1
		}
		for _, m := range f.Metric {
			l := map[string]string{}
			for _, p := range m.Label {
				l[p.GetName()] = p.GetValue()
			}
			if l["port"] == "m" && (reason == "" || l["reason"] == reason) {
				if m.Counter != nil {
					return m.Counter.GetValue()
				}
				return m.Gauge.GetValue()
			}
		}
		return -1
	}
	status := func() *agentv1.PortStatus {
		t.Helper()
		p, err := e.client.GetPort(ctx, &agentv1.GetPortRequest{Id: "m"})
		if err != nil {
			t.Fatal(err)
		}
		return p.GetStatus()
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// A sealed frontend (QEMU's memfd default).
	sealed, err := frontend.Dial(s.SocketPath, frontend.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if m := status().GetMemory(); m.GetRegions() != 1 || m.GetShrinkSealed() != 1 {
		t.Errorf("sealed frontend: memory %v, want 1 of 1 regions sealed", m)
	}
	if v := value("vhostmq_port_memory_sealed", ""); v != 1 {
		t.Errorf("vhostmq_port_memory_sealed = %v with a sealed frontend, want 1", v)
	}
	sealed.Close()
	waitUntil("the sealed frontend to go", func() bool { return !status().GetConnected() })

	// An unsealed one, which takes its memory back.
	f, err := frontend.Dial(s.SocketPath, frontend.Config{UnsealedMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if m := status().GetMemory(); m.GetRegions() != 1 || m.GetShrinkSealed() != 0 {
		t.Errorf("unsealed frontend: memory %v, want 0 of 1 regions sealed", m)
	}
	if v := value("vhostmq_port_memory_sealed", ""); v != 0 {
		t.Errorf("vhostmq_port_memory_sealed = %v with an unsealed frontend, want 0", v)
	}
	if v := value("vhostmq_port_faults_total", "guest_memory"); v != 0 {
		t.Errorf("vhostmq_port_faults_total{reason=guest_memory} = %v before any fault", v)
	}
	if err := f.ShrinkMemory(0); err != nil {
		t.Fatal(err)
	}
	if err := f.Kick(1); err != nil {
		t.Fatal(err)
	}
	waitUntil("the fault to be counted", func() bool { return status().GetFaults().GetGuestMemory() == 1 })
	if st := status(); st.GetConnected() || st.GetFaults().GetDirtyLog() != 0 {
		t.Errorf("after the fault: connected %v, faults %v", st.GetConnected(), st.GetFaults())
	}
	if v := value("vhostmq_port_faults_total", "guest_memory"); v != 1 {
		t.Errorf("vhostmq_port_faults_total{reason=guest_memory} = %v after one fault, want 1", v)
	}
	if v := value("vhostmq_port_faults_total", "dirty_log"); v != 0 {
		t.Errorf("vhostmq_port_faults_total{reason=dirty_log} = %v, want 0", v)
	}
}
