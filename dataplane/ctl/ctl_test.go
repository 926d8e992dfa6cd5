package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

type result struct {
	stdout, stderr string
	code           int
	sleeps         []time.Duration
}

// runCLI runs vhostmqctl args against the agent at sock (found through
// $VHOSTMQ_API_SOCKET), with a clock ticking a second per reading and a
// sleep that returns at once.
func runCLI(t *testing.T, ctx context.Context, sock string, stdout *syncBuffer, args ...string) result {
	t.Helper()
	if ctx == nil {
		ctx = context.Background()
	}
	if stdout == nil {
		stdout = &syncBuffer{}
	}
	var stderr bytes.Buffer
	var res result
	clock := statsEpoch
	r := Runner{
		Stdout: stdout,
		Stderr: &stderr,
		Getenv: func(k string) string {
			if k == EnvSocket {
				return sock
			}
			return ""
		},
		Now: func() time.Time { clock = clock.Add(time.Second); return clock },
		Sleep: func(_ context.Context, d time.Duration) error {
			res.sleeps = append(res.sleeps, d)
			return nil
		},
	}
	res.code = r.Run(ctx, args)
	res.stdout, res.stderr = stdout.String(), stderr.String()
	return res
}

// syncBuffer is a bytes.Buffer safe for the health stream's writes; after
// cancelAfter writes it cancels (a user's ^C after that many updates).
type syncBuffer struct {
	mu          sync.Mutex
	b           bytes.Buffer
	cancelAfter int
	cancel      func()
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.b.Write(p)
	if s.cancelAfter > 0 {
		if s.cancelAfter--; s.cancelAfter == 0 {
			s.cancel()
		}
	}
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./dataplane/ctl -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (rerun with -update if the change is intended)\n--- got:\n%s\n--- want:\n%s", path, got, want)
	}
}

// checkJSON decodes out into a new value of into's type, refusing unknown
// fields, and checks that encoding it again gives out back: the output
// parses, and every field it prints is a declared one.
func checkJSON[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("output does not decode as %T: %v\n%s", v, err, out)
	}
	again, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if string(again)+"\n" != out {
		t.Errorf("output does not survive a decode/encode round trip:\n%s\n--- again:\n%s", out, again)
	}
	return v
}

