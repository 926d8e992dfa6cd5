package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

func rate(bps, burst uint64) *agentv1.Rate {
	return &agentv1.Rate{BitsPerSecond: bps, BurstBits: burst}
}

// The API's copies of the dataplane's bounds are the dataplane's.
func TestBandwidthBoundsAreTheDataplanes(t *testing.T) {
	if agentv1.MinBitsPerSecond != dataplane.MinBitsPerSecond || agentv1.MaxBitsPerSecond != dataplane.MaxBitsPerSecond ||
		agentv1.MaxBurstBits != dataplane.MaxBurstBits || float64(agentv1.DefaultBurstMillis)/1000 != dataplane.DefaultBurst {
		t.Errorf("agentv1 bounds %d..%d, burst cap %d, default %d ms; the dataplane's %d..%d, %d, %v s",
			agentv1.MinBitsPerSecond, agentv1.MaxBitsPerSecond, agentv1.MaxBurstBits, agentv1.DefaultBurstMillis,
			dataplane.MinBitsPerSecond, uint64(dataplane.MaxBitsPerSecond), dataplane.MaxBurstBits, dataplane.DefaultBurst)
	}
}

// A bad limit is InvalidArgument naming the field, and the same limits
// however written (unset, zero, a zero direction) are the same spec.
func TestBandwidthValidationAndNormalization(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	for _, c := range []struct {
		name string
		bw   *agentv1.Bandwidth
		want string // error text; "" = valid
	}{
		{"ingress only", &agentv1.Bandwidth{Ingress: rate(100e6, 0)}, ""},
		{"both, bursts", &agentv1.Bandwidth{Ingress: rate(8000, 12000), Egress: rate(1e12, 1<<32-1)}, ""},
		{"ingress too slow", &agentv1.Bandwidth{Ingress: rate(7999, 0)}, "spec.bandwidth.ingress: 7999 bits/s is outside 8000..1000000000000"},
		{"egress too fast", &agentv1.Bandwidth{Egress: rate(1e12+1, 0)}, "spec.bandwidth.egress: 1000000000001 bits/s is outside 8000..1000000000000"},
		{"burst without a rate", &agentv1.Bandwidth{Egress: rate(0, 64)}, "spec.bandwidth.egress: a burst (64 bits) without a rate"},
	} {
		s := e.spec("v", 1)
		s.Bandwidth = c.bw
		_, err := e.create(s)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want InvalidArgument %q", c.name, err, c.want)
		}
		if _, ok := e.dp.Port("v"); ok != (c.want == "") {
			t.Errorf("%s: port in the dataplane %v", c.name, ok)
		}
		e.client.DeletePort(context.Background(), &agentv1.DeletePortRequest{Id: "v"})
	}

	s := e.spec("n", 1)
	s.Bandwidth = &agentv1.Bandwidth{Ingress: rate(0, 0), Egress: &agentv1.Rate{}}
	p, err := e.create(s)
	if err != nil || p.Spec.Bandwidth != nil {
		t.Fatalf("zero limits: %v, spec.bandwidth %v; want them stored unset", err, p.GetSpec().GetBandwidth())
	}
	s.Bandwidth = nil
	if _, err := e.create(s); err != nil {
		t.Errorf("the same port without bandwidth: %v", err)
	}
	s.Bandwidth = &agentv1.Bandwidth{Egress: rate(1e9, 0)}
	if _, err := e.create(s); code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "spec.bandwidth") {
		t.Errorf("the same port with a limit: %v, want AlreadyExists naming spec.bandwidth", err)
	}
}

func TestFirstDifferenceBandwidth(t *testing.T) {
	for _, c := range []struct {
		a, b *agentv1.Bandwidth
		want string
	}{
		{nil, nil, ""},
		{&agentv1.Bandwidth{Ingress: rate(1e6, 0)}, &agentv1.Bandwidth{Ingress: rate(1e6, 0)}, ""},
		{nil, &agentv1.Bandwidth{Ingress: rate(1e6, 0)}, "bandwidth"},
		{&agentv1.Bandwidth{Ingress: rate(1e6, 0)}, &agentv1.Bandwidth{Egress: rate(1e6, 0)}, "bandwidth"},
		{&agentv1.Bandwidth{Ingress: rate(1e6, 0)}, &agentv1.Bandwidth{Ingress: rate(1e6, 1e6)}, "bandwidth"},
	} {
		x, y := normalize(&agentv1.PortSpec{Id: "p", Bandwidth: c.a}), normalize(&agentv1.PortSpec{Id: "p", Bandwidth: c.b})
		if got := firstDifference(x, y); got != c.want {
			t.Errorf("%v vs %v: %q, want %q", c.a, c.b, got, c.want)
		}
	}
}

