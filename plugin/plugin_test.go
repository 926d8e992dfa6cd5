package plugin

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/vhostmq/vhostmq/dataplane/agent/agenttest"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// fakeKubelet is the kubelet's Registration service on kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	regs chan *pluginapi.RegisterRequest
	srv  *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string, regs chan *pluginapi.RegisterRequest) *fakeKubelet {
	t.Helper()
	path := filepath.Join(dir, "device-plugins", "kubelet.sock")
	os.MkdirAll(filepath.Dir(path), 0o750)
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{regs: regs, srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go k.srv.Serve(ln)
	return k
}

func TestPluginLifecycle(t *testing.T) {
	dir, _ := os.MkdirTemp("", "dp")
	defer os.RemoveAll(dir)
	kdir := filepath.Join(dir, "kubelet")
	regs := make(chan *pluginapi.RegisterRequest, 4)
	kubelet := startKubelet(t, kdir, regs)
	node := agenttest.Start(t, dir, 4)

	// the agent's socket root: it drops an allocation's reservation once
	// the directory there is gone
	p, err := New(Config{AgentSocket: filepath.Join(dir, "api.sock"), KubeletDir: kdir, SocketRoot: node.SocketRoot,
		DevInfoDir: filepath.Join(dir, "devinfo"), SocketUID: os.Getuid(), SocketGID: os.Getgid(), Logger: agenttest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- p.Run(ctx) }()
	defer func() { cancel(); <-ran }()

	var reg *pluginapi.RegisterRequest
	select {
	case reg = <-regs:
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin did not register")
	}
	if reg.ResourceName != DefaultResource || reg.Version != pluginapi.Version || !reg.Options.GetGetPreferredAllocationAvailable() {
		t.Fatalf("registration %v", reg)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(kdir, "device-plugins", reg.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	law, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	// waitDevices reads updates until want(devices) holds.
	waitDevices := func(what string, want func([]*pluginapi.Device) bool) []*pluginapi.Device {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			r, err := law.Recv()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if want(r.Devices) {
				return r.Devices
			}
		}
		t.Fatalf("%s: timed out", what)
		return nil
	}
	healthy := func(n int) func([]*pluginapi.Device) bool {
		return func(ds []*pluginapi.Device) bool {
			h := 0
			for _, d := range ds {
				if d.Health == pluginapi.Healthy {
					h++
				}
			}
			return len(ds) == 4 && h == n
		}
	}
	devs := waitDevices("4 healthy slots", healthy(4))
	if devs[0].ID != "c0-s0" || devs[0].Topology == nil || len(devs[0].Topology.Nodes) != 1 {
		t.Errorf("device %v", devs[0])
	}

	// The agent goes away: every device turns unhealthy; it comes back.
	node.Stop()
	t0 := time.Now()
	waitDevices("unhealthy after the agent stopped", healthy(0))
	t.Logf("devices unhealthy %v after the agent stopped", time.Since(t0).Round(time.Millisecond))
	node.Restart()
	waitDevices("healthy after the agent came back", healthy(4))

	// Preferred allocation and Allocate.
	pref, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"c0-s0", "c0-s1", "c0-s2", "c0-s3"}, MustIncludeDeviceIDs: []string{"c0-s2"}, AllocationSize: 2}}})
	if err != nil || len(pref.ContainerResponses[0].DeviceIDs) != 2 || pref.ContainerResponses[0].DeviceIDs[0] != "c0-s2" {
		t.Fatalf("preferred allocation: %v %v", pref, err)
	}
	ids := []string{"c0-s3", "c0-s1"}
	alloc, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := alloc.ContainerResponses[0]
	host := filepath.Join(node.SocketRoot, AllocationDir(ids))
	if cr.Envs[EnvSlots] != "c0-s1,c0-s3" || len(cr.Mounts) != 1 || cr.Mounts[0].HostPath != host || cr.Mounts[0].ContainerPath != DefaultContainerSocketDir {
		t.Errorf("allocate response %v", cr)
	}
	if fi, err := os.Stat(host); err != nil || fi.Mode().Perm() != 0o770 {
		t.Errorf("allocation directory: %v %v", fi, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "devinfo", "vhostmq.io-queue-pairs-c0-s1-device.json"))
	var di DeviceInfo
	if err != nil || json.Unmarshal(b, &di) != nil || di.Type != "vhost-user" || di.Version != "1.1.0" || di.VhostUser.Mode != "server" {
		t.Errorf("device-info: %s %v", b, err)
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"c9-s9"}}}}); err == nil {
		t.Error("allocating an unknown slot succeeded")
	}
	// The allocation holds its slots in the agent; a slot a DRA claim
	// holds is refused, naming the claim.
	rl, err := node.Client.ListReservations(ctx, &agentv1.ListReservationsRequest{})
	if err != nil || len(rl.Reservations) != 1 || rl.Reservations[0].Owner != "alloc/"+AllocationDir(ids) || strings.Join(rl.Reservations[0].Slots, ",") != "c0-s3,c0-s1" {
		t.Fatalf("agent reservations after Allocate: %v %v", rl, err)
	}
	if _, err := node.Client.Reserve(ctx, &agentv1.ReserveRequest{Owner: "claim/uid-9", Slots: []string{"c0-s2"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"c0-s2"}}}}); err == nil || !strings.Contains(err.Error(), `reserved by "claim/uid-9"`) {
		t.Errorf("allocating a slot a DRA claim holds: %v", err)
	}
	node.Client.Release(ctx, &agentv1.ReleaseRequest{Owner: "claim/uid-9"})

	// Freed allocations are reclaimed after the grace period.
	p.reclaim(map[string]bool{AllocationDir(ids): true}, time.Now().Add(time.Hour))
	if _, err := os.Stat(host); err != nil {
		t.Errorf("a live allocation was removed: %v", err)
	}
	p.reclaim(map[string]bool{}, time.Now())
	if _, err := os.Stat(host); err != nil {
		t.Errorf("a fresh allocation was removed within the grace period: %v", err)
	}
	// QEMU killed by SIGKILL leaves its socket; a port whose deletion is
	// pending still listens on its own.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(host, "net1.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	live, err := net.Listen("unix", filepath.Join(host, "net2.sock"))
	if err != nil {
		t.Fatal(err)
	}
	p.reclaim(map[string]bool{}, time.Now().Add(time.Hour))
	if _, err := os.Stat(filepath.Join(host, "net1.sock")); !os.IsNotExist(err) {
		t.Errorf("stale socket left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(host, "net2.sock")); err != nil {
		t.Errorf("a socket in use was removed: %v", err)
	}
	live.(*net.UnixListener).SetUnlinkOnClose(false)
	live.Close()
	p.reclaim(map[string]bool{}, time.Now().Add(time.Hour))
	if _, err := os.Stat(host); !os.IsNotExist(err) {
		t.Errorf("freed allocation directory left: %v", err)
	}
	if rl, _ := node.Client.ListReservations(ctx, &agentv1.ListReservationsRequest{}); len(rl.GetReservations()) != 0 {
		t.Errorf("the freed allocation's reservation left: %v", rl)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "devinfo", "*c0-s1*")); len(m) != 0 {
		t.Errorf("freed device-info left: %v", m)
	}

	// The kubelet restarts: the plugin registers again, quickly.
	kubelet.srv.Stop()
	t1 := time.Now()
	startKubelet(t, kdir, regs)
	select {
	case <-regs:
		d := time.Since(t1)
		t.Logf("re-registered %v after the kubelet socket came back", d.Round(time.Millisecond))
		if d > 5*time.Second {
			t.Errorf("re-registration took %v, want < 5s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no re-registration within 5 s of a kubelet restart")
	}

	// Stopping: the devices are reported gone and device-info files removed.
	client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"c0-s0"}}}})
	conn2, _ := grpc.NewClient("unix://"+filepath.Join(kdir, "device-plugins", reg.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer conn2.Close()
	law2, err := pluginapi.NewDevicePluginClient(conn2).ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	law2.Recv()
	cancel()
	<-ran
	ran <- nil
	gotEmpty := false
	for {
		r, err := law2.Recv()
		if err != nil {
			break
		}
		if len(r.Devices) == 0 {
			gotEmpty = true
		}
	}
	if !gotEmpty {
		t.Error("the plugin stopped without reporting its devices gone")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "devinfo", "*")); len(m) != 0 {
		t.Errorf("device-info files left after stop: %v", m)
	}
}

