package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vhostmq/vhostmq/dataplane/agent/agenttest"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/dhcp/dhcptest"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/plugin"
)

func init() { Timeout = 3 * time.Second }

// env is a node: an agent with its dataplane on temp sockets.
type env struct {
	*agenttest.Node
	t *testing.T
}

func newEnv(t *testing.T) *env {
	return &env{Node: agenttest.Start(t, "", 4), t: t}
}

// allocate fakes a device plugin allocation of slots; it returns the
// allocation directory (host path).
func (e *env) allocate(slots ...string) string {
	dir := plugin.AllocationDir(slots)
	host := filepath.Join(e.SocketRoot, dir)
	if err := os.Mkdir(host, 0o770); err != nil {
		e.t.Fatal(err)
	}
	os.Chmod(host, 0o770)
	if err := os.WriteFile(filepath.Join(e.SocketRoot, "."+dir+".slots"), []byte(strings.Join(slots, ",")+"\n"), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return host
}

func (e *env) conf(extra string) []byte {
	// podResourcesSocket: never the machine's kubelet, even when a test
	// cluster runs beside the tests.
	c := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"vhu-net","type":"vhostmq-cni","agentSocket":%q,"socketRoot":%q,"containerSocketDir":"/var/run/vhostmq","podResourcesSocket":%q%s}`,
		e.APISocket, e.SocketRoot, filepath.Join(e.Dir, "pod-resources.sock"), extra)
	return []byte(c)
}

func (e *env) ports() []*agentv1.Port {
	l, err := e.Client.ListPorts(context.Background(), &agentv1.ListPortsRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Ports
}

func cmdArgs(containerID, ifname string, conf []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: containerID, Netns: "/var/run/netns/" + containerID[:8], IfName: ifname,
		Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=vm1-launcher;K8S_POD_UID=uid-1;K8S_POD_INFRA_CONTAINER_ID=" + containerID, StdinData: conf}
}

func cniErr(t *testing.T, err error) *types.Error {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T) is not a *types.Error", err, err)
	}
	return te
}

func mustAdd(t *testing.T, args *skel.CmdArgs) *current.Result {
	t.Helper()
	conf, err := loadConf(args.StdinData)
	if err != nil {
		t.Fatal(err)
	}
	r, err := add(args, conf)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const cid = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestAddDelFlow(t *testing.T) {
	e := newEnv(t)
	host := e.allocate("c0-s1", "c0-s0")
	devinfo := filepath.Join(e.Dir, "devinfo", "vhu-net-"+cid[:12]+"_net1")
	os.MkdirAll(filepath.Dir(devinfo), 0o755)
	os.WriteFile(devinfo, []byte(`{"type":"vhost-user"}`), 0o444) // as Multus copies the DP file
	conf := e.conf(fmt.Sprintf(`,"mtu":9000,"deviceID":"c0-s0","runtimeConfig":{"deviceID":"c0-s0","CNIDeviceInfoFile":%q,"mac":"ca:fe:ca:fe:42:42"}`, devinfo))
	args := cmdArgs(cid, "net1", conf)

	res := mustAdd(t, args)
	again := mustAdd(t, args) // ADD retried: same port
	b, _ := json.Marshal(res)
	b2, _ := json.Marshal(again)
	if string(b) != string(b2) {
		t.Errorf("second ADD: %s, first %s", b2, b)
	}
	// The result Multus needs: one interface with the sandbox.
	var out struct {
		CNIVersion string `json:"cniVersion"`
		Interfaces []struct {
			Name, Mac, Sandbox string
		} `json:"interfaces"`
	}
	vr, err := res.GetAsVersion("1.0.0")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(vr)
	json.Unmarshal(b, &out)
	if len(out.Interfaces) != 1 || out.Interfaces[0].Name != "net1" || out.Interfaces[0].Mac != "ca:fe:ca:fe:42:42" || out.Interfaces[0].Sandbox != args.Netns {
		t.Errorf("result %s", b)
	}

	ports := e.ports()
	if len(ports) != 1 {
		t.Fatalf("%d ports, want 1", len(ports))
	}
	s := ports[0].Spec
	wantLabels := map[string]string{"k8s.pod.namespace": "ns1", "k8s.pod.name": "vm1-launcher", "k8s.pod.uid": "uid-1",
		"interface": "net1", "network": "vhu-net", LabelContainerID: cid, LabelIfName: "net1"}
	for k, v := range wantLabels {
		if s.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, s.Labels[k], v)
		}
	}
	if s.Id != PortID(cid, "net1") || s.SocketPath != filepath.Join(host, "net1.sock") || s.QueuePairs != 2 ||
		strings.Join(s.Slots, ",") != "c0-s0,c0-s1" || s.Role != agentv1.Role_ROLE_CLIENT || s.Mtu != 9000 || s.Mac != "ca:fe:ca:fe:42:42" {
		t.Errorf("port spec %v", s)
	}
	if n := len(ports[0].Status.Queues); n != 2 {
		t.Errorf("%d queues", n)
	}
	if fi, err := os.Stat(host); err != nil || fi.Mode().Perm() != 0o770 {
		t.Errorf("allocation directory mode changed: %v %v", fi.Mode(), err)
	}
	got, _ := os.ReadFile(devinfo)
	if want := `{"type":"vhost-user","version":"1.1.0","vhost-user":{"mode":"server","path":"/var/run/vhostmq/net1.sock"}}`; string(got) != want {
		t.Errorf("device-info %s, want %s", got, want)
	}
	if fi, _ := os.Stat(devinfo); fi.Mode().Perm() != 0o444 {
		t.Errorf("device-info mode %v", fi.Mode())
	}

	// CHECK passes with the prevResult.
	chk := e.conf(fmt.Sprintf(`,"mtu":9000,"deviceID":"c0-s0","prevResult":%s`, b))
	if err := CmdCheck(cmdArgs(cid, "net1", chk)); err != nil {
		t.Errorf("CHECK: %v", err)
	}

	// DEL twice, then CHECK finds the port missing.
	for i := 0; i < 2; i++ {
		if err := CmdDel(args); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if n := len(e.ports()); n != 0 {
		t.Errorf("%d ports after DEL", n)
	}
	if _, err := os.Stat(devinfo); !os.IsNotExist(err) {
		t.Errorf("device-info left: %v", err)
	}
	if err := CmdCheck(cmdArgs(cid, "net1", chk)); cniErr(t, err).Code != ErrPortMismatch || !strings.Contains(err.Error(), "missing") {
		t.Errorf("CHECK of a deleted port: %v", err)
	}
	// DEL without a netns, device ID or runtimeConfig (runtime cleanup).
	a := cmdArgs(cid, "net1", e.conf(""))
	a.Netns = ""
	if err := CmdDel(a); err != nil {
		t.Errorf("bare DEL: %v", err)
	}
}

func TestDefaultsAndClientMode(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s2", "c0-s3", "c0-s0")
	args := cmdArgs(cid, "eth1", e.conf(`,"deviceID":"c0-s0","socketMode":"client","polling":"interrupt"`))
	args.Args += ";MAC=52:54:00:00:00:01"
	res := mustAdd(t, args)
	s := e.ports()[0].Spec
	if s.Role != agentv1.Role_ROLE_SERVER || s.QueuePairs != 3 || strings.Join(s.Slots, ",") != "c0-s0,c0-s2,c0-s3" || s.Mac != "52:54:00:00:00:01" || s.Polling != agentv1.PollingMode_POLLING_INTERRUPT {
		t.Errorf("spec %v", s)
	}
	if res.Interfaces[0].Mac != "52:54:00:00:00:01" {
		t.Errorf("result mac %s", res.Interfaces[0].Mac)
	}
	// The dataplane listens in client mode.
	if _, err := os.Stat(s.SocketPath); err != nil {
		t.Errorf("server socket: %v", err)
	}
	// Generated MAC: locally administered, unicast, stable.
	m := generatedMAC(cid, "eth1")
	if m[0]&3 != 2 || generatedMAC(cid, "eth1").String() != m.String() || generatedMAC(cid, "eth2").String() == m.String() {
		t.Errorf("generated mac %s", m)
	}
	// Fewer pairs than slots: the first slots serve them.
	e.allocate("c0-s1")
	mustAdd(t, cmdArgs(cid, "eth2", e.conf(`,"deviceID":"c0-s1","queuePairs":1`)))
	p, err := e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: PortID(cid, "eth2")})
	if err != nil || p.Spec.QueuePairs != 1 || strings.Join(p.Spec.Slots, ",") != "c0-s1" {
		t.Errorf("one pair: %v %v", p, err)
	}
}

func TestDelAgentDown(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	args := cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0"`))
	mustAdd(t, args)
	id := PortID(cid, "net1")
	e.Stop()

	if err := CmdStatus(args); cniErr(t, err).Code != types.ErrPluginNotAvailable || cniErr(t, err).Msg != "plugin not available" {
		t.Errorf("STATUS with the agent down: %v", err)
	}
	start := time.Now()
	if err := CmdDel(args); err != nil {
		t.Fatalf("DEL with the agent down: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("DEL with the agent down took %v", d)
	}
	if _, err := os.Stat(filepath.Join(e.SocketRoot, pendingDir, id)); err != nil {
		t.Fatalf("pending file: %v", err)
	}
	// ADD with the agent down: try again later, nothing recorded.
	other := cmdArgs(strings.Repeat("f", 64), "net2", e.conf(`,"deviceID":"c0-s0"`))
	conf, _ := loadConf(other.StdinData)
	if _, err := add(other, conf); cniErr(t, err).Code != types.ErrTryAgainLater {
		t.Errorf("ADD with the agent down: %v", err)
	}

	// The agent comes back with the port (persisted); GC retries the deletion.
	e.Restart()
	if _, err := e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: id}); err != nil {
		t.Fatalf("port not restored: %v", err)
	}
	if err := CmdStatus(args); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	gc := e.conf(`,"cni.dev/valid-attachments":[{"containerID":"` + cid + `","ifname":"net1"}]`)
	if err := CmdGC(cmdArgs(cid, "net1", gc)); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, err := e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: id}); status.Code(err) != codes.NotFound {
		t.Errorf("pending deletion not retried: %v", err)
	}
	if ids := pendingIDs(e.SocketRoot); len(ids) != 0 {
		t.Errorf("pending left: %v", ids)
	}
}

