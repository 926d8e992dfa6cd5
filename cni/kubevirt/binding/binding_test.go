package binding

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"libvirt.org/go/libvirtxml"

	"github.com/vhostmq/vhostmq/cni/kubevirt/hookapi/info"
	"github.com/vhostmq/vhostmq/cni/kubevirt/hookapi/v1alpha3"
)

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sidecar serves the hook API on a real socket and returns clients.
type sidecar struct {
	info    info.InfoClient
	cb      v1alpha3.CallbacksClient
	done    chan error
	netInfo string
}

func startSidecar(t *testing.T) *sidecar {
	t.Helper()
	return startSidecarWaiting(t, 300*time.Millisecond)
}

// startSidecarWaiting starts the sidecar with Config.DeviceInfoWait wait.
func startSidecarWaiting(t *testing.T, wait time.Duration) *sidecar {
	t.Helper()
	dir, err := os.MkdirTemp("", "hooks")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ni := filepath.Join(dir, "network-info")
	if err := os.WriteFile(ni, read(t, "network-info.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "vhostmq-binding.sock")
	srv := NewServer(Config{NetworkInfo: ni, Socket: sock, DeviceInfoWait: wait, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ctx, cancel := context.WithCancel(context.Background())
	s := &sidecar{done: make(chan error, 1), netInfo: ni}
	go func() { s.done <- srv.Serve(ctx) }()
	t.Cleanup(cancel)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("hook socket did not appear")
		}
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s.info, s.cb = info.NewInfoClient(conn), v1alpha3.NewCallbacksClient(conn)
	return s
}

func (s *sidecar) define(t *testing.T, domain, vmiJSON []byte) ([]byte, error) {
	t.Helper()
	r, err := s.cb.OnDefineDomain(context.Background(), &v1alpha3.OnDefineDomainParams{DomainXML: domain, Vmi: vmiJSON})
	if err != nil {
		return nil, err
	}
	return r.GetDomainXML(), nil
}

func parse(t *testing.T, x []byte) *libvirtxml.Domain {
	t.Helper()
	d := &libvirtxml.Domain{}
	if err := d.Unmarshal(string(x)); err != nil {
		t.Fatalf("%v\n%s", err, x)
	}
	return d
}

func TestInfo(t *testing.T) {
	s := startSidecar(t)
	r, err := s.info.Info(context.Background(), &info.InfoParams{})
	if err != nil {
		t.Fatal(err)
	}
	var points []string
	for _, p := range r.HookPoints {
		points = append(points, p.Name)
	}
	if r.Name != DefaultHookName || strings.Join(r.Versions, ",") != "v1alpha3" || strings.Join(points, ",") != "OnDefineDomain,Shutdown" {
		t.Errorf("Info: %v", r)
	}
}

func TestOnDefineDomainKubeVirtDomain(t *testing.T) {
	s := startSidecar(t)
	pre := read(t, "domain-kubevirt-v1.7.0.xml")
	post, err := s.define(t, pre, read(t, "vmi.json"))
	if err != nil {
		t.Fatal(err)
	}
	d := parse(t, post)
	var vhu []libvirtxml.DomainInterface
	for _, i := range d.Devices.Interfaces {
		if i.Source != nil && i.Source.VHostUser != nil {
			vhu = append(vhu, i)
		}
	}
	// Two interfaces are ours; "default" (masquerade) and "other" (passt) are not.
	if len(vhu) != 2 {
		t.Fatalf("%d vhost-user interfaces, want 2:\n%s", len(vhu), post)
	}
	for i, want := range []struct{ alias, path, mac string }{
		{"ua-fast", "/var/run/vhostmq/pod1a2b3c4d5e6.sock", "ca:fe:ca:fe:42:42"},  // the VMI's MAC
		{"ua-fast2", "/var/run/vhostmq/pod6f7a8b9c0d1.sock", "02:00:00:00:00:02"}, // network-info's
	} {
		g := vhu[i]
		u := g.Source.VHostUser.Chardev.UNIX
		if g.Alias.Name != want.alias || u.Path != want.path || u.Mode != "server" || g.MAC.Address != want.mac ||
			g.Model.Type != "virtio-non-transitional" || g.Driver.Queues != 4 || g.Driver.RXQueueSize != 1024 || g.Driver.TXQueueSize != 1024 {
			b, _ := xmlOf(g)
			t.Errorf("interface %d: %s", i, b)
		}
	}
	mb := d.MemoryBacking
	if mb == nil || mb.MemorySource == nil || mb.MemorySource.Type != "memfd" || mb.MemoryAccess == nil || mb.MemoryAccess.Mode != "shared" {
		t.Errorf("memoryBacking %+v", mb)
	}
	// Nothing else changed: drop what the hook adds and compare with the input.
	d.MemoryBacking = nil
	var rest []libvirtxml.DomainInterface
	for _, i := range d.Devices.Interfaces {
		if i.Source == nil || i.Source.VHostUser == nil {
			rest = append(rest, i)
		}
	}
	d.Devices.Interfaces = rest
	a, _ := d.Marshal()
	b, _ := parse(t, pre).Marshal()
	if a != b {
		t.Errorf("the hook changed more than the NICs and memory backing:\n%s\n---\n%s", a, b)
	}
	// virt-launcher calls it again (and again on a migration target).
	again, err := s.define(t, post, read(t, "vmi.json"))
	if err != nil || !bytes.Equal(again, post) {
		t.Errorf("second OnDefineDomain differs: %v\n%s\n---\n%s", err, again, post)
	}
}

func xmlOf(i libvirtxml.DomainInterface) (string, error) { return i.Marshal() }

func vmiWith(t *testing.T, edit func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(read(t, "vmi.json"), &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, _ := json.Marshal(m)
	return b
}

func path(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		n, ok := m[k].(map[string]any)
		if !ok {
			n = map[string]any{}
			m[k] = n
		}
		m = n
	}
	return m
}

func TestQueuesRule(t *testing.T) {
	s := startSidecar(t)
	pre := read(t, "domain-kubevirt-v1.7.0.xml")
	for _, tc := range []struct {
		name string
		edit func(m map[string]any)
		want uint
	}{
		{"vcpus", func(map[string]any) {}, 4},
		{"annotation", func(m map[string]any) { path(m, "metadata", "annotations")["vhostmq.io/queues"] = "2" }, 2},
		{"no multiqueue", func(m map[string]any) { path(m, "spec", "domain", "devices")["networkInterfaceMultiqueue"] = false }, 1},
		{"clamped", func(m map[string]any) { path(m, "spec", "domain", "cpu")["cores"] = 200 }, 128},
		{"cpu from limits", func(m map[string]any) {
			delete(path(m, "spec", "domain"), "cpu")
			path(m, "spec", "domain", "resources")["limits"] = map[string]any{"cpu": "2500m"}
		}, 3},
	} {
		out, err := s.define(t, pre, vmiWith(t, tc.edit))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		for _, i := range parse(t, out).Devices.Interfaces {
			if i.Source.VHostUser != nil && i.Driver.Queues != tc.want {
				t.Errorf("%s: queues %d, want %d", tc.name, i.Driver.Queues, tc.want)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	s := startSidecar(t)
	pre := read(t, "domain-kubevirt-v1.7.0.xml")
	for _, tc := range []struct {
		name   string
		domain []byte
		vmi    []byte
		code   codes.Code
		msg    string
	}{
		{"bad queues", pre, vmiWith(t, func(m map[string]any) { path(m, "metadata", "annotations")["vhostmq.io/queues"] = "0" }), codes.InvalidArgument, "annotation vhostmq.io/queues"},
		{"bad rx size", pre, vmiWith(t, func(m map[string]any) { path(m, "metadata", "annotations")["vhostmq.io/rx-queue-size"] = "300" }), codes.InvalidArgument, "annotation vhostmq.io/rx-queue-size"},
		{"vmi JSON", pre, []byte("{"), codes.InvalidArgument, "vmi"},
		{"domain XML", []byte("<domain"), read(t, "vmi.json"), codes.InvalidArgument, "domain XML"},
		{"no device-info", pre, vmiWith(t, func(m map[string]any) {
			ifs := path(m, "spec", "domain", "devices")["interfaces"].([]any)
			ifs[1].(map[string]any)["name"] = "fast3"
		}), codes.FailedPrecondition, "interface fast3: no vhost-user device-info"},
	} {
		_, err := s.define(t, tc.domain, tc.vmi)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v, want %v naming %q", tc.name, err, tc.code, tc.msg)
		}
	}
	// A VMI without vhostmq interfaces: the domain comes back untouched,
	// network-info is not even needed.
	os.Remove(s.netInfo)
	plain := vmiWith(t, func(m map[string]any) {
		path(m, "spec", "domain", "devices")["interfaces"] = []any{map[string]any{"name": "default", "masquerade": map[string]any{}}}
	})
	out, err := s.define(t, pre, plain)
	if err != nil || !bytes.Equal(out, pre) {
		t.Errorf("VMI without vhostmq interfaces: %v", err)
	}
	if _, err := s.define(t, pre, read(t, "vmi.json")); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "network-info") {
		t.Errorf("missing network-info file: %v", err)
	}
}

// TestWaitsForDeviceInfo: on a migration target the network-info file is
// written after virt-launcher may already call the hook; the sidecar waits
// (bounded) for the device-info rather than failing the migration.
func TestWaitsForDeviceInfo(t *testing.T) {
	s := startSidecarWaiting(t, 10*time.Second)
	pre := read(t, "domain-kubevirt-v1.7.0.xml")
	full := read(t, "network-info.json")
	// the file as KubeVirt writes it before the annotation: no network-status
	if err := os.WriteFile(s.netInfo, []byte(`{"interfaces":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	file := s.netInfo
	written := make(chan struct{})
	go func() {
		defer close(written)
		time.Sleep(700 * time.Millisecond)
		// as the kubelet writes a downward-API file: a new file renamed in place
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, full, 0o644); err == nil {
			os.Rename(tmp, file)
		}
	}()
	start := time.Now()
	out, err := s.define(t, pre, read(t, "vmi.json"))
	if err != nil {
		t.Fatalf("OnDefineDomain with the device-info arriving late: %v", err)
	}
	if took := time.Since(start); took < 600*time.Millisecond || took > 5*time.Second {
		t.Errorf("OnDefineDomain returned after %v, want just after the file was written (700 ms)", took)
	}
	if n := len(vhostUserIfaces(parse(t, out))); n != 2 {
		t.Errorf("%d vhost-user interfaces after the wait, want 2", n)
	}
	<-written

	// a device-info that never comes: the error after the bound says so
	s = startSidecarWaiting(t, 600*time.Millisecond)
	if err := os.WriteFile(s.netInfo, []byte(`{"interfaces":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = s.define(t, pre, read(t, "vmi.json"))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no vhost-user device-info") {
		t.Errorf("device-info never written: %v, want FailedPrecondition naming it", err)
	}
	if took := time.Since(start); took < 400*time.Millisecond || took > 3*time.Second {
		t.Errorf("gave up after %v, want about the 600 ms bound", took)
	}
	// bad input does not wait: with a minute's bound, an answer well
	// within it did not wait for device-info (on a busy machine too)
	s = startSidecarWaiting(t, time.Minute)
	start = time.Now()
	if _, err := s.define(t, []byte("<domain"), read(t, "vmi.json")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad domain XML: %v", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("bad domain XML answered after %v: it waited for device-info", took)
	}
}

func TestHugepagesKeepTheirBacking(t *testing.T) {
	s := startSidecar(t)
	d := parse(t, read(t, "domain-kubevirt-v1.7.0.xml"))
	d.MemoryBacking = &libvirtxml.DomainMemoryBacking{MemoryHugePages: &libvirtxml.DomainMemoryHugepages{Hugepages: []libvirtxml.DomainMemoryHugepage{{Size: 2, Unit: "M"}}}}
	d.CPU.Numa = &libvirtxml.DomainNuma{Cell: []libvirtxml.DomainCell{{ID: new(uint), Memory: 512, Unit: "MiB", MemAccess: "private"}}}
	x, _ := d.Marshal()
	out, err := s.define(t, []byte(x), read(t, "vmi.json"))
	if err != nil {
		t.Fatal(err)
	}
	got := parse(t, out)
	mb := got.MemoryBacking
	if mb.MemoryHugePages == nil || mb.MemorySource != nil || mb.MemoryAccess == nil || mb.MemoryAccess.Mode != "shared" {
		t.Errorf("memoryBacking %+v", mb)
	}
	if got.CPU.Numa.Cell[0].MemAccess != "shared" {
		t.Errorf("NUMA cell memAccess %q", got.CPU.Numa.Cell[0].MemAccess)
	}
}

func TestShutdownEndsServe(t *testing.T) {
	s := startSidecar(t)
	if _, err := s.cb.Shutdown(context.Background(), &v1alpha3.ShutdownParams{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
	r, err := s.cb.PreCloudInitIso(context.Background(), &v1alpha3.PreCloudInitIsoParams{CloudInitData: []byte("x")})
	if err == nil {
		t.Errorf("still serving after Shutdown: %v", r)
	}
}

// TestValidatesWithLibvirtSchema checks what the hook adds against
// libvirt's own RelaxNG schema (virt-xml-validate). KubeVirt's domain
// does not validate as is (its metadata and empty elements), so the
// whole domain must not gain errors, and the added parts must validate in
// a minimal domain.
func TestValidatesWithLibvirtSchema(t *testing.T) {
	if _, err := exec.LookPath("virt-xml-validate"); err != nil {
		t.Skip("virt-xml-validate not installed (hack/install-deps.sh installs libvirt-clients)")
	}
	s := startSidecar(t)
	pre := read(t, "domain-kubevirt-v1.7.0.xml")
	post, err := s.define(t, pre, read(t, "vmi.json"))
	if err != nil {
		t.Fatal(err)
	}
	validate := func(name string, x []byte) (bool, string) {
		f := filepath.Join(t.TempDir(), name)
		os.WriteFile(f, x, 0o644)
		out, err := exec.Command("virt-xml-validate", f, "domain").CombinedOutput()
		return err == nil, strings.ReplaceAll(string(out), f, "DOMAIN")
	}
	lines := regexp.MustCompile(`DOMAIN:[0-9]+:`)
	preOK, preOut := validate("pre.xml", pre)
	postOK, postOut := validate("post.xml", post)
	t.Logf("KubeVirt's domain validates: %v; after the hook: %v", preOK, postOK)
	if preOK && !postOK || lines.ReplaceAllString(preOut, "") != lines.ReplaceAllString(postOut, "") {
		t.Errorf("the hook changed the validation result:\nbefore: %s\nafter: %s", preOut, postOut)
	}
	// KubeVirt's empty <sysinfo> children are what libvirt's schema
	// refuses; without them the domain must validate before and after.
	noSysinfo := func(x []byte) []byte {
		d := parse(t, x)
		d.SysInfo = nil
		out, _ := d.Marshal()
		return []byte(out)
	}
	if ok, out := validate("pre-nosysinfo.xml", noSysinfo(pre)); !ok {
		t.Fatalf("fixture: KubeVirt's domain without sysinfo does not validate either:\n%s", out)
	}
	if ok, out := validate("post-nosysinfo.xml", noSysinfo(post)); !ok {
		t.Errorf("the hook's domain (sysinfo removed) does not validate:\n%s", out)
	}
	// The added parts alone, in a minimal valid domain.
	d := parse(t, post)
	min := &libvirtxml.Domain{Type: "qemu", Name: "vhostmq-validate", Memory: &libvirtxml.DomainMemory{Value: 512, Unit: "MiB"},
		MemoryBacking: d.MemoryBacking, OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm", Arch: "x86_64", Machine: "q35"}},
		Devices: &libvirtxml.DomainDeviceList{}}
	for _, i := range d.Devices.Interfaces {
		if i.Source != nil && i.Source.VHostUser != nil {
			min.Devices.Interfaces = append(min.Devices.Interfaces, i)
		}
	}
	x, _ := min.Marshal()
	if ok, out := validate("min.xml", []byte(x)); !ok {
		t.Errorf("added parts do not validate:\n%s\n%s", out, x)
	}
}

// vhostUserIfaces are d's vhost-user interfaces.
func vhostUserIfaces(d *libvirtxml.Domain) []libvirtxml.DomainInterface {
	var vhu []libvirtxml.DomainInterface
	for _, i := range d.Devices.Interfaces {
		if i.Source != nil && i.Source.VHostUser != nil {
			vhu = append(vhu, i)
		}
	}
	return vhu
}