// TestCommands runs every command against a fresh fake agent and
// compares stdout (stderr for failures) with testdata/NAME.golden.
func TestCommands(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		code  int
		json  func(t *testing.T, out string) // checks -o json output
		setup func(f *fakeAgent)
		// stdout: a failure may have printed results before failing.
		stdout bool
	}{
		{name: "help", args: []string{"help"}},
		{name: "help-port-add", args: []string{"help", "port", "add"}},
		{name: "help-port", args: []string{"help", "port"}},
		{name: "help-stats", args: []string{"stats", "-h"}},

		{name: "port-list", args: []string{"port", "list"}},
		{name: "port-list-wide", args: []string{"port", "list", "-o", "wide"}},
		{name: "port-list-json", args: []string{"-o", "json", "port", "list"}, json: func(t *testing.T, out string) {
			v := checkJSON[portListJSON](t, out)
			if len(v.Ports) != 2 || v.Ports[0].ID != "vm1-net0" || v.Ports[0].Pod != "prod/virt-launcher-vm1-7xk2p" || *v.Ports[0].SocketUID != 107 || v.Ports[1].SocketUID != nil {
				t.Errorf("ports: %+v", v.Ports)
			}
		}},
		{name: "port-show", args: []string{"port", "show", "vm1-net0"}},
		{name: "port-show-defaults", args: []string{"port", "show", "vm2-net0"}},
		{name: "port-show-json", args: []string{"port", "show", "vm1-net0", "--output", "json"}, json: func(t *testing.T, out string) {
			v := checkJSON[portJSON](t, out)
			if v.SocketMode != "0770" || len(v.Status.Queues) != 4 || v.Status.Queues[3] != (assignmentJSON{Pair: 3, Slot: "c3-s0", CPU: 3}) || !v.PortSecurity {
				t.Errorf("port: %+v", v)
			}
		}},
		{name: "port-add", args: []string{"port", "add", "vm3-net0", "--socket", "/run/vhostmq/sockets/vm3-net0/vhost.sock",
			"--role", "server", "--queues", "2", "--slots", "c3-s1,c8-s1", "--mac", "52:54:00:12:34:03", "--mtu", "9000",
			"--socket-uid", "107", "--socket-gid", "107", "--socket-mode", "0770", "--polling", "busy",
			"--label", "k8s.pod.namespace=prod", "--label", "k8s.pod.name=virt-launcher-vm3-b2c4d"}},
		{name: "port-add-json", args: []string{"port", "add", "vm3-net0", "-o", "json", "--socket", "/run/vhostmq/sockets/vm3-net0/vhost.sock"}, json: func(t *testing.T, out string) {
			v := checkJSON[portJSON](t, out)
			if v.ID != "vm3-net0" || v.QueuePairs != 1 || v.Role != "client" || v.Polling != "adaptive" || v.MTU != 1500 || v.SocketMode != "0750" || !v.PortSecurity {
				t.Errorf("port: %+v", v)
			}
		}},
		{name: "port-add-no-security", args: []string{"port", "add", "vm3-net0", "--socket", "/run/vhostmq/sockets/vm3-net0/vhost.sock",
			"--mac", "52:54:00:12:34:03", "--port-security=false"}},
		{name: "port-add-no-security-json", args: []string{"port", "add", "vm3-net0", "-o", "json", "--socket", "/run/vhostmq/sockets/vm3-net0/vhost.sock",
			"--port-security=false"}, json: func(t *testing.T, out string) {
			if v := checkJSON[portJSON](t, out); v.PortSecurity {
				t.Errorf("port_security true, want false: %+v", v)
			}
		}},
		{name: "port-add-bandwidth", args: []string{"port", "add", "vm3-net0", "--socket", "/run/vhostmq/sockets/vm3-net0/vhost.sock",
			"--ingress-bandwidth", "100M", "--egress-bandwidth", "1.5G", "--egress-burst", "8Mi"}},
		{name: "port-add-bandwidth-json", args: []string{"port", "add", "vm3-net0", "-o", "json", "--socket", "/run/vhostmq/sockets/vm3-net0/vhost.sock",
			"--egress-bandwidth", "1G"}, json: func(t *testing.T, out string) {
			if v := checkJSON[portJSON](t, out); v.Bandwidth == nil || v.Bandwidth.Ingress != nil || *v.Bandwidth.Egress != (rateJSON{BitsPerSecond: 1e9}) {
				t.Errorf("bandwidth %+v, want egress 1e9 bit/s only", v.Bandwidth)
			}
		}},
		{name: "port-bandwidth", args: []string{"port", "bandwidth", "vm1-net0", "--ingress", "200M", "--ingress-burst", "2M"}},
		{name: "port-bandwidth-keep", args: []string{"port", "bandwidth", "vm2-net0", "--egress", "0"}},
		{name: "port-bandwidth-burst", args: []string{"port", "bandwidth", "vm2-net0", "--egress-burst", "1Mi"}},
		{name: "port-bandwidth-clear-json", args: []string{"port", "bandwidth", "vm2-net0", "--clear", "-o", "json"}, json: func(t *testing.T, out string) {
			if v := checkJSON[portJSON](t, out); v.Bandwidth != nil {
				t.Errorf("bandwidth %+v, want null", v.Bandwidth)
			}
		}},
		{name: "help-port-bandwidth", args: []string{"port", "bandwidth", "-h"}},
		{name: "port-add-again", args: []string{"port", "add", "vm2-net0", "--socket", "/run/vhostmq/sockets/vm2-net0/vhost.sock",
			"--role", "server", "--queues", "2", "--mtu", "9000", "--polling", "busy",
			"--label", "k8s.pod.namespace=dev", "--label", "k8s.pod.name=virt-launcher-vm2-q9zt4",
			"--ingress-bandwidth", "100M", "--egress-bandwidth", "50M", "--egress-burst", "4294967295"}},
		{name: "port-del", args: []string{"port", "del", "vm1-net0"}},
		{name: "port-del-missing", args: []string{"port", "del", "nope"}},
		{name: "port-del-json", args: []string{"port", "del", "vm2-net0", "-o", "json"}, json: func(t *testing.T, out string) {
			if v := checkJSON[portDelJSON](t, out); v != (portDelJSON{ID: "vm2-net0", Existed: true}) {
				t.Errorf("got %+v", v)
			}
		}},

		{name: "queues", args: []string{"queues"}},
		{name: "queues-port", args: []string{"queues", "vm2-net0"}},
		{name: "queues-counters", args: []string{"queues", "--interval", "0"}},
		{name: "queues-wide", args: []string{"queues", "-o", "wide"}},
		{name: "queues-counters-wide", args: []string{"queues", "--interval", "0", "-o", "wide"}},
		{name: "queues-json", args: []string{"queues", "-o", "json"}, json: func(t *testing.T, out string) {
			v := checkJSON[queuesJSON](t, out)
			if v.IntervalSeconds != 1 || len(v.Slots) != 6 {
				t.Fatalf("got %+v", v)
			}
			s := v.Slots[2] // CPU 3, c3-s0: vm1-net0 pairs 1 (20% busy) and 3 (40%)
			if s.Slot != "c3-s0" || *s.BusyPercent != 60 || len(s.Queues) != 2 || *s.Queues[1].BusyPercent != 40 || *s.Queues[1].RxPacketsPerSecond != 1e6 {
				t.Errorf("slot c3-s0: %+v", s)
			}
			// Pair 3 was moved to CPU 2's worker; 10 µs a burst over the interval.
			if q := s.Queues[1]; q.WorkerCPU == nil || *q.WorkerCPU != 2 || q.NsPerBurst == nil || *q.NsPerBurst != 10000 || q.Bursts != 1_600_040_000 {
				t.Errorf("pair 3: worker %v, ns/burst %v, bursts %d", q.WorkerCPU, q.NsPerBurst, q.Bursts)
			}
			// Pair 3's guest does not take GSO: its frames are segmented for it.
			if q := s.Queues[1]; q.Offload == nil || *q.Offload != (offloadJSON[uint64]{GSOSegmented: 42_000, CsumSoftware: 12_400}) ||
				q.OffloadPerSecond == nil || *q.OffloadPerSecond != (offloadJSON[float64]{GSOSegmented: 2_000, CsumSoftware: 400}) {
				t.Errorf("pair 3: offload %v, per second %v", q.Offload, q.OffloadPerSecond)
			}
			if len(v.Workers) != 3 || *v.Workers[0].BusyPercent != 80.25 || *v.Workers[1].UplinkBusyPercent != 5 {
				t.Errorf("workers %+v", v.Workers)
			}
			if r := v.Rebalance; r == nil || r.Runs != 12 || len(r.LastMoves) != 1 || r.LastMoves[0].ToCPU != 2 || r.LastRun == nil {
				t.Errorf("rebalance %+v", r)
			}
		}},
		{name: "queues-rebalance", args: []string{"queues", "rebalance", "--window", "2s"}},
		{name: "queues-rebalance-json", args: []string{"queues", "rebalance", "-o", "json"}, json: func(t *testing.T, out string) {
			v := checkJSON[rebalanceRun](t, out)
			if !v.Manual || v.IntervalSeconds != 1 || len(v.Moves) != 1 || v.Moves[0].Pair != 2 || len(v.Workers) != 2 {
				t.Errorf("got %+v", v)
			}
		}},
		{name: "err-rebalance-window", args: []string{"queues", "rebalance", "--window", "2m"}, code: ExitUsage},

		{name: "stats", args: []string{"stats"}},
		{name: "stats-wide", args: []string{"stats", "-o", "wide"}},
		{name: "stats-port", args: []string{"stats", "vm2-net0", "--interval", "2s"}},
		{name: "stats-counters", args: []string{"stats", "--interval", "0"}},
		{name: "top-once", args: []string{"top", "--once", "--interval", "2s"}},
		{name: "help-top", args: []string{"top", "-h"}},
		{name: "stats-json", args: []string{"stats", "-o", "json"}, json: func(t *testing.T, out string) {
			v := checkJSON[statsJSON](t, out)
			if v.IntervalSeconds != 1 || len(v.Ports) != 2 || len(v.Ports[0].Queues) != 4 {
				t.Fatalf("got %+v", v)
			}
			q := v.Ports[0].Queues[3].Rates // vm1-net0 pair 3
			if q == nil || q.RxPacketsPerSecond != 1e6 || q.RxBitsPerSecond != 12e9 || q.TxBitsPerSecond != 3.2e9 || q.BusyPercent != 40 || q.DropsPerSecond.RxNoBuffer != 150 {
				t.Errorf("vm1-net0 pair 3 rates: %+v", q)
			}
			if tot := v.Ports[0].Total.Rates; tot == nil || tot.RxPacketsPerSecond != 2.5e6 || tot.DropsPerSecond.Total != 308 || tot.DropsPerSecond.BadOffload != 3 {
				t.Errorf("vm1-net0 total rates: %+v", tot)
			}
			// Pair 0's guest takes GSO, the others' do not.
			if o := v.Ports[0].Queues[0].Offload; o != (offloadJSON[uint64]{GSOWhole: 42_000, CsumSoftware: 3_100}) {
				t.Errorf("vm1-net0 pair 0 offload: %+v", o)
			}
			if o := v.Ports[0].Total.Rates.OffloadPerSecond; o != (offloadJSON[float64]{GSOWhole: 2_000, GSOSegmented: 4_500, CsumSoftware: 1_000}) {
				t.Errorf("vm1-net0 total offload rates: %+v", o)
			}
		}},
		{name: "stats-counters-json", args: []string{"stats", "vm2-net0", "--interval", "0", "-o", "json"}, json: func(t *testing.T, out string) {
			v := checkJSON[statsJSON](t, out)
			if v.IntervalSeconds != 0 || v.Ports[0].Total.Rates != nil || v.Ports[0].Total.Drops.RxDisabled != 4000 || v.Ports[0].Total.Drops.Spoofed != 12 || v.Ports[0].Total.Rx.Packets != 20_000_000 {
				t.Errorf("got %+v", v.Ports[0].Total)
			}
			if d := v.Ports[0].Total; d.Drops.RateLimited != 30 || d.Shaped != 500 || v.Ports[0].Bandwidth == nil || v.Ports[0].Bandwidth.Ingress.BitsPerSecond != 100e6 {
				t.Errorf("rate limits: drops.rate_limited %d, shaped %d, bandwidth %+v", d.Drops.RateLimited, d.Shaped, v.Ports[0].Bandwidth)
			}
		}},

		{name: "capacity", args: []string{"capacity"}},
		{name: "capacity-json", args: []string{"capacity", "-o", "json"}, json: func(t *testing.T, out string) {
			v := checkJSON[capacityJSON](t, out)
			if v.SlotsTotal != 6 || v.SlotsUsed != 4 || v.CPUs[0].ID != 2 || v.CPUs[0].Slots[0].PortID != "vm1-net0" || len(v.CPUs[0].Slots[0].Pairs) != 2 {
				t.Errorf("got %+v", v)
			}
		}},
		{name: "err-overlay-none", args: []string{"overlay"}, code: ExitFailed},
		{name: "overlay-macs", args: []string{"overlay", "--macs"}, setup: fakeOverlay},
		{name: "overlay-json", args: []string{"overlay", "-o", "json"}, setup: fakeOverlay, json: func(t *testing.T, out string) {
			v := checkJSON[overlayJSON](t, out)
			if v.Local != "10.1.0.2:4789" || v.MTU != 1450 || len(v.VTEPs) != 2 || v.VTEPs[1].TxErrors != 3 || len(v.Entries) != 2 || v.Entries[0].VTEP != "10.2.0.2" {
				t.Errorf("got %+v", v)
			}
		}},
		{name: "handoff-none", args: []string{"handoff"}},
		{name: "handoff", args: []string{"handoff"}, setup: func(f *fakeAgent) {
			f.handoff = &agentv1.Handoff{Happened: true, Build: "rebuilt-2", TimeUnixNano: statsEpoch.UnixNano(), Role: "adopted",
				PeerBuild: "0123456789ab", Ports: 3, PauseUs: 5260, Adopted: 2, CreatedAfresh: 1}
		}},
		{name: "handoff-json", args: []string{"handoff", "-o", "json"}, setup: func(f *fakeAgent) {
			f.handoff = &agentv1.Handoff{Happened: true, Build: "0123456789ab", TimeUnixNano: statsEpoch.UnixNano(), Role: "handed",
				PeerBuild: "rebuilt-2", Ports: 3, PauseUs: 5260}
		}, json: func(t *testing.T, out string) {
			v := checkJSON[handoffJSON](t, out)
			if !v.Happened || v.Role != "handed" || v.Ports != 3 || v.PauseMs != 5.26 || v.Time != "2026-08-20T10:00:00Z" {
				t.Errorf("got %+v", v)
			}
		}},
		{name: "health", args: []string{"health"}},
		{name: "health-json", args: []string{"health", "-o", "json"}, json: func(t *testing.T, out string) {
			v := checkJSON[healthJSON](t, out)
			if !v.Healthy || len(v.Slots) != 6 || v.Slots[5].Healthy || v.Time != "" {
				t.Errorf("got %+v", v)
			}
		}},

		// The request fails: exit 1, the agent's status on stderr.
		{name: "err-add-invalid", args: []string{"port", "add", "bad", "--socket", "/run/x.sock", "--queues", "0"}, code: ExitFailed},
		{name: "err-add-exists", args: []string{"port", "add", "vm1-net0", "--socket", "/run/vhostmq/sockets/vm1-net0/vhost.sock", "--queues", "2"}, code: ExitFailed},
		{name: "err-show-missing", args: []string{"port", "show", "nope"}, code: ExitFailed},
		{name: "err-bandwidth-missing", args: []string{"port", "bandwidth", "nope", "--ingress", "1G"}, code: ExitFailed},
		{name: "err-bandwidth-rejected", args: []string{"port", "bandwidth", "vm1-net0", "--egress-burst", "1M"}, code: ExitFailed},
		{name: "err-stats-missing", args: []string{"stats", "vm1-net0", "nope"}, code: ExitFailed},
		{name: "err-timeout", args: []string{"capacity", "--timeout", "50ms"}, code: ExitFailed, setup: func(f *fakeAgent) { f.block = true }},
		{name: "err-health-ended", args: []string{"health", "--watch"}, code: ExitFailed, setup: func(f *fakeAgent) { f.endHealth = true }, stdout: true},

		// Usage errors: exit 2, a message naming the problem and a usage line.
		{name: "err-no-command", args: nil, code: ExitUsage},
		{name: "err-unknown-command", args: []string{"frobnicate"}, code: ExitUsage},
		{name: "err-port-no-subcommand", args: []string{"port"}, code: ExitUsage},
		{name: "err-port-unknown-subcommand", args: []string{"port", "rm", "x"}, code: ExitUsage},
		{name: "err-add-no-id", args: []string{"port", "add"}, code: ExitUsage},
		{name: "err-add-no-socket", args: []string{"port", "add", "vm3-net0"}, code: ExitUsage},
		{name: "err-add-bad-queues", args: []string{"port", "add", "vm3-net0", "--socket", "/s", "--queues", "abc"}, code: ExitUsage},
		{name: "err-add-bad-polling", args: []string{"port", "add", "vm3-net0", "--socket", "/s", "--polling", "fast"}, code: ExitUsage},
		{name: "err-add-bad-label", args: []string{"port", "add", "vm3-net0", "--socket", "/s", "--label", "novalue"}, code: ExitUsage},
		{name: "err-add-bad-mac", args: []string{"port", "add", "vm3-net0", "--socket", "/s", "--mac", "52:54:00"}, code: ExitUsage},
		{name: "err-add-bad-mode", args: []string{"port", "add", "vm3-net0", "--socket", "/s", "--socket-mode", "rwx"}, code: ExitUsage},
		{name: "err-add-bad-bandwidth", args: []string{"port", "add", "vm3-net0", "--socket", "/s", "--ingress-bandwidth", "fast"}, code: ExitUsage},
		{name: "err-add-bandwidth-range", args: []string{"port", "add", "vm3-net0", "--socket", "/s", "--egress-bandwidth", "100m"}, code: ExitUsage},
		{name: "err-bandwidth-no-flags", args: []string{"port", "bandwidth", "vm1-net0"}, code: ExitUsage},
		{name: "err-bandwidth-clear-and-rate", args: []string{"port", "bandwidth", "vm1-net0", "--clear", "--ingress", "1G"}, code: ExitUsage},
		{name: "err-bad-output", args: []string{"-o", "yaml", "port", "list"}, code: ExitUsage},
		{name: "err-show-extra-arg", args: []string{"port", "show", "vm1-net0", "vm2-net0"}, code: ExitUsage},
		{name: "err-unknown-flag", args: []string{"port", "list", "--all"}, code: ExitUsage},
		{name: "err-bad-interval", args: []string{"stats", "--interval", "soon"}, code: ExitUsage},
		{name: "err-missing-flag-value", args: []string{"queues", "--interval"}, code: ExitUsage},
		{name: "err-help-unknown", args: []string{"help", "frobnicate"}, code: ExitUsage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAgent()
			if tc.setup != nil {
				tc.setup(f)
			}
			sock := f.serve(t)
			res := runCLI(t, nil, sock, nil, tc.args...)
			res.stderr = strings.ReplaceAll(res.stderr, filepath.Dir(sock), "$TMPDIR")
			if res.code != tc.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", res.code, tc.code, res.stderr)
			}
			if tc.code == ExitOK {
				if res.stderr != "" {
					t.Errorf("stderr: %s", res.stderr)
				}
				checkGolden(t, tc.name, res.stdout)
			} else {
				if res.stdout != "" && !tc.stdout {
					t.Errorf("stdout of a failure: %s", res.stdout)
				}
				checkGolden(t, tc.name, res.stderr)
			}
			if tc.json != nil && res.code == ExitOK {
				tc.json(t, res.stdout)
			}
		})
	}
}

