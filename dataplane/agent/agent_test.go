package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
)

// env is one agent with its dataplane, served on a real unix socket.
type env struct {
	t      *testing.T
	root   string // socket root
	state  string
	api    string
	dp     *dataplane.Dataplane
	ag     *Agent
	client agentv1.AgentClient
	cancel context.CancelFunc
	done   chan error
}

func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// start runs an agent on dir (root/, state/, api.sock beneath it).
func start(t *testing.T, dir string, cpus []int, slotsPerCPU int) *env {
	t.Helper()
	dp, err := dataplane.New(dataplane.Config{CPUs: cpus, Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	return startOn(t, dir, dp, slotsPerCPU)
}

// startOn runs an agent on dir over dp (which it closes).
func startOn(t *testing.T, dir string, dp *dataplane.Dataplane, slotsPerCPU int) *env {
	t.Helper()
	e := &env{t: t, root: filepath.Join(dir, "s"), state: filepath.Join(dir, "state"), api: filepath.Join(dir, "api.sock"), done: make(chan error, 1)}
	os.MkdirAll(e.root, 0o755)
	var err error
	e.dp = dp
	e.ag, err = New(Config{SlotsPerCPU: slotsPerCPU, SocketRoot: e.root, StateDir: e.state, APISocket: e.api, Logger: logger()}, dp)
	if err != nil {
		dp.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.done <- e.ag.Serve(ctx) }()
	// Dial only once the socket exists: a refused first dial would put the
	// gRPC client into its 1 s reconnect backoff and blur what we time.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(e.api); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("API socket did not appear")
		}
	}
	conn, err := grpc.NewClient("unix://"+e.api, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.client = agentv1.NewAgentClient(conn)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := e.client.ListPorts(context.Background(), &agentv1.ListPortsRequest{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("API did not come up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Cleanup(func() { conn.Close(); e.stop() })
	return e
}

func (e *env) stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	<-e.done
	e.dp.Close()
	e.cancel = nil
}

func (e *env) spec(id string, pairs uint32) *agentv1.PortSpec {
	return &agentv1.PortSpec{Id: id, SocketPath: filepath.Join(e.root, id, "vhu.sock"), Role: agentv1.Role_ROLE_SERVER, QueuePairs: pairs,
		Labels: map[string]string{"k8s.pod.namespace": "ns1", "k8s.pod.name": "pod-" + id}}
}

func (e *env) create(s *agentv1.PortSpec) (*agentv1.Port, error) {
	return e.client.CreatePort(context.Background(), &agentv1.CreatePortRequest{Spec: s})
}

func code(err error) codes.Code { return status.Code(err) }

func TestCreateIdempotentAndConflicts(t *testing.T) {
	e := start(t, shortDir(t), nil, 4)
	s := e.spec("p1", 2)
	p1, err := e.create(s)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := e.create(s)
	if err != nil {
		t.Fatalf("same request again: %v", err)
	}
	if !proto.Equal(p1.Spec, p2.Spec) || len(p2.Status.Queues) != 2 || p1.Status.Queues[0].Slot != p2.Status.Queues[0].Slot {
		t.Errorf("second create returned a different port: %v vs %v", p1, p2)
	}
	// Defaults are applied: an explicit default means the same port.
	s2 := proto.Clone(s).(*agentv1.PortSpec)
	s2.Mtu, s2.Polling = 1500, agentv1.PollingMode_POLLING_ADAPTIVE
	if _, err := e.create(s2); err != nil {
		t.Errorf("same port with explicit defaults: %v", err)
	}
	for field, mutate := range map[string]func(*agentv1.PortSpec){
		"queue_pairs": func(s *agentv1.PortSpec) { s.QueuePairs = 3 },
		"mtu":         func(s *agentv1.PortSpec) { s.Mtu = 9000 },
		"role":        func(s *agentv1.PortSpec) { s.Role = agentv1.Role_ROLE_CLIENT },
		"labels":      func(s *agentv1.PortSpec) { s.Labels = nil },
		"socket_path": func(s *agentv1.PortSpec) { s.SocketPath = filepath.Join(e.root, "other", "x.sock") },
	} {
		c := proto.Clone(s).(*agentv1.PortSpec)
		mutate(c)
		_, err := e.create(c)
		if code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "spec."+field) {
			t.Errorf("conflicting %s: %v, want AlreadyExists naming spec.%s", field, err, field)
		}
	}
	// Another ID on the same socket path.
	c := proto.Clone(s).(*agentv1.PortSpec)
	c.Id = "p2"
	if _, err := e.create(c); code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "spec.socket_path") {
		t.Errorf("second port on the same socket: %v", err)
	}
	// Delete is idempotent.
	for i, want := range []bool{true, false} {
		r, err := e.client.DeletePort(context.Background(), &agentv1.DeletePortRequest{Id: "p1"})
		if err != nil || r.Existed != want {
			t.Errorf("delete #%d: %v %v, want existed=%v", i+1, r, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(e.root, "p1")); !os.IsNotExist(err) {
		t.Errorf("socket directory left behind: %v", err)
	}
	if _, err := e.client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: "p1"}); code(err) != codes.NotFound {
		t.Errorf("get deleted port: %v", err)
	}
}

func TestValidationMatrix(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	long := "/" + strings.Repeat("x", 120)
	for _, tc := range []struct {
		field  string
		mutate func(*agentv1.PortSpec)
	}{
		{"id", func(s *agentv1.PortSpec) { s.Id = "" }},
		{"id", func(s *agentv1.PortSpec) { s.Id = "bad/id" }},
		{"socket_path", func(s *agentv1.PortSpec) { s.SocketPath = "" }},
		{"socket_path", func(s *agentv1.PortSpec) { s.SocketPath = "relative.sock" }},
		{"socket_path", func(s *agentv1.PortSpec) { s.SocketPath = long }},
		{"socket_path", func(s *agentv1.PortSpec) { s.SocketPath = "/tmp/outside-root.sock" }},
		{"socket_path", func(s *agentv1.PortSpec) { s.SocketPath = e.root + "/a/../b.sock" }},
		{"role", func(s *agentv1.PortSpec) { s.Role = 7 }},
		{"queue_pairs", func(s *agentv1.PortSpec) { s.QueuePairs = 0 }},
		{"queue_pairs", func(s *agentv1.PortSpec) { s.QueuePairs = 129 }},
		{"slots[0]", func(s *agentv1.PortSpec) { s.Slots = []string{"c99-s0"} }},
		{"slots[1]", func(s *agentv1.PortSpec) { s.Slots = []string{"c0-s0", "c0-s0"} }},
		{"mac", func(s *agentv1.PortSpec) { s.Mac = "52:54:00" }},
		{"mac", func(s *agentv1.PortSpec) { s.Mac = "01:00:5e:00:00:01" }},
		{"mtu", func(s *agentv1.PortSpec) { s.Mtu = 67 }},
		{"mtu", func(s *agentv1.PortSpec) { s.Mtu = 9703 }},
		{"socket_mode", func(s *agentv1.PortSpec) { s.SocketMode = 0o777 }},
		{"polling", func(s *agentv1.PortSpec) { s.Polling = 9 }},
		{"labels", func(s *agentv1.PortSpec) { s.Labels = map[string]string{"": "x"} }},
	} {
		s := e.spec("v", 2)
		tc.mutate(s)
		_, err := e.create(s)
		if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "spec."+tc.field+":") {
			t.Errorf("bad %s: %v, want InvalidArgument naming spec.%s", tc.field, err, tc.field)
		}
	}
	if _, err := e.create(nil); code(err) != codes.InvalidArgument {
		t.Errorf("missing spec: %v", err)
	}
	// Nothing was created: no port, no slot taken, no directory.
	l, _ := e.client.ListPorts(context.Background(), &agentv1.ListPortsRequest{})
	c, _ := e.client.GetCapacity(context.Background(), &agentv1.GetCapacityRequest{})
	ents, _ := os.ReadDir(e.root)
	if len(l.Ports) != 0 || c.SlotsUsed != 0 || len(ents) != 0 {
		t.Errorf("after refused requests: %d ports, %d slots used, %d entries in the socket root", len(l.Ports), c.SlotsUsed, len(ents))
	}
}