func TestPendingRetriedByAdd(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	e.allocate("c0-s1")
	a1 := cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0"`))
	mustAdd(t, a1)
	e.Stop()
	if err := CmdDel(a1); err != nil {
		t.Fatal(err)
	}
	e.Restart()
	mustAdd(t, cmdArgs(strings.Repeat("a", 64), "net1", e.conf(`,"deviceID":"c0-s1"`)))
	ports := e.ports()
	if len(ports) != 1 || ports[0].Spec.Id != PortID(strings.Repeat("a", 64), "net1") {
		t.Errorf("ports after ADD: %v", ports)
	}
	if ids := pendingIDs(e.SocketRoot); len(ids) != 0 {
		t.Errorf("pending left: %v", ids)
	}
}

func TestGC(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	e.allocate("c0-s1")
	e.allocate("c0-s2")
	keep, drop := strings.Repeat("1", 64), strings.Repeat("2", 64)
	mustAdd(t, cmdArgs(keep, "net1", e.conf(`,"deviceID":"c0-s0"`)))
	mustAdd(t, cmdArgs(drop, "net1", e.conf(`,"deviceID":"c0-s1"`)))
	// Another network's port, and a port not made by the CNI, stay.
	other := e.conf(`,"deviceID":"c0-s2"`)
	other = []byte(strings.Replace(string(other), `"name":"vhu-net"`, `"name":"other"`, 1))
	mustAdd(t, cmdArgs(drop, "net2", other))
	if _, err := e.Client.CreatePort(context.Background(), &agentv1.CreatePortRequest{Spec: &agentv1.PortSpec{
		Id: "manual", SocketPath: filepath.Join(e.SocketRoot, "manual", "m.sock"), Role: agentv1.Role_ROLE_SERVER, QueuePairs: 1}}); err != nil {
		t.Fatal(err)
	}
	gc := e.conf(`,"cni.dev/valid-attachments":[{"containerID":"` + keep + `","ifname":"net1"}]`)
	if err := CmdGC(cmdArgs(keep, "net1", gc)); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range e.ports() {
		ids = append(ids, p.Spec.Id)
	}
	want := map[string]bool{PortID(keep, "net1"): true, PortID(drop, "net2"): true, "manual": true}
	if len(ids) != 3 {
		t.Errorf("ports after GC: %v", ids)
	}
	for _, id := range ids {
		if !want[id] {
			t.Errorf("port %s survived GC", id)
		}
	}
}

