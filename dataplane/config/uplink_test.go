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
		"uplink: {}\n": "uplink: names no kind (tap or af_xdp)",
		"uplink:\n  tap:\n    name: a-very-long-tap-name\n":         "uplink.tap.name:",
		"uplink:\n  tap:\n    attach: a-very-long-bridge\n":         "uplink.tap.attach:",
		"uplink:\n  tap:\n    mtu: 10\n":                            "uplink.tap.mtu: 10 is outside",
		"uplink:\n  tap:\n    bridge: br0\n":                        "field bridge not found",
		"uplink:\n  af_xdp: {}\n":                                   `uplink.af_xdp.interface: "" must be 1..15 bytes`,
		"uplink:\n  af_xdp:\n    interface: a-very-long-nic-name\n": "uplink.af_xdp.interface:",
		"uplink:\n  af_xdp:\n    nic: eth1\n":                       "field nic not found",
		"uplink:\n  af_xdp:\n    interface: eth1\n  tap: {}\n":      "uplink: names two kinds (tap and af_xdp)",
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