func TestSlotsAndCapacity(t *testing.T) {
	e := start(t, shortDir(t), []int{0, 1}, 2)
	c, err := e.client.GetCapacity(context.Background(), &agentv1.GetCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if c.SlotsTotal != 4 || len(c.Cpus) != 2 || c.Cpus[1].Slots[1].Id != "c1-s1" {
		t.Fatalf("capacity %v", c)
	}
	// Automatic placement spreads pairs over distinct CPUs.
	p, err := e.create(e.spec("a", 2))
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Queues[0].Cpu == p.Status.Queues[1].Cpu {
		t.Errorf("two pairs on one CPU while another was free: %v", p.Status.Queues)
	}
	// Explicit slots, and a slot already in use.
	used := p.Status.Queues[0].Slot
	s := e.spec("b", 1)
	s.Slots = []string{used}
	if _, err := e.create(s); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "in use by port \"a\"") {
		t.Errorf("taking a used slot: %v", err)
	}
	free := ""
	c, _ = e.client.GetCapacity(context.Background(), &agentv1.GetCapacityRequest{})
	for _, cpu := range c.Cpus {
		for _, sl := range cpu.Slots {
			if sl.PortId == "" && free == "" {
				free = sl.Id
			}
		}
	}
	s.Slots = []string{free}
	s.QueuePairs = 3 // more pairs than slots: they share it
	pb, err := e.create(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range pb.Status.Queues {
		if q.Slot != free {
			t.Errorf("pair %d on %s, want %s", q.Pair, q.Slot, free)
		}
	}
	c, _ = e.client.GetCapacity(context.Background(), &agentv1.GetCapacityRequest{})
	if c.SlotsUsed != 3 {
		t.Errorf("slots used %d, want 3", c.SlotsUsed)
	}
	if _, err := e.create(e.spec("c", 2)); err != nil {
		t.Fatalf("last free slot: %v", err)
	}
	if _, err := e.create(e.spec("d", 1)); code(err) != codes.ResourceExhausted {
		t.Errorf("no free slot: %v, want ResourceExhausted", err)
	}
}

// TestRestartRestoresPorts: ports created through the API come back in the
// next process (here: the next agent on the same state directory) before
// the API answers, and carry traffic for a frontend that reconnects.
func TestRestartRestoresPorts(t *testing.T) {
	dir := shortDir(t)
	e := start(t, dir, nil, 4)
	a, b := e.spec("a", 2), e.spec("b", 2)
	a.Role, b.Role = agentv1.Role_ROLE_CLIENT, agentv1.Role_ROLE_CLIENT
	// QEMU's listening sockets, in the port directories.
	os.MkdirAll(filepath.Dir(a.SocketPath), 0o750)
	os.MkdirAll(filepath.Dir(b.SocketPath), 0o750)
	lnA, err := frontend.Listen(a.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lnA.Close()
	lnB, err := frontend.Listen(b.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lnB.Close()
	for _, s := range []*agentv1.PortSpec{a, b} {
		if _, err := e.create(s); err != nil {
			t.Fatal(err)
		}
	}
	fa, err := lnA.Accept(frontend.Config{QueuePairs: 2}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := lnB.Accept(frontend.Config{QueuePairs: 2}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	exchange(t, fa, fb)
	stored, err := os.ReadFile(filepath.Join(e.state, stateName))
	if err != nil || !bytes.Contains(stored, []byte(`"schemaVersion": 2`)) || !bytes.Contains(stored, []byte(`"id": "a"`)) {
		t.Fatalf("state file: %v\n%s", err, stored)
	}

	// The process dies; the next one finds its ports in the state dir.
	e.stop()
	t0 := time.Now()
	e2 := start(t, dir, nil, 4)
	l, _ := e2.client.ListPorts(context.Background(), &agentv1.ListPortsRequest{})
	if len(l.Ports) != 2 {
		t.Fatalf("restored %d ports, want 2", len(l.Ports))
	}
	for _, x := range []struct {
		ln *frontend.Listener
		f  *frontend.Frontend
	}{{lnA, fa}, {lnB, fb}} {
		c, err := x.ln.AcceptConn(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.f.Reattach(c); err != nil {
			t.Fatal(err)
		}
	}
	exchange(t, fa, fb)
	gap := time.Since(t0)
	t.Logf("restart gap (new agent start to first forwarded frame): %v", gap.Round(time.Millisecond))
}

var (
	macA = [6]byte{0x52, 0x54, 0, 0, 0, 0x0a}
	macB = [6]byte{0x52, 0x54, 0, 0, 0, 0x0b}
)

func frame(dst, src [6]byte) []byte {
	// local experimental ethertype: port security checks its source MAC
	// only (an ARP-typed one would need a real ARP body)
	b := append(append(append([]byte{}, dst[:]...), src[:]...), 0x88, 0xb5)
	return binary.BigEndian.AppendUint64(append(b, make([]byte, 40)...), uint64(time.Now().UnixNano()))
}

// exchange sends a broadcast each way and waits for it on the other side.
func exchange(t *testing.T, a, b *frontend.Frontend) {
	t.Helper()
	bc := [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	for _, d := range []struct {
		from, to *frontend.Frontend
		src      [6]byte
	}{{a, b, macA}, {b, a, macB}} {
		f := frame(bc, d.src)
		if err := d.from.Send(0, f); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(3 * time.Second)
		for {
			got, err := d.to.Recv(0, 10*time.Millisecond)
			if err == nil && bytes.Equal(got, f) {
				break
			}
			if err != nil && !errors.Is(err, frontend.ErrTimeout) {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatal("frame did not cross the dataplane")
			}
		}
	}
}

func TestCorruptStateKeptAside(t *testing.T) {
	dir := shortDir(t)
	state := filepath.Join(dir, "state")
	os.MkdirAll(state, 0o700)
	os.WriteFile(filepath.Join(state, stateName), []byte("{not json"), 0o600)
	e := start(t, dir, nil, 1)
	aside, _ := filepath.Glob(filepath.Join(state, stateName+".corrupt-*"))
	if len(aside) != 1 {
		t.Fatalf("corrupt state file not kept aside: %v", aside)
	}
	if b, _ := os.ReadFile(aside[0]); string(b) != "{not json" {
		t.Errorf("kept copy differs: %q", b)
	}
	h := e.ag.Health()
	if !strings.Contains(h.Reason, "corrupt") {
		t.Errorf("health does not report the corrupt state file: %q", h.Reason)
	}
	// A newer schema is refused the same way, not misread.
	e.stop()
	os.WriteFile(filepath.Join(state, stateName), []byte(`{"schemaVersion": 3, "ports": []}`), 0o600)
	start(t, dir, nil, 1)
	if aside, _ := filepath.Glob(filepath.Join(state, stateName+".corrupt-*")); len(aside) < 1 {
		t.Errorf("schema 3 file not kept aside")
	}
}

func TestAPISocketIsRootOnly(t *testing.T) {
	e := start(t, shortDir(t), nil, 1)
	fi, err := os.Stat(e.api)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("API socket mode %#o, want 0600", fi.Mode().Perm())
	}
}

func TestSocketDirOwnerAndMode(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	s := e.spec("o", 1)
	uid, gid := uint32(107), uint32(107)
	s.SocketUid, s.SocketGid, s.SocketMode = &uid, &gid, 0o770
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{filepath.Dir(s.SocketPath), 0o770}, {s.SocketPath, 0o660}} {
		fi, err := os.Stat(p.path)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != p.mode || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: mode %#o owner %d:%d, want %#o 107:107", p.path, fi.Mode().Perm(), st.Uid, st.Gid, p.mode)
		}
	}
}

// An existing directory (a device plugin allocation, QEMU's own) keeps
// its owner and mode, and survives the port.
func TestExistingSocketDirUntouched(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	s := e.spec("x", 1)
	dir := filepath.Dir(s.SocketPath)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	os.Chown(dir, 108, 109)
	uid, gid := uint32(107), uint32(107)
	s.SocketUid, s.SocketGid, s.SocketMode = &uid, &gid, 0o770
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != 0o755 || st.Uid != 108 || st.Gid != 109 {
			t.Errorf("%s: %s is %#o %d:%d, want 0755 108:109", when, dir, fi.Mode().Perm(), st.Uid, st.Gid)
		}
	}
	check("after create")
	if _, err := e.client.DeletePort(context.Background(), &agentv1.DeletePortRequest{Id: "x"}); err != nil {
		t.Fatal(err)
	}
	check("after delete")
}

func TestWatchHealthAndMetrics(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	if _, err := e.create(e.spec("m", 2)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := e.client.WatchHealth(ctx, &agentv1.WatchHealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if !h.Healthy || len(h.Slots) != 2 || !h.Slots[0].Healthy {
		t.Errorf("initial health %v", h)
	}

	addr := serveMetrics(ctx, t, e)
	fams := scrape(t, addr)
	pk := fams["vhostmq_queue_packets_total"]
	if pk == nil || len(pk.Metric) != 4 { // 2 pairs x rx/tx
		t.Fatalf("vhostmq_queue_packets_total: %v", pk)
	}
	labels := map[string]string{}
	for _, l := range pk.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["port"] != "m" || labels["namespace"] != "ns1" || labels["pod"] != "pod-m" || labels["slot"] == "" {
		t.Errorf("labels %v", labels)
	}
	for _, name := range []string{"vhostmq_queue_drops_total", "vhostmq_queue_stalls_total", "vhostmq_queue_held_total", "vhostmq_queue_hold_expired_total", "vhostmq_port_connected", "vhostmq_worker_busy_seconds_total", "vhostmq_worker_healthy", "vhostmq_slots"} {
		if fams[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil || resp.StatusCode != 200 {
			t.Errorf("%s: %v %v", path, resp, err)
		} else {
			resp.Body.Close()
		}
	}
}

// TestForeignSocketDirKept: a port whose socket directory already existed
// (the device plugin's per-pod allocation) leaves it in place when deleted.
func TestForeignSocketDirKept(t *testing.T) {
	e := start(t, shortDir(t), nil, 2)
	s := e.spec("f", 1)
	os.MkdirAll(filepath.Dir(s.SocketPath), 0o770)
	if _, err := e.create(s); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.DeletePort(context.Background(), &agentv1.DeletePortRequest{Id: "f"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(s.SocketPath)); err != nil {
		t.Errorf("the pre-existing socket directory was removed: %v", err)
	}
	if _, err := os.Stat(s.SocketPath); !os.IsNotExist(err) {
		t.Errorf("the server-role socket was left: %v", err)
	}
}

func TestSavedPorts(t *testing.T) {
	dir := t.TempDir()
	if n, err := SavedPorts(dir); n != 0 || err != nil {
		t.Fatalf("no file: %d, %v; want 0, nil", n, err)
	}
	st, err := openState(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	specs := []*agentv1.PortSpec{{Id: "a"}, {Id: "b"}}
	if err := st.save(specs, nil); err != nil {
		t.Fatal(err)
	}
	if n, err := SavedPorts(dir); n != 2 || err != nil {
		t.Fatalf("two ports saved: %d, %v", n, err)
	}
	// another schema version still counts: an uninstall keeps what VMs use
	os.WriteFile(filepath.Join(dir, StateFileName), []byte(`{"schemaVersion":99,"ports":[{"id":"x"}]}`), 0o600)
	if n, err := SavedPorts(dir); n != 1 || err != nil {
		t.Fatalf("schema 99 with one port: %d, %v", n, err)
	}
	os.WriteFile(filepath.Join(dir, StateFileName), []byte(`{"ports":`), 0o600)
	if _, err := SavedPorts(dir); err == nil {
		t.Fatal("a truncated file must be an error, not 0 ports")
	}
}

// scrape reads the metrics served at addr (waiting up to 3 s for the
// server to listen) and parses them.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	var body []byte
	deadline := time.Now().Add(3 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	return fams
}

// serveMetrics serves e's metrics on a free loopback port until ctx ends
// and returns its address.
func serveMetrics(ctx context.Context, t *testing.T, e *env) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	go e.ag.ServeMetrics(ctx, addr)
	return addr
}