func TestCheckDetectsDifferences(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0", "c0-s1")
	args := cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0"`))
	mustAdd(t, args)
	// A config asking for other queue counts does not match the port.
	if err := CmdCheck(cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0","queuePairs":1`))); cniErr(t, err).Code != ErrPortMismatch || !strings.Contains(err.Error(), "queue_pairs") {
		t.Errorf("CHECK with other queue pairs: %v", err)
	}
	if err := CmdCheck(args); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// ... nor one on another VLAN
	if err := CmdCheck(cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0","vlan":7`))); cniErr(t, err).Code != ErrPortMismatch || !strings.Contains(err.Error(), "vlan is 0, want 7") {
		t.Errorf("CHECK with another VLAN: %v", err)
	}
	// A port made by a plugin from before networks (none named) passes
	// CHECK as it was made.
	p, err := e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: PortID(cid, "net1")})
	if err != nil {
		t.Fatal(err)
	}
	old := p.Spec
	old.Network, old.Uplink = "", ""
	e.Client.DeletePort(context.Background(), &agentv1.DeletePortRequest{Id: old.Id})
	if _, err := e.Client.CreatePort(context.Background(), &agentv1.CreatePortRequest{Spec: old}); err != nil {
		t.Fatal(err)
	}
	if err := CmdCheck(cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0","vlan":7`))); err != nil {
		t.Errorf("CHECK of a port from before networks: %v", err)
	}
	e.Client.DeletePort(context.Background(), &agentv1.DeletePortRequest{Id: PortID(cid, "net1")})
	if err := CmdCheck(args); cniErr(t, err).Code != ErrPortMismatch {
		t.Errorf("CHECK of a missing port: %v", err)
	}
}

