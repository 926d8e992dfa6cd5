package tap

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
)

// inNewNS runs f in a fresh network namespace with a bridge br0 and a
// veth pair v0/v1 (not a bridge).
func inNewNS(t *testing.T, f func(ns string)) {
	name := fmt.Sprintf("vmqtap%d", os.Getpid())
	nettest.AddNetns(t, name)
	for _, args := range [][]string{{"link", "add", "br0", "type", "bridge"}, {"link", "set", "br0", "up"},
		{"link", "add", "v0", "type", "veth", "peer", "name", "v1"}} {
		nettest.Run(t, append([]string{"ip", "-n", name}, args...)...)
	}
	nettest.In(t, name, func() { f(name) })
}

func TestOpenAndCheck(t *testing.T) {
	inNewNS(t, func(ns string) {
		for _, tc := range []struct {
			cfg  Config
			want string
		}{
			{Config{Name: ""}, "name:"},
			{Config{Name: "a-name-longer-than-15"}, "name:"},
			{Config{Name: "t0", MTU: 20}, "mtu:"},
			{Config{Name: "t0", Attach: "nosuch"}, `attach: no interface "nosuch"`},
			{Config{Name: "t0", Attach: "v0"}, `attach: "v0" is a veth interface, not a Linux bridge`},
			{Config{Name: "br0"}, `name: an interface "br0" exists already`},
		} {
			if _, err := Open(tc.cfg, 2); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
			}
		}
		if _, err := Open(Config{Name: "t0"}, 0); err == nil || !strings.HasPrefix(err.Error(), "queues:") {
			t.Errorf("0 queues: %v", err)
		}
		d, err := Open(Config{Name: "t0", Attach: "br0", MTU: 1504}, 3)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := exec.Command("ip", "-n", ns, "-d", "link", "show", "t0").CombinedOutput()
		for _, w := range []string{"mtu 1504", "master br0", "numqueues 3", "vnet_hdr on", "multi_queue", ",UP,"} {
			if !strings.Contains(string(out), w) {
				t.Errorf("tap lacks %q:\n%s", w, out)
			}
		}
		if err := d.Check(); err != nil {
			t.Errorf("healthy tap: %v", err)
		}
		exec.Command("ip", "-n", ns, "link", "set", "t0", "nomaster").Run()
		if err := d.Check(); err == nil || !strings.Contains(err.Error(), "no longer attached to br0") {
			t.Errorf("detached tap: %v", err)
		}
		exec.Command("ip", "-n", ns, "link", "del", "br0").Run()
		if err := d.Check(); err == nil || !strings.Contains(err.Error(), `attach: no interface "br0"`) {
			t.Errorf("bridge gone: %v", err)
		}
		d.Close()
		if out, _ := exec.Command("ip", "-n", ns, "link", "show", "t0").CombinedOutput(); !strings.Contains(string(out), "does not exist") {
			t.Errorf("tap still there after Close:\n%s", out)
		}
	})
}
