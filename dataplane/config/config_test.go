package config

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane"
)

const validYAML = `
cpus: [0]
statsFile: /run/vhostmq/stats.json
logLevel: info
macAgeSeconds: 300
requireSealedMemory: true
ports:
  - name: vm1
    socket: /var/run/vhostmq/vm1.sock
    role: client
    queuePairs: 4
    mtu: 9000
    mac: "52:54:00:12:34:56"
  - name: vm2
    socket: /var/run/vhostmq/vm2.sock
    role: server
    queuePairs: 1
`

func TestParseValid(t *testing.T) {
	c, err := Parse([]byte(validYAML))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.CPUs) != 1 || c.CPUs[0] != 0 || c.StatsFile != "/run/vhostmq/stats.json" || c.LogLevel != "info" || c.MACAgeSeconds != 300 || !c.RequireSealedMemory {
		t.Errorf("top level: %+v", c)
	}
	if len(c.Ports) != 2 {
		t.Fatalf("%d ports", len(c.Ports))
	}
	p := c.Ports[0]
	if p.Name != "vm1" || p.Socket != "/var/run/vhostmq/vm1.sock" || p.Role != "client" || p.QueuePairs != 4 || p.MTU != 9000 || p.MAC != "52:54:00:12:34:56" {
		t.Errorf("port 0: %+v", p)
	}
	nc, err := p.NetdevConfig()
	if err != nil || nc.MTU != 9000 || nc.MAC.String() != "52:54:00:12:34:56" || string(nc.Role) != "client" {
		t.Errorf("NetdevConfig(port 0) = %+v, %v", nc, err)
	}
	nc, err = c.Ports[1].NetdevConfig()
	if err != nil || nc.MTU != 1500 || nc.MAC != nil {
		t.Errorf("NetdevConfig(port 1) = %+v, %v; want MTU 1500 by default and no MAC", nc, err)
	}
}

func TestParseMinimal(t *testing.T) {
	for _, y := range []string{"", "{}", "ports: []", "logLevel: DEBUG", "logLevel: Warn", "macAgeSeconds: 0"} {
		if _, err := Parse([]byte(y)); err != nil {
			t.Errorf("%q: %v", y, err)
		}
	}
}

