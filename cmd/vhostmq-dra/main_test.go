package main

import (
	"strings"
	"testing"

	"github.com/vhostmq/vhostmq/plugin/dra"
)

func TestParseNamesTheFlag(t *testing.T) {
	for _, x := range []struct {
		owner, mode, level string
		mtu                int
		want               string
	}{
		{"107", "0770", "info", 0, "--socket-owner"},
		{"107:x", "0770", "info", 0, "--socket-owner"},
		{"107:107", "77x", "info", 0, "--socket-mode"},
		{"107:107", "0770", "loud", 0, "--log-level"},
		{"107:107", "0770", "info", -1, "--mtu"},
	} {
		rc := dra.RunConfig{}
		rc.MTU = x.mtu
		if err := parse(&rc, x.owner, x.mode, x.level); err == nil || !strings.HasPrefix(err.Error(), x.want) {
			t.Errorf("parse(%q, %q, %q, mtu %d): %v, want an error naming %s", x.owner, x.mode, x.level, x.mtu, err, x.want)
		}
	}
	rc := dra.RunConfig{}
	if err := parse(&rc, "0:0", "0750", "debug"); err != nil || rc.SocketMode != 0o750 || rc.Logger == nil {
		t.Errorf("valid flags: %v %+v", err, rc)
	}
}
