package config

import (
	"strings"
	"testing"
)

func TestParseTapUplink(t *testing.T) {
	c, err := Parse([]byte("uplink:\n  tap:\n    attach: br0\n    mtu: 9000\n"))
	if err != nil {
		t.Fatal(err)
	}
	tc := c.TapConfig()
	if tc == nil || tc.Name != DefaultTapName || tc.Attach != "br0" || tc.MTU != 9000 {
		t.Errorf("tap config %+v", tc)
	}
	if c, _ := Parse([]byte("cpus: [0]\n")); c.TapConfig() != nil {
		t.Error("a config without uplink has a tap uplink")
	}
	for yaml, want := range map[string]string{
		"uplink: {}\n": "uplink: names no kind (tap, af_xdp or vxlan)",
		"uplink:\n  tap:\n    name: a-very-long-tap-name\n":         "uplink.tap.name:",
		"uplink:\n  tap:\n    attach: a-very-long-bridge\n":         "uplink.tap.attach:",
		"uplink:\n  tap:\n    mtu: 10\n":                            "uplink.tap.mtu: 10 is outside",
		"uplink:\n  tap:\n    bridge: br0\n":                        "field bridge not found",
		"uplink:\n  af_xdp: {}\n":                                   `uplink.af_xdp.interface: "" must be 1..15 bytes`,
		"uplink:\n  af_xdp:\n    interface: a-very-long-nic-name\n": "uplink.af_xdp.interface:",
		"uplink:\n  af_xdp:\n    nic: eth1\n":                       "field nic not found",
		"uplink:\n  af_xdp:\n    interface: eth1\n  tap: {}\n":      "uplink: names 2 kinds (tap and af_xdp)",
	} {
		if _, err := Parse([]byte(yaml)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", yaml, err, want)
		}
	}
}

func TestParseAFXDPUplink(t *testing.T) {
	c, err := Parse([]byte("uplink:\n  af_xdp:\n    interface: eth1\n    dedicated: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	xc := c.AFXDPConfig()
	if xc == nil || xc.Interface != "eth1" || !xc.Dedicated || xc.Generic || c.TapConfig() != nil {
		t.Errorf("af_xdp config %+v, tap %+v", xc, c.TapConfig())
	}
	if c, _ := Parse([]byte("cpus: [0]\n")); c.AFXDPConfig() != nil {
		t.Error("a config without uplink has an af_xdp uplink")
	}
}

func TestParseVXLANUplink(t *testing.T) {
	c, err := Parse([]byte("uplink:\n  vxlan:\n    mtu: 9000\n    vteps: [10.0.0.2, 10.0.1.2]\n"))
	if err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		if k == NodeIPEnv {
			return "10.0.0.1"
		}
		return ""
	}
	vc, err := c.VXLANConfig(env)
	if err != nil || vc == nil || vc.Local.String() != "10.0.0.1" || vc.Port != 4789 || vc.MTU != 9000 || len(vc.VTEPs) != 2 {
		t.Fatalf("vxlan config %+v, %v; want local from $NODE_IP, port 4789, mtu 9000, 2 VTEPs", vc, err)
	}
	if _, err := c.VXLANConfig(func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "uplink.vxlan.local (empty: $NODE_IP)") {
		t.Errorf("no local and no $NODE_IP: %v", err)
	}
	if c, _ := Parse([]byte("cpus: [0]\n")); c != nil {
		if vc, err := c.VXLANConfig(env); vc != nil || err != nil {
			t.Errorf("a config without uplink: %+v, %v", vc, err)
		}
	}
	for yaml, want := range map[string]string{
		"uplink:\n  vxlan:\n    local: fe80::1\n":                     `uplink.vxlan.local: "fe80::1" is not an IPv4 address`,
		"uplink:\n  vxlan:\n    mtu: 100\n":                           "uplink.vxlan.mtu: 100 is outside 626..9000",
		"uplink:\n  vxlan:\n    port: 70000\n":                        "uplink.vxlan.port: 70000 is outside 1..65535",
		"uplink:\n  vxlan:\n    vteps: [10.0.0.2, nope]\n":            `uplink.vxlan.vteps[1]: "nope" is not an IPv4 address`,
		"uplink:\n  vxlan:\n    nodes: true\n    vteps: [10.0.0.2]\n": "uplink.vxlan: vteps and nodes exclude each other",
		"uplink:\n  vxlan: {}\n  tap: {}\n":                           "uplink: names 2 kinds (tap and vxlan)",
		"uplink:\n  vxlan:\n    vni: 5\n":                             "field vni not found",
	} {
		if _, err := Parse([]byte(yaml)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", yaml, err, want)
		}
	}
}