// portSecurity: on by default, off from the network configuration, and
// CHECK names it when the port differs.
func TestPortSecurity(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	args := cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0"`))
	mustAdd(t, args)
	if s := e.ports()[0].Spec; !s.PortSecurityOn() {
		t.Errorf("default: port_security %v, want on", s.PortSecurity)
	}
	if err := CmdCheck(args); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	off := cmdArgs(cid, "net1", e.conf(`,"deviceID":"c0-s0","portSecurity":false`))
	if err := CmdCheck(off); cniErr(t, err).Code != ErrPortMismatch || !strings.Contains(err.Error(), "port_security is true, want false") {
		t.Errorf("CHECK with portSecurity false: %v", err)
	}
	// ADD of the same attachment with another setting is refused by the
	// agent, naming the field.
	if err := CmdAdd(off); cniErr(t, err).Code != ErrAgentRejected || !strings.Contains(err.Error(), "spec.port_security") {
		t.Errorf("ADD again with portSecurity false: %v", err)
	}
	if err := CmdDel(args); err != nil {
		t.Fatal(err)
	}
	mustAdd(t, off)
	if s := e.ports()[0].Spec; s.PortSecurityOn() {
		t.Errorf("portSecurity false: port_security %v", s.PortSecurity)
	}
	if err := CmdCheck(off); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := CmdCheck(args); cniErr(t, err).Code != ErrPortMismatch || !strings.Contains(err.Error(), "port_security is false, want true") {
		t.Errorf("CHECK with portSecurity on: %v", err)
	}
}