// A port's limits reach the dataplane and GetStats, SetPortBandwidth
// changes them live, and the state file keeps what the port has across
// a restart (schema 5 only while some port has limits).
func TestBandwidthThroughTheAgent(t *testing.T) {
	dir := shortDir(t)
	e := start(t, dir, nil, 4)
	s := e.spec("r", 2)
	s.Bandwidth = &agentv1.Bandwidth{Ingress: rate(100e6, 0), Egress: rate(1e9, 1<<32-1)}
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	if _, err := e.create(e.spec("free", 1)); err != nil {
		t.Fatal(err)
	}
	has := func(e *env, want *agentv1.Bandwidth, when string) {
		t.Helper()
		ps, ok := e.dp.PortStats("r")
		if !ok || ps.Bandwidth != limitsOf(want) {
			t.Errorf("%s: the dataplane enforces %+v, want %+v", when, ps.Bandwidth, limitsOf(want))
		}
		st, err := e.client.GetStats(context.Background(), &agentv1.GetStatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Ports {
			w := want
			if p.Id != "r" {
				w = nil
			}
			if !proto.Equal(p.Bandwidth, w) {
				t.Errorf("%s: GetStats port %s bandwidth %v, want %v", when, p.Id, p.Bandwidth, w)
			}
		}
		p, err := e.client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: "r"})
		if err != nil || !proto.Equal(p.Spec.Bandwidth, want) {
			t.Errorf("%s: GetPort spec.bandwidth %v (%v), want %v", when, p.GetSpec().GetBandwidth(), err, want)
		}
	}
	schema := func(want string, field bool) {
		t.Helper()
		b, _ := os.ReadFile(filepath.Join(e.state, stateName))
		if !bytes.Contains(b, []byte(`"schemaVersion": `+want)) || bytes.Contains(b, []byte(`"bandwidth"`)) != field {
			t.Errorf("state file: want schema %s, bandwidth stored %v:\n%s", want, field, b)
		}
	}
	has(e, s.Bandwidth, "created")
	schema("5", true)

	e.stop()
	e = start(t, dir, nil, 4)
	has(e, s.Bandwidth, "restored")

	set := &agentv1.Bandwidth{Egress: rate(50e6, 0)}
	p, err := e.client.SetPortBandwidth(context.Background(), &agentv1.SetPortBandwidthRequest{Id: "r", Bandwidth: set})
	if err != nil || !proto.Equal(p.Spec.Bandwidth, set) {
		t.Fatalf("SetPortBandwidth: %v, spec.bandwidth %v", err, p.GetSpec().GetBandwidth())
	}
	has(e, set, "set")
	// What the port has now is its spec: a CNI ADD again with the old
	// limits is a different port.
	if _, err := e.create(s); code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "spec.bandwidth") {
		t.Errorf("create with the former limits: %v, want AlreadyExists naming spec.bandwidth", err)
	}
	e.stop()
	e = start(t, dir, nil, 4)
	has(e, set, "restored after set")

	for _, c := range []struct {
		req  *agentv1.SetPortBandwidthRequest
		code codes.Code
		want string
	}{
		{&agentv1.SetPortBandwidthRequest{Id: "r", Bandwidth: &agentv1.Bandwidth{Ingress: rate(1000, 0)}}, codes.InvalidArgument, "bandwidth.ingress: 1000 bits/s is outside 8000..1000000000000"},
		{&agentv1.SetPortBandwidthRequest{Id: "r", Bandwidth: &agentv1.Bandwidth{Ingress: rate(0, 1)}}, codes.InvalidArgument, "bandwidth.ingress: a burst (1 bits) without a rate"},
		{&agentv1.SetPortBandwidthRequest{Id: "nope", Bandwidth: set}, codes.NotFound, `id: no port "nope"`},
		{&agentv1.SetPortBandwidthRequest{Bandwidth: set}, codes.InvalidArgument, "id: must not be empty"},
	} {
		if _, err := e.client.SetPortBandwidth(context.Background(), c.req); code(err) != c.code || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SetPortBandwidth %v: %v, want %v %q", c.req, err, c.code, c.want)
		}
	}
	has(e, set, "after refused changes")

	if _, err := e.client.SetPortBandwidth(context.Background(), &agentv1.SetPortBandwidthRequest{Id: "r"}); err != nil {
		t.Fatal(err)
	}
	has(e, nil, "cleared")
	schema("2", false)
}

