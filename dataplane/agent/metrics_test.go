package agent

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
)

// scrapeAgent is an agent with n ports of one queue pair each, the first
// connected of them with a Go test frontend. It does not serve its API: a
// scrape reads the dataplane and the agent's records, nothing else.
func scrapeAgent(tb testing.TB, n, connected int) *Agent {
	tb.Helper()
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	dp, err := dataplane.New(dataplane.Config{Logger: logger()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(dp.Close)
	root := filepath.Join(dir, "s")
	a, err := New(Config{SlotsPerCPU: n, SocketRoot: root, StateDir: filepath.Join(dir, "state"), Logger: logger(), Asked: true}, dp)
	if err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		id := fmt.Sprintf("vm%04d", i)
		spec := &agentv1.PortSpec{Id: id, SocketPath: filepath.Join(root, id, "vhu.sock"), Role: agentv1.Role_ROLE_SERVER, QueuePairs: 1,
			Labels: map[string]string{"k8s.pod.namespace": "ns1", "k8s.pod.name": "virt-launcher-" + id}}
		if _, err := a.create(spec, false, false); err != nil {
			tb.Fatal(err)
		}
		if i < connected {
			f, err := frontend.Dial(spec.SocketPath, frontend.Config{QueueSize: 64, MemSize: 2 << 20})
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { f.Close() })
		}
	}
	for deadline := time.Now().Add(10 * time.Second); connected > 0; time.Sleep(10 * time.Millisecond) {
		up := 0
		for _, p := range dp.Stats() {
			if p.EnabledPairs == 1 {
				up++
			}
		}
		if up >= connected {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d frontends connected", up, connected)
		}
	}
	return a
}

// discard is a ResponseWriter that keeps nothing: the scrape's own cost is
// measured, not a buffer's growth.
type discard struct {
	h http.Header
	n int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(int)             {}
func (d *discard) Write(b []byte) (int, error) { d.n += len(b); return len(b), nil }

// scrapeRequest asks as Prometheus 2 does (it takes the text format
// 0.0.4 of this handler, legacy names escaped), gzipped or not.
func scrapeRequest(gzip bool) *http.Request {
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
	if gzip {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	return req
}

// BenchmarkScrape is one /metrics scrape through the HTTP handler,
// encoding (and gzip, as Prometheus asks) included, at 64 and 1024 idle
// ports of one queue pair (#27).
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{64, 1024} {
		a := scrapeAgent(b, n, 0)
		h, _ := a.metricsHandler()
		for _, gz := range []bool{false, true} {
			name := fmt.Sprintf("ports=%d/plain", n)
			if gz {
				name = fmt.Sprintf("ports=%d/gzip", n)
			}
			b.Run(name, func(b *testing.B) {
				req, w := scrapeRequest(gz), &discard{h: http.Header{}}
				h.ServeHTTP(w, req) // warm: pools, first-scrape caches
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					w.n = 0
					h.ServeHTTP(w, req)
				}
				b.ReportMetric(float64(w.n), "body_bytes")
			})
		}
	}
}

// TestScrapeAllocations: a scrape's allocations do not grow with the ports
// (by more than a fraction of one a port: for Prometheus 2, which asks for
// escaped names, expfmt copies each family's metric slice, growing it),
// nor from one scrape to the next. Before #27's fix a scrape made 775 a
// port.
func TestScrapeAllocations(t *testing.T) {
	if raceDetector {
		t.Skip("1024 ports scraped under -race take 17 s, and count the same allocations: run without -race (make test-unit)")
	}
	const perPort = 0.5 // measured: 0.08
	allocs := func(n int) (first, later float64) {
		a := scrapeAgent(t, n, 0)
		h, _ := a.metricsHandler()
		req, w := scrapeRequest(true), &discard{h: http.Header{}}
		h.ServeHTTP(w, req) // the first builds every port's series
		first = testing.AllocsPerRun(3, func() { h.ServeHTTP(w, req) })
		later = testing.AllocsPerRun(10, func() { h.ServeHTTP(w, req) })
		return first, later
	}
	_, small := allocs(64)
	first, large := allocs(1024)
	if per := (large - small) / (1024 - 64); per > perPort {
		t.Errorf("a scrape makes %.0f allocations at 64 ports, %.0f at 1024: %.2f a port, want at most %.2f", small, large, per, perPort)
	}
	if large > first*1.05+10 {
		t.Errorf("a scrape at 1024 ports made %.0f allocations, then %.0f: they grow with the scrapes", first, large)
	}
	t.Logf("allocations a scrape: %.0f at 64 ports, %.0f at 1024", small, large)
}

