package cni

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/internal/bandwidth"
)

func rate(bps, burst uint64) *agentv1.Rate {
	return &agentv1.Rate{BitsPerSecond: bps, BurstBits: burst}
}

func TestParseRuntimeBandwidth(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want *agentv1.Bandwidth
		ok   bool
		err  string
	}{
		{``, nil, false, ""},
		{`null`, nil, false, ""},
		// containerd's, for kubernetes.io/ingress-bandwidth: 100M
		{`{"ingressRate":100000000,"ingressBurst":4294967295}`, &agentv1.Bandwidth{Ingress: rate(100e6, math.MaxUint32)}, true, ""},
		{`{"ingressRate":8000,"ingressBurst":0,"egressRate":1000000000000,"egressBurst":1000}`, &agentv1.Bandwidth{Ingress: rate(8000, 0), Egress: rate(1e12, 1000)}, true, ""},
		{`{"ingressRate":0,"ingressBurst":0,"egressRate":0,"egressBurst":0}`, nil, true, ""}, // present: no limit on this network
		{`{"ingressRate":7999}`, nil, false, "runtimeConfig.bandwidth.ingressRate: 7999 bits/s is outside the dataplane's 8000..1000000000000 (8 kbit/s..1 Tbit/s) (the runtime passes the pod's kubernetes.io/ingress-bandwidth here)"},
		{`{"egressRate":2000000000000,"egressBurst":1}`, nil, false, "runtimeConfig.bandwidth.egressRate: 2000000000000 bits/s is outside"},
		{`{"egressBurst":4294967295}`, nil, false, "runtimeConfig.bandwidth.egressBurst: 4294967295 bits without an egressRate"},
		{`{"ingressRate":-1}`, nil, false, "runtimeConfig.bandwidth: {\"ingressRate\":-1} is not {ingressRate, ingressBurst, egressRate, egressBurst} in bits per second and bits"},
		{`{"ingressRate":"100M"}`, nil, false, "runtimeConfig.bandwidth: {\"ingressRate\":\"100M\"} is not"},
		{`[1]`, nil, false, "runtimeConfig.bandwidth: [1] is not"},
	} {
		got, ok, err := parseRuntimeBandwidth([]byte(c.raw))
		if c.err == "" && (err != nil || ok != c.ok || !proto.Equal(got, c.want)) {
			t.Errorf("%s: %v, %v, %v; want %v, %v", c.raw, got, ok, err, c.want, c.ok)
		}
		if c.err != "" {
			if te := cniErr(t, err); te.Code != types.ErrInvalidNetworkConfig || !strings.Contains(te.Msg, c.err) {
				t.Errorf("%s: %v; want code %d %q", c.raw, err, types.ErrInvalidNetworkConfig, c.err)
			}
		}
	}
}

// The bandwidth capability's argument, as containerd passes it (its own
// burst, above the dataplane's cap), becomes the port's limits; the same
// ADD again is the same port, and CHECK names a different limit.
func TestBandwidthFromRuntimeConfig(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	rc := func(bw string) []byte {
		return e.conf(`,"deviceID":"c0-s0","capabilities":{"bandwidth":true},"runtimeConfig":{"bandwidth":` + bw + `}`)
	}
	args := cmdArgs(cid, "net1", rc(`{"ingressRate":100000000,"ingressBurst":4294967295,"egressRate":20000000,"egressBurst":4294967295}`))
	mustAdd(t, args)
	mustAdd(t, args)
	want := &agentv1.Bandwidth{Ingress: rate(100e6, math.MaxUint32), Egress: rate(20e6, math.MaxUint32)}
	if got := e.ports()[0].Spec.Bandwidth; !proto.Equal(got, want) {
		t.Errorf("spec.bandwidth %v, want %v", got, want)
	}
	st, err := e.Client.GetStats(context.Background(), &agentv1.GetStatsRequest{})
	if err != nil || len(st.Ports) != 1 || !proto.Equal(st.Ports[0].Bandwidth, want) {
		t.Errorf("the dataplane enforces %v (%v), want %v", st.GetPorts(), err, want)
	}
	if err := CmdCheck(args); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	other := cmdArgs(cid, "net1", rc(`{"ingressRate":200000000,"ingressBurst":4294967295}`))
	if err := CmdCheck(other); cniErr(t, err).Code != ErrPortMismatch ||
		!strings.Contains(err.Error(), "bandwidth is ingress 100000000 bit/s burst 4294967295, egress 20000000 bit/s burst 4294967295, want ingress 200000000 bit/s burst 4294967295, egress none") {
		t.Errorf("CHECK with another limit: %v", err)
	}
	if err := CmdAdd(other); cniErr(t, err).Code != ErrAgentRejected || !strings.Contains(err.Error(), "spec.bandwidth") {
		t.Errorf("ADD again with another limit: %v", err)
	}
	if err := CmdCheck(cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0"`))); cniErr(t, err).Code != ErrPortMismatch || !strings.Contains(err.Error(), "want none") {
		t.Errorf("CHECK without a limit: %v", err)
	}
}