// Global flags go before or after the command; the API socket comes from
// --socket, --api-socket or $VHOSTMQ_API_SOCKET.
func TestGlobalFlagPlacement(t *testing.T) {
	sock := newFakeAgent().serve(t)
	want := runCLI(t, nil, sock, nil, "-o", "json", "port", "list")
	if want.code != ExitOK {
		t.Fatalf("exit %d: %s", want.code, want.stderr)
	}
	for _, args := range [][]string{
		{"port", "list", "-o", "json"},
		{"port", "list", "--output=json"},
		{"--socket", sock, "-o", "json", "port", "list"},
		{"port", "list", "--socket", sock, "-o=json"},
		{"--api-socket=" + sock, "port", "list", "-o", "json"},
	} {
		env := sock
		if strings.Contains(strings.Join(args, " "), sock) {
			env = "/nonexistent/api.sock" // the flag must win
		}
		got := runCLI(t, nil, env, nil, args...)
		if got.code != ExitOK || got.stdout != want.stdout {
			t.Errorf("%q: exit %d, stderr %q, stdout differs: %v", args, got.code, got.stderr, got.stdout != want.stdout)
		}
	}
	// In port add, --socket is the vhost-user socket: the API socket is
	// --api-socket or --socket before the command.
	f := newFakeAgent()
	sock2 := f.serve(t)
	for i, args := range [][]string{
		{"port", "add", "a", "--socket", "/run/a.sock", "--api-socket", sock2},
		{"--socket", sock2, "port", "add", "b", "--socket", "/run/b.sock"},
	} {
		res := runCLI(t, nil, "/nonexistent/api.sock", nil, args...)
		if res.code != ExitOK {
			t.Errorf("%q: exit %d: %s", args, res.code, res.stderr)
		}
		id := string(rune('a' + i))
		f.mu.Lock()
		p := f.ports[id]
		f.mu.Unlock()
		// Flags not given stay unset: the agent applies its defaults.
		if p == nil || p.Spec.SocketPath != "/run/"+id+".sock" || p.Spec.Role != 0 || p.Spec.Polling != 0 ||
			p.Spec.QueuePairs != 1 || p.Spec.SocketUid != nil || p.Spec.SocketGid != nil || p.Spec.Mtu != 0 || len(p.Spec.Labels) != 0 {
			t.Errorf("%q: port %s: %v", args, id, p)
		}
	}
}