func TestBadConfigCreatesNothing(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	devinfo := filepath.Join(e.Dir, "di")
	for _, tc := range []struct {
		name  string
		extra string
		code  uint
		msg   string
	}{
		{"unknown field", `,"deviceID":"c0-s0","queuepairs":2`, types.ErrUnsupportedField, `"queuepairs"`},
		{"bad mtu", `,"deviceID":"c0-s0","mtu":20000`, types.ErrInvalidNetworkConfig, "mtu"},
		{"low mtu", `,"deviceID":"c0-s0","mtu":67`, types.ErrInvalidNetworkConfig, "mtu"},
		{"mtu type", `,"deviceID":"c0-s0","mtu":"big"`, types.ErrDecodingFailure, "mtu"},
		{"bad socketMode", `,"deviceID":"c0-s0","socketMode":"both"`, types.ErrInvalidNetworkConfig, "socketMode"},
		{"bad polling", `,"deviceID":"c0-s0","polling":"spin"`, types.ErrInvalidNetworkConfig, "polling"},
		{"queuePairs", `,"deviceID":"c0-s0","queuePairs":129`, types.ErrInvalidNetworkConfig, "queuePairs"},
		{"relative root", `,"deviceID":"c0-s0","agentSocket":"api.sock"`, types.ErrInvalidNetworkConfig, "agentSocket"},
		{"bad mac", `,"deviceID":"c0-s0","runtimeConfig":{"mac":"01:00:5e:00:00:01"}`, types.ErrInvalidNetworkConfig, "runtimeConfig.mac"},
		{"ipam without type", `,"deviceID":"c0-s0","ipam":{}`, types.ErrInvalidNetworkConfig, "ipam"},
		{"ipam plugin missing", `,"deviceID":"c0-s0","ipam":{"type":"no-such-ipam"}`, types.ErrInternal, "ipam ADD (no-such-ipam)"},
		{"more queues than allocated", `,"deviceID":"c0-s0","queuePairs":2`, ErrNoAllocation, "queuePairs asks for 2 queue pairs, the pod has 1 allocated"},
		{"bad resourceName", `,"deviceID":"c0-s0","resourceName":"queue-pairs"`, types.ErrInvalidNetworkConfig, "resourceName"},
		{"relative kubeconfig", `,"deviceID":"c0-s0","kubeconfig":"kc"`, types.ErrInvalidNetworkConfig, "kubeconfig"},
		{"deviceID conflict", `,"deviceID":"c0-s0","runtimeConfig":{"deviceID":"c0-s1"}`, types.ErrInvalidNetworkConfig, "deviceID"},
		{"no deviceID", ``, ErrNoDevice, "no vhostmq.io/queue-pairs device allocated to this pod"},
		{"unallocated device", `,"deviceID":"c0-s3"`, ErrNoAllocation, `device "c0-s3"`},
		{"dhcp type", `,"deviceID":"c0-s0","dhcp":"yes"`, types.ErrInvalidNetworkConfig, `dhcp: "yes" is not true or false`},
		{"dhcp without ipam", `,"deviceID":"c0-s0","dhcp":true`, types.ErrInvalidNetworkConfig, "dhcp: true needs ipam"},
		{"portSecurity type", `,"deviceID":"c0-s0","portSecurity":"off"`, types.ErrInvalidNetworkConfig, `portSecurity: "off" is not true or false`},
		{"vlan", `,"deviceID":"c0-s0","vlan":4095`, types.ErrInvalidNetworkConfig, "vlan: 4095 is outside 0..4094"},
		{"vlan type", `,"deviceID":"c0-s0","vlan":-1`, types.ErrInvalidNetworkConfig, "vlan: -1 is not a number"},
		{"uplink", `,"deviceID":"c0-s0","uplink":"eth0"`, types.ErrInvalidNetworkConfig, `uplink: "eth0" is not`},
		{"uplink the node lacks", `,"deviceID":"c0-s0","uplink":"tap"`, ErrAgentRejected, "spec.uplink"},
		{"vxlan without vni", `,"deviceID":"c0-s0","uplink":"vxlan"`, types.ErrInvalidNetworkConfig, "vni: 0 is outside 1..16777215 (uplink vxlan needs one)"},
		{"vxlan with vlan", `,"deviceID":"c0-s0","uplink":"vxlan","vni":5,"vlan":7`, types.ErrInvalidNetworkConfig, "vlan: 7, but on uplink vxlan"},
		{"vni elsewhere", `,"deviceID":"c0-s0","uplink":"tap","vni":5`, types.ErrInvalidNetworkConfig, `vni: 5, but uplink is "tap"`},
		{"vni type", `,"deviceID":"c0-s0","uplink":"vxlan","vni":"5"`, types.ErrInvalidNetworkConfig, "vni:"},
		{"vxlan the node lacks", `,"deviceID":"c0-s0","uplink":"vxlan","vni":5`, ErrAgentRejected, "spec.uplink"},
	} {
		conf := e.conf(tc.extra)
		// every case also names a device-info file: it must stay untouched
		conf = []byte(strings.Replace(string(conf), `"type":"vhostmq-cni"`, `"type":"vhostmq-cni","capabilities":{"CNIDeviceInfoFile":true}`, 1))
		os.Remove(devinfo)
		err := CmdAdd(cmdArgs(cid, "net1", conf))
		if err == nil {
			t.Errorf("%s: ADD succeeded", tc.name)
			continue
		}
		te := cniErr(t, err)
		if te.Code != tc.code || !strings.Contains(te.Msg, tc.msg) {
			t.Errorf("%s: code %d %q, want %d naming %q", tc.name, te.Code, te.Msg, tc.code, tc.msg)
		}
	}
	if n := len(e.ports()); n != 0 {
		t.Errorf("%d ports created by bad configs", n)
	}
	if _, err := os.Stat(devinfo); !os.IsNotExist(err) {
		t.Errorf("device-info written by a failed ADD")
	}
}