// withPort returns a config holding one valid port with the given fields
// replaced or added; the value "-" drops a field.
func withPort(fields map[string]string) string {
	keys := []string{"name", "socket", "role", "queuePairs"}
	vals := map[string]string{"name": "vm1", "socket": "/run/vm1.sock", "role": "server", "queuePairs": "2"}
	for k, v := range fields {
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	var kv []string
	for _, k := range keys {
		if v := vals[k]; v != "-" {
			kv = append(kv, k+": "+v)
		}
	}
	return "ports:\n  - {" + strings.Join(kv, ", ") + "}\n"
}

func TestParseInvalid(t *testing.T) {
	ncpu := len(cpusAllowed(t))
	long := "/" + strings.Repeat("s", 107)  // 108 bytes
	limit := "/" + strings.Repeat("s", 106) // 107 bytes
	for _, c := range []struct {
		name  string
		yaml  string
		field string // what the error must name; "" means valid
	}{
		{"cpu negative", "cpus: [-1]", "cpus[0]"},
		{"guest memory bound negative", "maxGuestMemoryGiB: -1", "maxGuestMemoryGiB"},
		{"guest memory bound too large", "maxGuestMemoryGiB: 70000", "maxGuestMemoryGiB"},
		{"guest memory bound", "maxGuestMemoryGiB: 2048", ""},
		{"uplink MAC limit negative", "uplink: {tap: {}, maxMACs: -1}", "uplink.maxMACs"},
		{"uplink MAC limit too large", "uplink: {tap: {}, maxMACs: 2000000}", "uplink.maxMACs"},
		{"uplink MAC limit", "uplink: {tap: {}, maxMACs: 65536}", ""},
		{"cpu out of range", fmt.Sprintf("cpus: [0, %d]", 4096), "cpus[1]"},
		{"cpu duplicate", "cpus: [0, 0]", "cpus[1]"},
		{"cpu highest", fmt.Sprintf("cpus: [%d]", ncpu-1), ""},
		{"log level", "logLevel: verbose", "logLevel"},
		{"log level number", "logLevel: 3", "logLevel"},
		{"mac age negative", "macAgeSeconds: -1", "macAgeSeconds"},
		{"name empty", withPort(map[string]string{"name": `""`}), "name"},
		{"name missing", withPort(map[string]string{"name": "-"}), "name"},
		{"socket empty", withPort(map[string]string{"socket": `""`}), "socket"},
		{"socket 108 bytes", withPort(map[string]string{"socket": long}), "socket"},
		{"socket 107 bytes", withPort(map[string]string{"socket": limit}), ""},
		{"role", withPort(map[string]string{"role": "both"}), "role"},
		{"role case", withPort(map[string]string{"role": "Server"}), "role"},
		{"role missing", withPort(map[string]string{"role": "-"}), "role"},
		{"queue pairs 0", withPort(map[string]string{"queuePairs": "0"}), "queuePairs"},
		{"queue pairs 1", withPort(map[string]string{"queuePairs": "1"}), ""},
		{"queue pairs 128", withPort(map[string]string{"queuePairs": "128"}), ""},
		{"queue pairs 129", withPort(map[string]string{"queuePairs": "129"}), "queuePairs"},
		{"queue pairs negative", withPort(map[string]string{"queuePairs": "-4"}), "queuePairs"},
		{"mtu 67", withPort(map[string]string{"mtu": "67"}), "mtu"},
		{"mtu 68", withPort(map[string]string{"mtu": "68"}), ""},
		{"mtu 9702", withPort(map[string]string{"mtu": "9702"}), ""},
		{"mtu 9703", withPort(map[string]string{"mtu": "9703"}), "mtu"},
		{"mtu negative", withPort(map[string]string{"mtu": "-1500"}), "mtu"},
		{"mac short", withPort(map[string]string{"mac": `"52:54:00:12:34"`}), "mac"},
		{"mac eui64", withPort(map[string]string{"mac": `"02:00:5e:10:00:00:00:01"`}), "mac"},
		{"mac garbage", withPort(map[string]string{"mac": "vm1"}), "mac"},
		{"mac dashes", withPort(map[string]string{"mac": "52-54-00-12-34-56"}), ""},
		{"port security off", withPort(map[string]string{"portSecurity": "false"}), ""},
		{"port security on", withPort(map[string]string{"portSecurity": "true"}), ""},
		{"ips", withPort(map[string]string{"ips": `["10.0.0.3", "fd00::3", "::ffff:10.0.0.4"]`}), ""},
		{"ips bad", withPort(map[string]string{"ips": `["10.0.0.3", "10.0.0.300"]`}), "ips[1]"},
		{"ips prefix", withPort(map[string]string{"ips": `["10.0.0.3/24"]`}), "ips[0]"},
		{"ips zone", withPort(map[string]string{"ips": `["fe80::1%eth0"]`}), "ips[0]"},
		{"ips unspecified", withPort(map[string]string{"ips": `["0.0.0.0"]`}), "ips[0]"},
		{"ips multicast", withPort(map[string]string{"ips": `["ff02::1"]`}), "ips[0]"},
		{"ips broadcast", withPort(map[string]string{"ips": `["255.255.255.255"]`}), "ips[0]"},
		{"ips twice", withPort(map[string]string{"ips": `["10.0.0.3", "::ffff:10.0.0.3"]`}), "ips[1]"},
		{"bandwidth", withPort(map[string]string{"bandwidth": "{ingress: 100M, egress: 1.5G, ingressBurst: 1Mi, egressBurst: 12000}"}), ""},
		{"bandwidth numbers", withPort(map[string]string{"bandwidth": "{ingress: 100000000, egress: 1.5e9}"}), ""},
		{"bandwidth empty", withPort(map[string]string{"bandwidth": "{}"}), ""},
		{"bandwidth not a quantity", withPort(map[string]string{"bandwidth": "{ingress: fast}"}), "bandwidth.ingress"},
		{"bandwidth too slow", withPort(map[string]string{"bandwidth": "{egress: 1k}"}), "bandwidth.egress"},
		{"bandwidth milli", withPort(map[string]string{"bandwidth": "{egress: 100m}"}), "bandwidth.egress"},
		{"bandwidth too fast", withPort(map[string]string{"bandwidth": "{ingress: 2T}"}), "bandwidth.ingress"},
		{"bandwidth negative", withPort(map[string]string{"bandwidth": "{ingress: -1M}"}), "bandwidth.ingress"},
		{"bandwidth bad burst", withPort(map[string]string{"bandwidth": "{ingress: 1G, ingressBurst: lots}"}), "bandwidth.ingressBurst"},
		{"bandwidth burst alone", withPort(map[string]string{"bandwidth": "{egressBurst: 1M}"}), "bandwidth.egressBurst"},
		{"ips too many", withPort(map[string]string{"ips": `[10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4, 10.0.0.5, 10.0.0.6, 10.0.0.7, 10.0.0.8, 10.0.0.9]`}), "ips"},
	} {
		_, err := Parse([]byte(c.yaml))
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.field != "" && err == nil:
			t.Errorf("%s: accepted\n%s", c.name, c.yaml)
		case c.field != "" && !strings.Contains(err.Error(), c.field+":"):
			t.Errorf("%s: error %q does not name %s", c.name, err, c.field)
		case c.field != "" && strings.HasPrefix(c.yaml, "ports:") && !strings.Contains(err.Error(), "ports[0]"):
			t.Errorf("%s: error %q does not name ports[0]", c.name, err)
		}
	}
}