// Without runtimeConfig.bandwidth the plugin reads the pod's
// kubernetes.io annotations itself (default burst); with it, it takes the
// runtime's, which read the same annotations (or a network's own entry).
func TestBandwidthFromAnnotations(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	e.allocate("c0-s1")
	kc, gets := apiServer(t, launcherPod(map[string]string{bandwidth.AnnotationIngress: "1G", bandwidth.AnnotationEgress: "10Mi"}))
	args := cmdArgs(cid, "net1", e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q`, kc)))
	mustAdd(t, args)
	if gets.Load() == 0 {
		t.Fatal("the pod was not read")
	}
	want := &agentv1.Bandwidth{Ingress: rate(1e9, 0), Egress: rate(10<<20, 0)}
	p, err := e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: PortID(cid, "net1")})
	if err != nil || !proto.Equal(p.Spec.Bandwidth, want) {
		t.Errorf("from the annotations: spec.bandwidth %v (%v), want %v", p.GetSpec().GetBandwidth(), err, want)
	}
	if err := CmdCheck(args); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	withRC := cmdArgs(cid, "net2", e.conf(fmt.Sprintf(`,"deviceID":"c0-s1","kubeconfig":%q,"runtimeConfig":{"bandwidth":{"egressRate":5000000,"egressBurst":80000}}`, kc)))
	mustAdd(t, withRC)
	want = &agentv1.Bandwidth{Egress: rate(5e6, 80000)}
	p, err = e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: PortID(cid, "net2")})
	if err != nil || !proto.Equal(p.Spec.Bandwidth, want) {
		t.Errorf("runtimeConfig over the annotations: spec.bandwidth %v (%v), want %v", p.GetSpec().GetBandwidth(), err, want)
	}
}

// A bad limit is an error naming the field or the annotation, before
// anything is made; DEL gets through whatever the runtime passes.
func TestBadBandwidthCreatesNothing(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	devinfo := filepath.Join(e.Dir, "di")
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		rc          string
		code        uint
		msg         string
	}{
		{"runtime rate too slow", nil, `{"ingressRate":1000,"ingressBurst":4294967295}`, types.ErrInvalidNetworkConfig, "runtimeConfig.bandwidth.ingressRate: 1000 bits/s is outside"},
		{"runtime burst alone", nil, `{"egressBurst":100}`, types.ErrInvalidNetworkConfig, "runtimeConfig.bandwidth.egressBurst: 100 bits without an egressRate"},
		{"runtime not numbers", nil, `{"egressRate":"1G"}`, types.ErrInvalidNetworkConfig, "runtimeConfig.bandwidth: "},
		{"annotation not a quantity", map[string]string{bandwidth.AnnotationIngress: "fast"}, "", ErrBadAnnotation,
			`pod annotation kubernetes.io/ingress-bandwidth: "fast" is not a quantity like 100M, 1G or 1500k (bits per second)`},
		{"annotation below Kubernetes' bound", map[string]string{bandwidth.AnnotationEgress: "100m"}, "", ErrBadAnnotation,
			`pod annotation kubernetes.io/egress-bandwidth: "100m" is outside Kubernetes' 1k..1P bits per second (m is milli: M is mega)`},
		{"annotation below the dataplane's", map[string]string{bandwidth.AnnotationEgress: "2k"}, "", ErrBadAnnotation,
			`pod annotation kubernetes.io/egress-bandwidth: "2k": 2000 bits/s is outside the dataplane's 8000..1000000000000`},
	} {
		extra := fmt.Sprintf(`,"deviceID":"c0-s0","runtimeConfig":{"CNIDeviceInfoFile":%q`, devinfo)
		if tc.rc != "" {
			extra += `,"bandwidth":` + tc.rc
		}
		extra += "}"
		if tc.annotations != nil {
			kc, _ := apiServer(t, launcherPod(tc.annotations))
			extra += fmt.Sprintf(`,"kubeconfig":%q`, kc)
		}
		args := cmdArgs(cid, "net1", e.conf(extra))
		err := CmdAdd(args)
		if te := cniErr(t, err); te.Code != tc.code || !strings.Contains(te.Msg, tc.msg) {
			t.Errorf("%s: code %d %q, want %d naming %q", tc.name, te.Code, te.Msg, tc.code, tc.msg)
		}
		if ps := e.ports(); len(ps) != 0 {
			t.Errorf("%s: the refused ADD left %d ports", tc.name, len(ps))
		}
		if _, err := os.Stat(devinfo); !os.IsNotExist(err) {
			t.Errorf("%s: device-info written: %v", tc.name, err)
		}
		if err := CmdDel(args); err != nil {
			t.Errorf("%s: DEL: %v", tc.name, err)
		}
	}
}