func TestRollbackOnDeviceInfoFailure(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	// The device-info path's parent is a file: writing fails after CreatePort.
	blocker := filepath.Join(e.Dir, "blocker")
	os.WriteFile(blocker, nil, 0o644)
	conf := e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","runtimeConfig":{"CNIDeviceInfoFile":%q}`, filepath.Join(blocker, "x")))
	err := CmdAdd(cmdArgs(cid, "net1", conf))
	if cniErr(t, err).Code != types.ErrIOFailure {
		t.Errorf("ADD: %v", err)
	}
	if n := len(e.ports()); n != 0 {
		t.Errorf("port not rolled back: %d ports", n)
	}
}

func TestLongSocketPath(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	conf := e.conf(`,"deviceID":"c0-s0","containerSocketDir":"/` + strings.Repeat("x", 100) + `"`)
	// containerSocketDir is given twice: the decoder keeps the last.
	err := CmdAdd(cmdArgs(cid, "net1", conf))
	if te := cniErr(t, err); te.Code != types.ErrInvalidNetworkConfig || !strings.Contains(te.Msg, "containerSocketDir") {
		t.Errorf("long path: %v", err)
	}
}

func TestPortIDValid(t *testing.T) {
	id := PortID(cid, "net1")
	if len(id) > 63 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" || id == PortID(cid, "net2") {
		t.Errorf("port ID %q", id)
	}
}