// A port from the config file takes its limits there.
func TestBandwidthOfStaticPortRefused(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	s := e.spec("st", 1)
	s.Bandwidth = &agentv1.Bandwidth{Ingress: rate(1e9, 0)}
	if err := e.ag.CreateStatic(s); err != nil {
		t.Fatal(err)
	}
	if ps, _ := e.dp.PortStats("st"); ps.Bandwidth.Ingress.BitsPerSecond != 1e9 {
		t.Errorf("static port: the dataplane enforces %+v", ps.Bandwidth)
	}
	_, err := e.client.SetPortBandwidth(context.Background(), &agentv1.SetPortBandwidthRequest{Id: "st"})
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "config file") {
		t.Errorf("SetPortBandwidth on a static port: %v, want FailedPrecondition naming the config file", err)
	}
}

// An upgrade's successor (a handoff) gives the port the limits it had,
// the ones set live included.
func TestBandwidthSurvivesTheHandoff(t *testing.T) {
	dir := shortDir(t)
	e := start(t, dir, nil, 2)
	s := e.spec("h", 1)
	s.Bandwidth = &agentv1.Bandwidth{Ingress: rate(10e6, 0)}
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	set := &agentv1.Bandwidth{Ingress: rate(20e6, 1e6), Egress: rate(30e6, 0)}
	if _, err := e.client.SetPortBandwidth(context.Background(), &agentv1.SetPortBandwidthRequest{Id: "h", Bandwidth: set}); err != nil {
		t.Fatal(err)
	}
	dp2, err := dataplane.New(dataplane.Config{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	e2 := startOn(t, dir, dp2, 2)
	waitServed(t, e2)
	if ps, ok := dp2.PortStats("h"); !ok || ps.Bandwidth != limitsOf(set) {
		t.Errorf("the successor enforces %+v (port there: %v), want %+v", ps.Bandwidth, ok, limitsOf(set))
	}
	if h, ok := e2.ag.LastHandoff(); !ok || h.Role != "adopted" {
		t.Errorf("last handoff %+v %v, want adopted", h, ok)
	}
}

// The policed and shaped counters reach GetStats and the metrics, with
// the limits as a gauge per direction.
func TestRateLimitCountersInStatsAndMetrics(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	s := e.spec("q", 2)
	s.Bandwidth = &agentv1.Bandwidth{Ingress: rate(100e6, 0)}
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	p, ok := e.dp.Port("q")
	if !ok {
		t.Fatal("port q is not in the dataplane")
	}
	p.Vrings()[2*1].Counters.DropRateLimited.Add(5) // pair 1's RX ring
	p.Vrings()[2*1+1].Counters.Shaped.Add(7)        // pair 1's TX ring
	st, err := e.client.GetStats(context.Background(), &agentv1.GetStatsRequest{Ids: []string{"q"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range st.Ports[0].Queues {
		if q.Drops.GetRateLimited() != uint64(5*q.Pair) || q.GetShaped() != uint64(7*q.Pair) {
			t.Errorf("GetStats pair %d: drops.rate_limited %d, shaped %d; want %d, %d", q.Pair, q.Drops.GetRateLimited(), q.GetShaped(), 5*q.Pair, 7*q.Pair)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fams := scrape(t, serveMetrics(ctx, t, e))
	values := func(name string, match func(l map[string]string) bool) map[string]float64 {
		out := map[string]float64{}
		for _, m := range fams[name].GetMetric() {
			l := map[string]string{}
			for _, lp := range m.Label {
				l[lp.GetName()] = lp.GetValue()
			}
			if match(l) {
				out[l["queue"]+l["direction"]] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		return out
	}
	if got := values("vhostmq_queue_drops_total", func(l map[string]string) bool { return l["reason"] == "rate_limited" }); got["0"] != 0 || got["1"] != 5 || len(got) != 2 {
		t.Errorf("vhostmq_queue_drops_total{reason=\"rate_limited\"} by queue: %v, want 0: 0, 1: 5", got)
	}
	if got := values("vhostmq_queue_shaped_total", func(map[string]string) bool { return true }); got["0"] != 0 || got["1"] != 7 || len(got) != 2 {
		t.Errorf("vhostmq_queue_shaped_total by queue: %v, want 0: 0, 1: 7", got)
	}
	if got := values("vhostmq_port_bandwidth_limit_bits_per_second", func(map[string]string) bool { return true }); len(got) != 1 || got["ingress"] != 100e6 {
		t.Errorf("vhostmq_port_bandwidth_limit_bits_per_second: %v, want ingress 1e8 only", got)
	}
}