func TestParsePortSecurity(t *testing.T) {
	c, err := Parse([]byte(`
ports:
  - {name: a, socket: /run/a.sock, role: server, queuePairs: 1, mac: "52:54:00:12:34:56", ips: [10.1.2.3, "fd00::3"]}
  - {name: b, socket: /run/b.sock, role: server, queuePairs: 1, portSecurity: false}
  - {name: c, socket: /run/c.sock, role: server, queuePairs: 1, portSecurity: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b, cc := c.Ports[0], c.Ports[1], c.Ports[2]
	if a.PortSecurity != nil || b.PortSecurity == nil || *b.PortSecurity || cc.PortSecurity == nil || !*cc.PortSecurity {
		t.Errorf("portSecurity: a %v (want unset), b %v (want false), c %v (want true)", a.PortSecurity, b.PortSecurity, cc.PortSecurity)
	}
	addrs, err := a.Addrs()
	if err != nil || len(addrs) != 2 || addrs[0].String() != "10.1.2.3" || addrs[1].String() != "fd00::3" {
		t.Errorf("a.Addrs() = %v, %v", addrs, err)
	}
	if addrs, err := b.Addrs(); err != nil || len(addrs) != 0 {
		t.Errorf("b.Addrs() = %v, %v; want none", addrs, err)
	}
	// A bad address is reported with its port and index.
	_, err = Parse([]byte(`
ports:
  - {name: a, socket: /run/a.sock, role: server, queuePairs: 1}
  - {name: b, socket: /run/b.sock, role: server, queuePairs: 1, ips: ["10.0.0.300"]}
`))
	if err == nil || !strings.Contains(err.Error(), `ports[1]: ips[0]: "10.0.0.300" is not an IP address`) {
		t.Errorf("bad ips: %v", err)
	}
	if _, err := Parse([]byte("ports:\n  - {name: c, socket: /run/c.sock, role: server, queuePairs: 1, portSecurity: maybe}")); err == nil ||
		!strings.Contains(err.Error(), "maybe") {
		t.Errorf("portSecurity maybe: %v", err)
	}
}

// A port's bandwidth: Kubernetes quantities of bits per second (rates)
// and bits (bursts), in the dataplane's bounds; errors name the port and
// the field.
func TestParseBandwidth(t *testing.T) {
	c, err := Parse([]byte(`
ports:
  - {name: a, socket: /run/a.sock, role: server, queuePairs: 1}
  - {name: b, socket: /run/b.sock, role: server, queuePairs: 1, bandwidth: {ingress: 100M, egress: 1Gi, egressBurst: 64Ki}}
  - {name: c, socket: /run/c.sock, role: server, queuePairs: 1, bandwidth: {egress: "8.5k", egressBurst: 0}}
`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []dataplane.Bandwidth{
		{},
		{Ingress: dataplane.Rate{BitsPerSecond: 100_000_000}, Egress: dataplane.Rate{BitsPerSecond: 1 << 30, BurstBits: 64 << 10}},
		{Egress: dataplane.Rate{BitsPerSecond: 8500}},
	} {
		if got, err := c.Ports[i].Limits(); err != nil || got != want {
			t.Errorf("ports[%d].Limits() = %+v, %v; want %+v", i, got, err, want)
		}
	}
	for _, tc := range []struct{ bw, want string }{
		{`{egress: "1.5k"}`, `ports[3]: bandwidth.egress: "1.5k": 1500 bits/s is outside the dataplane's 8000..1000000000000`},
		{`{ingress: 10x}`, `ports[3]: bandwidth.ingress: "10x" is not a quantity like 100M, 1G or 1500k`},
		{`{ingress: 1G, ingressBurst: -5}`, `ports[3]: bandwidth.ingressBurst: "-5" is negative`},
		{`{egressBurst: 1M}`, `ports[3]: bandwidth.egressBurst: a burst without bandwidth.egress`},
		{`{ingress: 100m}`, `(m is milli: M is mega)`},
		{`{ingressRate: 1G}`, `field ingressRate not found`},
	} {
		y := "ports:\n"
		for i := range 4 {
			bw := ""
			if i == 3 {
				bw = ", bandwidth: " + tc.bw
			}
			y += fmt.Sprintf("  - {name: p%d, socket: /run/p%d.sock, role: server, queuePairs: 1%s}\n", i, i, bw)
		}
		if _, err := Parse([]byte(y)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bandwidth %s: %v, want %q", tc.bw, err, tc.want)
		}
	}
}

func TestParseDuplicatePorts(t *testing.T) {
	for _, c := range []struct {
		name, yaml, want string
	}{
		{"name", `
ports:
  - {name: a, socket: /run/a.sock, role: server, queuePairs: 1}
  - {name: b, socket: /run/b.sock, role: server, queuePairs: 1}
  - {name: a, socket: /run/c.sock, role: client, queuePairs: 1}
`, `ports[2]: name: "a" is used twice`},
		{"socket", `
ports:
  - {name: a, socket: /run/a.sock, role: server, queuePairs: 1}
  - {name: b, socket: /run/a.sock, role: client, queuePairs: 1}
`, `ports[1]: socket: "/run/a.sock" is used twice`},
	} {
		_, err := Parse([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("duplicate %s: err %v, want %q", c.name, err, c.want)
		}
	}
}

func TestParseRejectsUnknownAndMalformed(t *testing.T) {
	for _, y := range []string{
		"cpu: [0]",
		"logLevle: info",
		"ports:\n  - {name: a, socket: /run/a.sock, role: server, queuePairs: 1, queues: 4}",
		"ports:\n  - {name: a, socket: /run/a.sock, role: server, queuePairs: four}",
		"logLevel: info\nlogLevel: debug", // duplicate key
		"cpus: 0",                         // not a list
		"ports: {name: a}",                // not a list
		"ports:\n  - name: [a]",           // wrong type
		"macAgeSeconds: 1.5",              // not an integer
		"cpus: [0\n",                      // broken YAML
		"ports:\n  - {name: a, socket: /run/a.sock, role: server, queuePairs: 99999999999999999999}", // overflow
	} {
		if c, err := Parse([]byte(y)); err == nil {
			t.Errorf("accepted %q as %+v", y, c)
		} else if !strings.HasPrefix(err.Error(), "config: ") {
			t.Errorf("%q: error %q lacks the config: prefix", y, err)
		}
	}
}

// Every problem is reported, not only the first.
func TestParseReportsAll(t *testing.T) {
	_, err := Parse([]byte(`
cpus: [-1]
logLevel: loud
macAgeSeconds: -5
ports:
  - {name: a, socket: /run/a.sock, role: server, queuePairs: 0}
  - {name: b, socket: /run/b.sock, role: peer, queuePairs: 1}
`))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"cpus[0]", "logLevel", "macAgeSeconds", "ports[0]", "queuePairs", "ports[1]", "role"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s:\n%v", want, err)
		}
	}
}