// IPAM is delegated to a real IPAM plugin (Debian's host-local, CNI ≤
// 1.0.0): its own fields pass through, the address lands in the result,
// DEL releases it, and a failed ADD releases it too.
func TestIPAMDelegation(t *testing.T) {
	const cniPath = "/usr/lib/cni"
	if _, err := os.Stat(filepath.Join(cniPath, "host-local")); err != nil {
		t.Skip("host-local not installed (hack/install-deps.sh installs containernetworking-plugins)")
	}
	t.Setenv("CNI_PATH", cniPath)
	e := newEnv(t)
	e.allocate("c0-s0")
	leases := filepath.Join(e.Dir, "leases")
	conf := e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","ipam":{"type":"host-local","subnet":"192.0.2.0/28","dataDir":%q},"runtimeConfig":{"portMappings":[]}`, leases))
	args := cmdArgs(cid, "net1", conf)
	t.Setenv("CNI_CONTAINERID", args.ContainerID)
	t.Setenv("CNI_IFNAME", args.IfName)
	t.Setenv("CNI_NETNS", args.Netns)
	t.Setenv("CNI_ARGS", args.Args)
	res := mustAdd(t, args)
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "192.0.2.2/28" || res.IPs[0].Interface == nil || *res.IPs[0].Interface != 0 {
		t.Fatalf("result IPs %v", res.IPs)
	}
	// With ipam, dhcp is on by default: the port carries the IPAM result
	// and the dataplane hands the address to the guest.
	ps := e.ports()
	if len(ps) != 1 || !ps[0].Spec.Dhcp || ps[0].Spec.Network != "vhu-net" || ps[0].Spec.Uplink != "none" ||
		!slices.Equal(ps[0].Spec.Ip.GetAddresses(), []string{"192.0.2.2/28"}) || ps[0].Spec.Ip.GetGateway() != "192.0.2.1" {
		t.Fatalf("ports %v", ps)
	}
	if r := guestDHCP(t, ps[0].Spec.SocketPath, ps[0].Spec.Mac); r.YIAddr != netip.MustParseAddr("192.0.2.2") || string(r.Options[3]) != "\xc0\x00\x02\x01" {
		t.Errorf("DHCP offer: yiaddr %v router % x", r.YIAddr, r.Options[3])
	}
	held := func() int {
		ents, _ := os.ReadDir(filepath.Join(leases, "vhu-net"))
		n := 0
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "192.0.2.") {
				n++
			}
		}
		return n
	}
	if held() != 1 {
		t.Errorf("%d leases after ADD", held())
	}
	if err := CmdDel(args); err != nil {
		t.Fatal(err)
	}
	if held() != 0 || len(e.ports()) != 0 {
		t.Errorf("after DEL: %d leases, %d ports", held(), len(e.ports()))
	}
	// dhcp off: the port still carries the addresses (port security
	// checks the guest's sources against them), and nothing else.
	noDHCP := cmdArgs(cid, "net1", []byte(strings.Replace(string(conf), `"ipam":`, `"dhcp":false,"ipam":`, 1)))
	res = mustAdd(t, noDHCP)
	ps = e.ports()
	if len(res.IPs) != 1 || len(ps) != 1 || ps[0].Spec.Dhcp || !slices.Equal(ps[0].Spec.Ip.GetAddresses(), []string{res.IPs[0].Address.String()}) || ps[0].Spec.Ip.GetGateway() != "" {
		t.Errorf("dhcp off: result IPs %v, port %v", res.IPs, ps)
	}
	if err := CmdDel(noDHCP); err != nil {
		t.Fatal(err)
	}
	// ... and none without port security
	noSec := cmdArgs(cid, "net1", []byte(strings.Replace(string(conf), `"ipam":`, `"dhcp":false,"portSecurity":false,"ipam":`, 1)))
	mustAdd(t, noSec)
	if ps = e.ports(); len(ps) != 1 || ps[0].Spec.Ip != nil {
		t.Errorf("dhcp and port security off: port %v", ps)
	}
	if err := CmdDel(noSec); err != nil {
		t.Fatal(err)
	}
	// A later step fails (device-info unwritable): the address is released.
	blocker := filepath.Join(e.Dir, "blocker")
	os.WriteFile(blocker, nil, 0o644)
	bad := []byte(strings.Replace(string(conf), `"runtimeConfig":{"portMappings":[]}`, fmt.Sprintf(`"runtimeConfig":{"CNIDeviceInfoFile":%q}`, filepath.Join(blocker, "x")), 1))
	if err := CmdAdd(cmdArgs(cid, "net1", bad)); cniErr(t, err).Code != types.ErrIOFailure {
		t.Errorf("ADD: %v", err)
	}
	if held() != 0 || len(e.ports()) != 0 {
		t.Errorf("after a failed ADD: %d leases, %d ports", held(), len(e.ports()))
	}
}

// guestDHCP plays the guest of a client-role port (QEMU's side listens on
// the socket) and returns the dataplane's answer to a DISCOVER.
func guestDHCP(t *testing.T, socket, mac string) dhcptest.Reply {
	t.Helper()
	ln, err := frontend.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.Accept(frontend.Config{}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hw, _ := net.ParseMAC(mac)
	if err := f.Send(0, dhcptest.Frame(dhcptest.Discover, 7, [6]byte(hw))); err != nil {
		t.Fatal(err)
	}
	fr, err := f.Recv(0, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, err := dhcptest.ParseReply(fr)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