type fakePodResources struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	resp *podresourcesapi.ListPodResourcesResponse
}

func (f *fakePodResources) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	return f.resp, nil
}

// TestLiveAllocations: the kubelet lists a container's devices one entry
// per device when they carry NUMA topology; the allocation is their union.
func TestLiveAllocations(t *testing.T) {
	dir, _ := os.MkdirTemp("", "dp")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "pod-resources", "kubelet.sock")
	os.MkdirAll(filepath.Dir(path), 0o750)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	dev := func(res string, ids ...string) *podresourcesapi.ContainerDevices {
		return &podresourcesapi.ContainerDevices{ResourceName: res, DeviceIds: ids}
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, &fakePodResources{resp: &podresourcesapi.ListPodResourcesResponse{
		PodResources: []*podresourcesapi.PodResources{{Name: "vm", Namespace: "ns", Containers: []*podresourcesapi.ContainerResources{
			{Name: "compute", Devices: []*podresourcesapi.ContainerDevices{dev(DefaultResource, "c0-s0"), dev(DefaultResource, "c1-s0"), dev("other.io/x", "c9-s9")}},
			{Name: "sidecar"},
		}}}}})
	go srv.Serve(ln)
	defer srv.Stop()
	p, err := New(Config{AgentSocket: "/nonexistent", KubeletDir: dir, Logger: agenttest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	live, err := p.liveAllocations(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := AllocationDir([]string{"c1-s0", "c0-s0"}); len(live) != 1 || !live[want] {
		t.Errorf("live allocations %v, want only %s", live, want)
	}
}

// TestUpgradeSurge (#17): during a rolling upgrade with maxSurge the new
// pod's plugin registers beside the old one, on its own socket; when the
// old one stops it neither reports the devices gone (the kubelet would
// set the resource's allocatable to 0 under the new plugin) nor removes
// the device-info files or the allocations, which are the new one's now;
// it removes only its own socket. A later stop with no other instance is
// an uninstall: devices gone, files removed. A dead instance's socket is
// removed by the next one to start.
func TestUpgradeSurge(t *testing.T) {
	dir, _ := os.MkdirTemp("", "dp")
	defer os.RemoveAll(dir)
	kdir := filepath.Join(dir, "kubelet")
	regs := make(chan *pluginapi.RegisterRequest, 8)
	startKubelet(t, kdir, regs)
	agenttest.Start(t, dir, 4)
	// a socket left by an instance killed earlier
	stale := filepath.Join(kdir, "device-plugins", "vhostmq.io_queue-pairs-killed.sock")
	if l, err := net.Listen("unix", stale); err == nil {
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		l.Close()
	}
	start := func(instance string) (*Plugin, func(), *pluginapi.RegisterRequest) {
		p, err := New(Config{AgentSocket: filepath.Join(dir, "api.sock"), KubeletDir: kdir, SocketRoot: filepath.Join(dir, "alloc"),
			DevInfoDir: filepath.Join(dir, "devinfo"), SocketUID: os.Getuid(), SocketGID: os.Getgid(), Logger: agenttest.Logger(),
			Instance: instance})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- p.Run(ctx) }()
		var reg *pluginapi.RegisterRequest
		select {
		case reg = <-regs:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not register", instance)
		}
		return p, func() { cancel(); <-ran }, reg
	}
	watch := func(reg *pluginapi.RegisterRequest) pluginapi.DevicePlugin_ListAndWatchClient {
		conn, err := grpc.NewClient("unix://"+filepath.Join(kdir, "device-plugins", reg.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		law, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(context.Background(), &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; {
			r, err := law.Recv()
			if err != nil || time.Now().After(deadline) {
				t.Fatalf("%s: no list of 4 devices: %v, %v", reg.Endpoint, r, err)
			}
			if len(r.Devices) == 4 {
				return law
			}
		}
	}
	// drain reads a stream to its end and says whether it ever listed no
	// devices.
	drain := func(law pluginapi.DevicePlugin_ListAndWatchClient) (sawEmpty bool) {
		for {
			r, err := law.Recv()
			if err != nil {
				return sawEmpty
			}
			sawEmpty = sawEmpty || len(r.Devices) == 0
		}
	}

	old, stopOld, regOld := start("old-pod")
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("the dead instance's socket is still there: %v", err)
	}
	lawOld := watch(regOld)
	if _, err := old.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"c0-s0"}}}}); err != nil {
		t.Fatal(err)
	}
	_, stopNew, regNew := start("new-pod")
	if regNew.Endpoint == regOld.Endpoint || regNew.ResourceName != regOld.ResourceName {
		t.Fatalf("old registered %s, new %s: the same resource on distinct sockets expected", regOld.Endpoint, regNew.Endpoint)
	}
	lawNew := watch(regNew)
	stopOld()
	if drain(lawOld) {
		t.Error("the old instance reported the devices gone while the new one served them")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "devinfo", "*")); len(m) == 0 {
		t.Error("the old instance removed the device-info files the new one serves")
	}
	if _, err := os.Lstat(filepath.Join(kdir, "device-plugins", regOld.Endpoint)); !os.IsNotExist(err) {
		t.Errorf("the old instance's socket is still there: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(kdir, "device-plugins", regNew.Endpoint)); err != nil {
		t.Errorf("the new instance's socket: %v", err)
	}
	// the new one alone: its stop is an uninstall
	stopNew()
	if !drain(lawNew) {
		t.Error("the last instance stopped without reporting its devices gone")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "devinfo", "*")); len(m) != 0 {
		t.Errorf("device-info files left after the last instance stopped: %v", m)
	}
}