func TestLoad(t *testing.T) {
	p := t.TempDir() + "/vhostmq.yaml"
	if err := os.WriteFile(p, []byte(validYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := Load(p); err != nil || len(c.Ports) != 2 {
		t.Errorf("Load = %v, %v", c, err)
	}
	if _, err := Load(p + ".missing"); err == nil {
		t.Errorf("Load of a missing file succeeded")
	}
}

// cpusAllowed returns the CPUs this process may run on.
func cpusAllowed(t *testing.T) []int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for i := range 1024 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// cpus names CPUs the process may run on, as a DaemonSet pinned by the
// kubelet's static CPU manager (say to CPUs 4-5) sees them: the numbers are
// CPU ids, not indexes below the CPU count.
func TestCPUsFollowAffinity(t *testing.T) {
	allowed := cpusAllowed(t)
	if len(allowed) < 2 {
		t.Skip("needs 2 CPUs")
	}
	cpu := allowed[len(allowed)-1]
	// Start a child pinned to that one CPU: a child inherits the affinity
	// of the thread that forks it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		t.Fatal(err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Skipf("cannot pin: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCPUsAffinityChild$", "-test.v")
	cmd.Env = append(os.Environ(), "VHOSTMQ_CONFIG_CHILD_CPU="+strconv.Itoa(cpu))
	out, err := cmd.CombinedOutput()
	unix.SchedSetaffinity(0, &old)
	if err != nil || !strings.Contains(string(out), "--- PASS: TestCPUsAffinityChild") {
		t.Errorf("child pinned to CPU %d: %v\n%s", cpu, err, out)
	}
}

func TestCPUsAffinityChild(t *testing.T) {
	s := os.Getenv("VHOSTMQ_CONFIG_CHILD_CPU")
	if s == "" {
		t.Skip("run by TestCPUsFollowAffinity")
	}
	cpu, _ := strconv.Atoi(s)
	if _, err := Parse([]byte(fmt.Sprintf("cpus: [%d]", cpu))); err != nil {
		t.Errorf("the only CPU this process may use is refused: %v", err)
	}
	other := 0
	if cpu == 0 {
		other = 1
	}
	if _, err := Parse([]byte(fmt.Sprintf("cpus: [%d]", other))); err == nil {
		t.Errorf("CPU %d is accepted though the process may not run on it", other)
	}
	// no cpus: a worker on every CPU this process may use (a pod's cpuset)
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("logLevel: info\n"), 0o600)
	if c, err := Load(f); err != nil || len(c.CPUs) != 1 || c.CPUs[0] != cpu {
		t.Errorf("Load without cpus, pinned to CPU %d: %v, %v", cpu, c, err)
	}
}

func TestLoadDefaultsToEveryAllowedCPU(t *testing.T) {
	f := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(f, []byte("{}\n"), 0o600)
	c, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if want := cpusAllowed(t); fmt.Sprint(c.CPUs) != fmt.Sprint(want) {
		t.Errorf("cpus = %v, want every allowed CPU %v", c.CPUs, want)
	}
}

// Field names are case-sensitive: a key that differs from a field only in
// case is an unknown field, not a second value for it.
func TestParseFieldCase(t *testing.T) {
	for _, y := range []string{
		"LOGLEVEL: info",
		"logLevel: info\nLogLevel: loud", // one of the two is silently dropped
		"ports: [{name: a, socket: /run/a.sock, role: server, queuepairs: 1}]",
	} {
		if c, err := Parse([]byte(y)); err == nil {
			t.Errorf("accepted %q as %+v", y, c)
		}
	}
}