// The --interval reaches the sleep, and -h prints help to stdout.
func TestIntervalAndHelp(t *testing.T) {
	sock := newFakeAgent().serve(t)
	res := runCLI(t, nil, sock, nil, "stats", "--interval", "250ms")
	if res.code != ExitOK || len(res.sleeps) != 1 || res.sleeps[0] != 250*time.Millisecond {
		t.Errorf("exit %d, sleeps %v", res.code, res.sleeps)
	}
	res = runCLI(t, nil, sock, nil, "queues", "--interval", "3")
	if res.code != ExitOK || len(res.sleeps) != 1 || res.sleeps[0] != 3*time.Second {
		t.Errorf("exit %d, sleeps %v", res.code, res.sleeps)
	}
	help := runCLI(t, nil, sock, nil, "help")
	if res := runCLI(t, nil, sock, nil, "port", "--help"); res.code != ExitOK || !strings.Contains(res.stdout, "Available Commands:\n  add ") {
		t.Errorf("port --help: exit %d:\n%s", res.code, res.stdout)
	}
	for _, args := range [][]string{{"-h"}, {"--help"}} {
		if res := runCLI(t, nil, sock, nil, args...); res.code != ExitOK || res.stdout != help.stdout || res.stderr != "" {
			t.Errorf("%q: exit %d, stdout differs from help: %v", args, res.code, res.stdout != help.stdout)
		}
	}
	for _, cmd := range commands {
		word, _, _ := strings.Cut(cmd.name, " ")
		if !strings.Contains(help.stdout, "\n  "+word+" ") {
			t.Errorf("help does not list %q", word)
		}
		a := runCLI(t, nil, sock, nil, append(strings.Fields(cmd.name), "-h")...)
		b := runCLI(t, nil, sock, nil, append([]string{"help"}, strings.Fields(cmd.name)...)...)
		use := strings.TrimSpace("vhostmqctl " + cmd.name + " " + cmd.args)
		if a.code != ExitOK || b.code != ExitOK || a.stdout != b.stdout || !strings.Contains(a.stdout, "Usage:\n  "+use) ||
			!strings.Contains(a.stdout, cmd.summary[1:]) {
			t.Errorf("%s -h / help %s: exit %d/%d:\n%s\n%s", cmd.name, cmd.name, a.code, b.code, a.stdout, b.stdout)
		}
	}
}

