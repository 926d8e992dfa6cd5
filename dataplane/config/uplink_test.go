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
		"uplink: {}\n": "uplink: names no kind (tap)",
		"uplink:\n  tap:\n    name: a-very-long-tap-name\n": "uplink.tap.name:",
		"uplink:\n  tap:\n    attach: a-very-long-bridge\n": "uplink.tap.attach:",
		"uplink:\n  tap:\n    mtu: 10\n":                    "uplink.tap.mtu: 10 is outside",
		"uplink:\n  tap:\n    bridge: br0\n":                "field bridge not found",
		"uplink:\n  af_xdp: {}\n":                           "field af_xdp not found",
	} {
		if _, err := Parse([]byte(yaml)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", yaml, err, want)
		}
	}
}
