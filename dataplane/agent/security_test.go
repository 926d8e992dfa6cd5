package agent

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
)

// The spec's port_security and IPAM addresses become the dataplane's
// PortOptions.Security (the same options reach AddPort and AdoptPort).
func TestSecurityOptions(t *testing.T) {
	on, off := true, false
	ips := &agentv1.IPConfig{Addresses: []string{"10.1.2.3/24", "fd00::3/64"}}
	for _, c := range []struct {
		name string
		spec *agentv1.PortSpec
		want dataplane.PortSecurity
	}{
		{"unset, no ip", &agentv1.PortSpec{}, dataplane.PortSecurity{}},
		{"true, no ip", &agentv1.PortSpec{PortSecurity: &on}, dataplane.PortSecurity{}},
		{"unset, IPAM addresses", &agentv1.PortSpec{Ip: ips},
			dataplane.PortSecurity{IPs: []netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd00::3")}}},
		{"false", &agentv1.PortSpec{PortSecurity: &off, Ip: ips}, dataplane.PortSecurity{Off: true}},
	} {
		if got := security(normalize(c.spec)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestFirstDifferencePortSecurity(t *testing.T) {
	on, off := true, false
	for _, c := range []struct {
		a, b *bool
		want string
	}{
		{nil, nil, ""}, {nil, &on, ""}, {&on, nil, ""}, {&off, &off, ""},
		{nil, &off, "port_security"}, {&off, nil, "port_security"}, {&on, &off, "port_security"},
	} {
		x, y := &agentv1.PortSpec{Id: "p", PortSecurity: c.a}, &agentv1.PortSpec{Id: "p", PortSecurity: c.b}
		if got := firstDifference(x, y); got != c.want {
			t.Errorf("%v vs %v: %q, want %q", c.a, c.b, got, c.want)
		}
		if got := firstDifference(normalize(x), normalize(y)); got != c.want {
			t.Errorf("normalized %v vs %v: %q, want %q", c.a, c.b, got, c.want)
		}
	}
}

// port_security through the API: on by default and stored unset, off kept
// in GetPort, ListPorts and across a restart (state schema 4).
func TestPortSecurityThroughTheAgent(t *testing.T) {
	dir := shortDir(t)
	e := start(t, dir, nil, 2)
	on, off := true, false
	a := e.spec("a", 1)
	a.Ip = &agentv1.IPConfig{Addresses: []string{"10.1.2.3/24"}}
	pa, err := e.create(a)
	if err != nil {
		t.Fatal(err)
	}
	if pa.Spec.PortSecurity != nil || !pa.Spec.PortSecurityOn() {
		t.Errorf("default: port_security %v, want unset (on)", pa.Spec.PortSecurity)
	}
	explicit := proto.Clone(a).(*agentv1.PortSpec)
	explicit.PortSecurity = &on
	if _, err := e.create(explicit); err != nil {
		t.Errorf("the same port with port_security true: %v", err)
	}
	explicit.PortSecurity = &off
	if _, err := e.create(explicit); code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "spec.port_security") {
		t.Errorf("the same port with port_security false: %v, want AlreadyExists naming spec.port_security", err)
	}
	stored, _ := os.ReadFile(filepath.Join(e.state, stateName))
	if !bytes.Contains(stored, []byte(`"schemaVersion": 2`)) || bytes.Contains(stored, []byte("portSecurity")) {
		t.Errorf("ports with port security on: the state file should stay schema 2 without the field:\n%s", stored)
	}

	b := e.spec("b", 1)
	b.PortSecurity = &off
	if _, err := e.create(b); err != nil {
		t.Fatal(err)
	}
	offIn := func(c agentv1.AgentClient, when string) {
		t.Helper()
		p, err := c.GetPort(context.Background(), &agentv1.GetPortRequest{Id: "b"})
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if p.Spec.PortSecurity == nil || p.Spec.PortSecurityOn() {
			t.Errorf("%s: GetPort says port_security %v, want false", when, p.Spec.PortSecurity)
		}
		l, err := c.ListPorts(context.Background(), &agentv1.ListPortsRequest{})
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		for _, p := range l.Ports {
			if want := p.Spec.Id != "b"; p.Spec.PortSecurityOn() != want {
				t.Errorf("%s: ListPorts: port %s port_security on = %v, want %v", when, p.Spec.Id, !want, want)
			}
		}
	}
	offIn(e.client, "created")
	stored, _ = os.ReadFile(filepath.Join(e.state, stateName))
	if !bytes.Contains(stored, []byte(`"schemaVersion": 4`)) || !bytes.Contains(stored, []byte(`"portSecurity": false`)) {
		t.Errorf("a port with port security off: the state file should be schema 4 with the field:\n%s", stored)
	}
	e.stop()
	e2 := start(t, dir, nil, 2)
	offIn(e2.client, "restored")
}

// Through the agent, the spec decides what the dataplane lets a guest
// send: a foreign source is dropped and counted with port security on and
// passes with it off (package dataplane tests the enforcement itself).
func TestPortSecurityReachesTheDataplane(t *testing.T) {
	e := start(t, shortDir(t), nil, 4)
	off := false
	a, b, c := e.spec("a", 1), e.spec("b", 1), e.spec("c", 1)
	a.Mac, b.Mac, c.Mac, c.PortSecurity = "52:54:00:00:00:0a", "52:54:00:00:00:0b", "52:54:00:00:00:0c", &off
	var fs []*frontend.Frontend
	for _, s := range []*agentv1.PortSpec{a, b, c} {
		if _, err := e.create(s); err != nil {
			t.Fatal(err)
		}
		f, err := frontend.Dial(s.SocketPath, frontend.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fs = append(fs, f)
	}
	fa, fb, fc := fs[0], fs[1], fs[2]
	exchange(t, fa, fb) // the switch learns b's MAC
	foreign := [6]byte{0x52, 0x54, 0, 0, 0, 0x66}
	spoofed, bridged := frame(macB, foreign), frame(macB, foreign)
	bridged[len(bridged)-1] ^= 1
	if err := fa.Send(0, spoofed); err != nil {
		t.Fatal(err)
	}
	if err := fc.Send(0, bridged); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); ; {
		got, err := fb.Recv(0, 10*time.Millisecond)
		if err == nil && bytes.Equal(got, spoofed) {
			t.Fatal("a frame from a foreign MAC crossed a port with port security on")
		}
		if err == nil && bytes.Equal(got, bridged) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a frame from a foreign MAC did not cross a port with port security off")
		}
	}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := e.client.GetStats(context.Background(), &agentv1.GetStatsRequest{Ids: []string{"a", "c"}})
		if err != nil {
			t.Fatal(err)
		}
		na, nc := st.Ports[0].Queues[0].Drops.GetSpoofed(), st.Ports[1].Queues[0].Drops.GetSpoofed()
		if na == 1 && nc == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drops.spoofed: port a %d, port c %d; want 1 and 0", na, nc)
		}
	}
}

// The spoofed TX drop counter reaches GetStats and the drops metric.
func TestSpoofedDropsInStatsAndMetrics(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	if _, err := e.create(e.spec("s", 2)); err != nil {
		t.Fatal(err)
	}
	p, ok := e.dp.Port("s")
	if !ok {
		t.Fatal("port s is not in the dataplane")
	}
	p.Vrings()[2*1+1].Counters.DropSpoofed.Add(3) // pair 1's TX ring
	st, err := e.client.GetStats(context.Background(), &agentv1.GetStatsRequest{Ids: []string{"s"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range st.Ports[0].Queues {
		if want := uint64(3 * q.Pair); q.Drops.GetSpoofed() != want {
			t.Errorf("GetStats pair %d: drops.spoofed %d, want %d", q.Pair, q.Drops.GetSpoofed(), want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	fams := scrape(t, serveMetrics(ctx, t, e))
	got := map[string]float64{}
	for _, m := range fams["vhostmq_queue_drops_total"].GetMetric() {
		l := map[string]string{}
		for _, lp := range m.Label {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["reason"] == "spoofed" {
			got[l["queue"]] = m.GetCounter().GetValue()
		}
	}
	if want := map[string]float64{"0": 0, "1": 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("vhostmq_queue_drops_total{reason=\"spoofed\"} by queue: %v, want %v", got, want)
	}
}