// TestPortMetricsFollowThePorts: the ports' series come and go with the
// ports, and with what shapes them: a frontend attaching adds
// port_memory_sealed, a pair moved to another worker changes its cpu
// label.
func TestPortMetricsFollowThePorts(t *testing.T) {
	a := scrapeAgent(t, 3, 1)
	g := newPortMetrics(a, prometheus.NewRegistry())
	// series returns family name's series by their port (and queue).
	series := func(name string) map[string]*dto.Metric {
		t.Helper()
		fams, done, err := g.Gather()
		defer done()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*dto.Metric{}
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.Metric {
				var port, queue, cpu string
				for _, l := range m.Label {
					switch l.GetName() {
					case "port":
						port = l.GetValue()
					case "queue":
						queue = l.GetValue()
					case "cpu":
						cpu = l.GetValue()
					}
				}
				if queue != "" {
					port += "/" + queue + "@" + cpu
				}
				out[port] = m
			}
		}
		return out
	}
	if got := series("vhostmq_port_connected"); len(got) != 3 || got["vm0000"].GetGauge().GetValue() != 1 || got["vm0001"].GetGauge().GetValue() != 0 {
		t.Errorf("port_connected: %v", got)
	}
	if got := series("vhostmq_port_memory_sealed"); len(got) != 1 || got["vm0000"] == nil {
		t.Errorf("port_memory_sealed with vm0000 connected: %v", got)
	}
	if _, err := a.Delete("vm0001"); err != nil {
		t.Fatal(err)
	}
	if got := series("vhostmq_queue_enabled"); len(got) != 2 || got["vm0000/0@-1"].GetGauge().GetValue() != 1 {
		t.Errorf("queue_enabled with vm0001 deleted: %v", got)
	}
	f, err := frontend.Dial(filepath.Join(a.cfg.SocketRoot, "vm0002", "vhu.sock"), frontend.Config{QueueSize: 64, MemSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for deadline := time.Now().Add(5 * time.Second); len(series("vhostmq_port_memory_sealed")) != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("port_memory_sealed with vm0002 connected too: %v", series("vhostmq_port_memory_sealed"))
		}
	}

	// A pair moved to another worker (rebalancing one needs load: here its
	// series think it was elsewhere) has its series built again, once.
	for _, s := range g.ports {
		if s.id == "vm0000" {
			s.cpus[0] = 7
		}
	}
	if got := series("vhostmq_queue_enabled"); len(got) != 2 || got["vm0000/0@-1"].GetGauge().GetValue() != 1 {
		t.Errorf("queue_enabled with vm0000's series built again: %v", got)
	}
	// and the cpu label is the reading's
	s := newPortSeries(&record{spec: &agentv1.PortSpec{Id: "p"}, slots: []*slot{{id: "c0-s0"}}})
	ps := &dataplane.PortStats{Queues: []dataplane.QueueStats{{CPU: 0, RxPackets: 5}}}
	s.build(g, true, ps)
	ps.Queues[0].CPU, ps.Queues[0].RxPackets = 1, 6
	if s.fits(ps) {
		t.Fatal("a reading with the pair on another CPU fits the series built for the first")
	}
	s.build(g, true, ps)
	for _, x := range s.series {
		if x.fam == famPackets && x.extra == "rx" {
			if l := x.m.GetLabel(); l[0].GetName() != "cpu" || l[0].GetValue() != "1" || *x.v != 6 {
				t.Errorf("rx packets after the move: %v = %v", l, *x.v)
			}
		}
	}
}

// TestConcurrentScrapes: scrapes at once, while ports come and go, each
// get a whole body (under -race: the families one encodes are not changed
// by the other).
func TestConcurrentScrapes(t *testing.T) {
	a := scrapeAgent(t, 8, 2)
	h, _ := a.metricsHandler()
	stop := make(chan struct{})
	churned := make(chan error, 1)
	go func() {
		var err error
		for i := 0; err == nil; i++ {
			select {
			case <-stop:
				churned <- nil
				return
			default:
			}
			id := fmt.Sprintf("vm%04d", i%8)
			if _, err = a.Delete(id); err == nil {
				_, err = a.create(&agentv1.PortSpec{Id: id, SocketPath: filepath.Join(a.cfg.SocketRoot, id, "vhu.sock"), Role: agentv1.Role_ROLE_SERVER, QueuePairs: 1}, false, false)
			}
		}
		churned <- err
	}()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20 {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, scrapeRequest(false))
				if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "vhostmq_slots{state=\"free\"}") {
					t.Errorf("scrape: %d, %d bytes", w.Code, w.Body.Len())
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	if err := <-churned; err != nil {
		t.Fatal(err)
	}
}

// TestTakesGzip: the choice between identity and gzip is promhttp's.
func TestTakesGzip(t *testing.T) {
	for accept, want := range map[string]bool{"": false, "gzip": true, "gzip;q=0": false, "identity, gzip": false, "gzip, identity;q=0.5": true,
		"*": false, "*;q=0.5, identity;q=0.2": false, "deflate, gzip, br, zstd": true, "br": false} {
		h := http.Header{}
		if accept != "" {
			h.Set("Accept-Encoding", accept)
		}
		if got := takesGzip(h); got != want {
			t.Errorf("Accept-Encoding %q: gzip %v, want %v", accept, got, want)
		}
	}
}