// health --watch prints one line per update until interrupted, then
// exits 0.
func TestHealthWatch(t *testing.T) {
	for _, tc := range []struct{ name, output string }{{"health-watch", "table"}, {"health-watch-json", "json"}} {
		t.Run(tc.name, func(t *testing.T) {
			sock := newFakeAgent().serve(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			out := &syncBuffer{cancelAfter: 2, cancel: cancel}
			res := runCLI(t, ctx, sock, out, "health", "--watch", "-o", tc.output)
			if res.code != ExitOK || res.stderr != "" {
				t.Errorf("exit %d, stderr %q", res.code, res.stderr)
			}
			checkGolden(t, tc.name, res.stdout)
			if tc.output == "json" {
				lines := strings.Split(strings.TrimSuffix(res.stdout, "\n"), "\n")
				if len(lines) != 2 {
					t.Fatalf("%d lines, want 2", len(lines))
				}
				for _, l := range lines {
					var h healthJSON
					dec := json.NewDecoder(strings.NewReader(l))
					dec.DisallowUnknownFields()
					if err := dec.Decode(&h); err != nil || h.Time == "" || len(h.Slots) != 6 {
						t.Errorf("line %q: %v %+v", l, err, h)
					}
				}
			}
		})
	}
}

// No agent at the socket: exit 3, naming the socket and --socket.
func TestUnreachable(t *testing.T) {
	dir, err := os.MkdirTemp("", "ctl")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// A stale socket: the file exists, nothing listens.
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	for _, tc := range []struct {
		name string
		sock string
		args []string
	}{
		{"err-unreachable-missing", filepath.Join(dir, "missing.sock"), []string{"port", "list"}},
		{"err-unreachable-refused", stale, []string{"stats"}},
		{"err-unreachable-health", filepath.Join(dir, "missing.sock"), []string{"health", "--watch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runCLI(t, nil, tc.sock, nil, tc.args...)
			if res.code != ExitUnreachable || res.stdout != "" {
				t.Errorf("exit %d, want %d; stdout %q", res.code, ExitUnreachable, res.stdout)
			}
			if !strings.Contains(res.stderr, tc.sock) || !strings.Contains(res.stderr, "--socket") {
				t.Errorf("stderr does not name the socket and --socket:\n%s", res.stderr)
			}
			checkGolden(t, tc.name, strings.ReplaceAll(res.stderr, dir, "$TMPDIR"))
		})
	}
}

func TestHumanRate(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		unit string
		want string
	}{
		{0, "pps", "0 pps"},
		{999.4, "pps", "999 pps"},
		{999.6, "pps", "1.0 kpps"},
		{1_234, "pps", "1.2 kpps"},
		{999_960, "pps", "1.0 Mpps"},
		{1_200_000, "pps", "1.2 Mpps"},
		{3.4e9, "bit/s", "3.4 Gbit/s"},
		{12e9, "bit/s", "12.0 Gbit/s"},
		{250e12, "bit/s", "250 Tbit/s"},
		{99.94e6, "pps", "99.9 Mpps"},
		{99.96e6, "pps", "100 Mpps"},
		{999.6e6, "pps", "1.0 Gpps"},
	} {
		if got := humanRate(tc.v, tc.unit); got != tc.want {
			t.Errorf("humanRate(%v, %q) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
	if got := perSecond(1500); got != "1.5k" {
		t.Errorf("perSecond(1500) = %q", got)
	}
}

// queues rebalance hands --window to the agent (default 1s).
func TestQueuesRebalanceWindow(t *testing.T) {
	f := newFakeAgent()
	sock := f.serve(t)
	for _, args := range [][]string{{"queues", "rebalance", "--window", "2500ms"}, {"queues", "rebalance"}} {
		if res := runCLI(t, nil, sock, nil, args...); res.code != ExitOK {
			t.Fatalf("%q: exit %d: %s", args, res.code, res.stderr)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.rebalanceWindows) != 2 || f.rebalanceWindows[0] != 2500 || f.rebalanceWindows[1] != 1000 {
		t.Errorf("windows %v, want [2500 1000] ms", f.rebalanceWindows)
	}
}

// Shell completion (cobra's __complete, which the bash, zsh and fish
// scripts call): port IDs come from the agent, flag values from their
// enums, and an agent that is not there completes nothing, quickly.
func TestCompletion(t *testing.T) {
	sock := newFakeAgent().serve(t)
	for _, tc := range []struct {
		args []string
		want string // the completions, one a line, then cobra's ":directive"
	}{
		{[]string{"port", "show", ""}, "vm1-net0\tprod/virt-launcher-vm1-7xk2p\nvm2-net0\tdev/virt-launcher-vm2-q9zt4\n:4"},
		{[]string{"port", "del", "vm2"}, "vm2-net0\tdev/virt-launcher-vm2-q9zt4\n:4"},
		{[]string{"port", "show", "vm1-net0", ""}, ":4"},
		{[]string{"stats", "vm1-net0", ""}, "vm2-net0\tdev/virt-launcher-vm2-q9zt4\n:4"},
		{[]string{"queues", "re"}, "rebalance\tmeasure the queue loads now and move pairs between workers if that evens them out\n:4"},
		{[]string{"port", "list", "-o", ""}, "table\nwide\njson\n:4"},
		{[]string{"port", "add", "x", "--polling", "a"}, "interrupt\nadaptive\nbusy\n:4"}, // the shell filters fixed lists
		{[]string{"help", "port", "s"}, "show\tshow a port: spec, status, labels, queue pair to slot and CPU\n:4"},
		{[]string{"--socket", filepath.Join(t.TempDir(), "none.sock"), "port", "show", ""}, ":5"},
	} {
		res := runCLI(t, nil, sock, nil, append([]string{"__complete"}, tc.args...)...)
		got := strings.TrimSuffix(res.stdout, "\n")
		if i := strings.LastIndex(got, "\nCompletion ended with directive"); i >= 0 {
			got = got[:i]
		}
		if res.code != ExitOK || got != tc.want {
			t.Errorf("__complete %q: exit %d\n--- got:\n%s\n--- want:\n%s\n--- stderr:\n%s", tc.args, res.code, got, tc.want, res.stderr)
		}
	}
	for shell, want := range map[string]string{"bash": "__start_vhostmqctl", "zsh": "#compdef vhostmqctl", "fish": "complete -c vhostmqctl"} {
		res := runCLI(t, nil, sock, nil, "completion", shell)
		if res.code != ExitOK || !strings.Contains(res.stdout, want) {
			t.Errorf("completion %s: exit %d, no %q in:\n%.300s", shell, res.code, want, res.stdout)
		}
	}
}

// --socket before port add names the API socket, after it the port's.
func TestSocketBeforePortAdd(t *testing.T) {
	f := newFakeAgent()
	sock := f.serve(t)
	res := runCLI(t, nil, filepath.Join(t.TempDir(), "not-the-agent.sock"), nil,
		"--socket", sock, "port", "add", "vm9-net0", "--socket", "/run/vm9.sock")
	if res.code != ExitOK {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	f.mu.Lock()
	p := f.ports["vm9-net0"]
	f.mu.Unlock()
	if p == nil || p.Spec.SocketPath != "/run/vm9.sock" {
		t.Errorf("port vm9-net0: %v", p)
	}
}

// port bandwidth sends the port's limits with the flags' changes: a
// direction not given is kept, a new rate drops the old burst, --clear
// sends none.
func TestPortBandwidthRequest(t *testing.T) {
	f := newFakeAgent()
	sock := f.serve(t)
	for _, args := range [][]string{
		{"port", "bandwidth", "vm2-net0", "--ingress", "1G"},
		{"port", "bandwidth", "vm2-net0", "--egress", "0", "--ingress-burst", "64Ki"},
		{"port", "bandwidth", "vm2-net0", "--clear"},
	} {
		if res := runCLI(t, nil, sock, nil, args...); res.code != ExitOK {
			t.Fatalf("%q: exit %d: %s", args, res.code, res.stderr)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := []*agentv1.Bandwidth{
		{Ingress: &agentv1.Rate{BitsPerSecond: 1e9}, Egress: &agentv1.Rate{BitsPerSecond: 50e6, BurstBits: 1<<32 - 1}},
		{Ingress: &agentv1.Rate{BitsPerSecond: 1e9, BurstBits: 64 << 10}},
		nil,
	}
	if len(f.bandwidthSets) != len(want) {
		t.Fatalf("%d requests, want %d", len(f.bandwidthSets), len(want))
	}
	for i, r := range f.bandwidthSets {
		if r.GetId() != "vm2-net0" || !proto.Equal(r.GetBandwidth(), want[i]) {
			t.Errorf("request %d: %v, want bandwidth %v", i, r, want[i])
		}
	}
}

func fakeOverlay(f *fakeAgent) {
	f.overlay = &agentv1.Overlay{Local: "10.1.0.2:4789", Mtu: 1450, RxUnknownVtep: 1,
		Vteps: []*agentv1.VTEP{{Address: "10.2.0.2", RxPackets: 10, RxBytes: 1000, TxPackets: 12, TxBytes: 1200, Macs: 1},
			{Address: "10.3.0.2", RxPackets: 3, RxBytes: 300, TxPackets: 9, TxBytes: 900, TxErrors: 3, Macs: 1}},
		Entries: []*agentv1.OverlayEntry{{Network: "ov", Vni: 100, Mac: "52:54:00:20:00:03", Vtep: "10.2.0.2", AgeSeconds: 2},
			{Network: "ov", Vni: 100, Mac: "fe:5b:20:22:b5:3f", Vtep: "10.3.0.2", AgeSeconds: 40}}}
}
