package cni

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vhostmq/vhostmq/cni/kubevirt/vmi"
	"github.com/vhostmq/vhostmq/dataplane/config"
)

// The migration tests' cluster: VMI vm1 (UID vmi-uid) on network "fast"
// (NAD vhu-net), migrating by VirtualMachineInstanceMigration mig1 (UID
// mig-uid) from pod virt-launcher-vm1-src to the pod being added,
// vm1-launcher.
const (
	migVMIPath  = "/apis/kubevirt.io/v1/namespaces/ns1/virtualmachineinstances/vm1"
	migPath     = "/apis/kubevirt.io/v1/namespaces/ns1/virtualmachineinstancemigrations/mig1"
	migSrcPath  = "/api/v1/namespaces/ns1/pods/virt-launcher-vm1-src"
	migVMIJSON  = `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"vm1","namespace":"ns1","uid":"vmi-uid"},"spec":{"domain":{"devices":{"interfaces":[{"name":"fast","binding":{"name":"vhostmq"}}]}},"networks":[{"name":"fast","multus":{"networkName":"vhu-net"}}]}}`
	migJSON     = `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstanceMigration","metadata":{"name":"mig1","namespace":"ns1","uid":"mig-uid"},"spec":{"vmiName":"vm1"},"status":{"phase":"Scheduling","migrationState":{"sourcePod":"virt-launcher-vm1-src"}}}`
	migVMIOwner = `[{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","name":"vm1","uid":"vmi-uid","controller":true}]`
)

var migIfName = vmi.PodInterfaceName("fast")

// migrationTarget is the pod being added: a virt-launcher pod of vm1, with
// KubeVirt's marks of a migration target unless target is false.
func migrationTarget(target bool) *corev1.Pod {
	p := launcherPod(nil)
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: "vm1", UID: "vmi-uid"}}
	if target {
		p.Labels = map[string]string{kubevirtMigrationJobUID: "mig-uid", "kubevirt.io": "virt-launcher"}
		p.Annotations = map[string]string{kubevirtMigrationJobName: "mig1"}
	}
	return p
}

// sourcePod is the source pod's JSON, owned by owners, with Multus'
// network-status as given (none if "").
func sourcePod(owners string, status ...networkStatus) string {
	ann := ""
	if status != nil {
		b, _ := json.Marshal(status)
		ann = fmt.Sprintf(`,"annotations":{%q:%q}`, multusNetworkStatus, b)
	}
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"virt-launcher-vm1-src","namespace":"ns1","uid":"src-uid","ownerReferences":%s%s}}`, owners, ann)
}

// sourceStatus is a source pod's network-status: the cluster network,
// this network's interface with ips, and another vhostmq interface.
func sourceStatus(ips ...string) []networkStatus {
	return []networkStatus{
		{Name: "k8s-pod-network", Interface: "eth0", IPs: []string{"10.244.1.7"}},
		{Name: "ns1/vhu-net", Interface: migIfName, IPs: ips},
		{Name: "ns1/vhu-net", Interface: vmi.PodInterfaceName("other"), IPs: []string{"10.1.2.77"}},
	}
}

// fakeIPAM installs an IPAM plugin "fake-ipam" in CNI_PATH that allocates
// addrs (address/prefix, the first with gateway 10.1.2.1) and logs each
// command; it returns the log's path.
func fakeIPAM(t *testing.T, addrs ...string) string {
	t.Helper()
	dir := t.TempDir()
	var ips []string
	for i, a := range addrs {
		gw := ""
		if i == 0 {
			gw = `,"gateway":"10.1.2.1"`
		}
		ips = append(ips, fmt.Sprintf(`{"address":%q%s}`, a, gw))
	}
	logFile := filepath.Join(dir, "calls")
	script := fmt.Sprintf(`#!/bin/sh
cat >/dev/null
echo "$CNI_COMMAND" >>%q
case "$CNI_COMMAND" in
ADD) echo '{"cniVersion":"1.0.0","ips":[%s]}' ;;
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}' ;;
esac
`, logFile, strings.Join(ips, ","))
	if err := os.WriteFile(filepath.Join(dir, "fake-ipam"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CNI_PATH", dir)
	return logFile
}

func ipamCalls(logFile string) string {
	b, _ := os.ReadFile(logFile)
	return strings.Join(strings.Fields(string(b)), " ")
}

// captureLog collects what the plugin logs.
func captureLog(t *testing.T) func() []string {
	var mu sync.Mutex
	var lines []string
	old := logf
	logf = func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf(format, args...))
	}
	t.Cleanup(func() { logf = old })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

func hasMigrationLookups(paths []string) bool {
	return slices.ContainsFunc(paths, func(p string) bool {
		return strings.Contains(p, "virtualmachineinstancemigrations") || p == migSrcPath
	})
}

// The port of a migration target allows its own IPAM addresses and the
// ones the guest has on the source pod; DHCP still offers the new one,
// and the result (so the next migration's network-status) lists them all.
func TestMigrationTargetKeepsTheSourceAddresses(t *testing.T) {
	calls := fakeIPAM(t, "10.1.2.9/24", "fd00::9/64")
	logged := captureLog(t)
	// The source also lists 10.1.2.9 (host-local on another node may give
	// the same address): it is not repeated.
	api := newFakeAPI(t, migrationTarget(true), migVMIPath, migVMIJSON, migPath, migJSON,
		migSrcPath, sourcePod(migVMIOwner, sourceStatus("10.1.2.3", "fd00::3", "10.1.2.9")...))
	e := newEnv(t)
	e.allocate("c0-s0")
	args := cmdArgs(cid, migIfName, e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q,"ipam":{"type":"fake-ipam"}`, api.kubeconfig)))
	res := mustAdd(t, args)

	want := []string{"10.1.2.9/24", "fd00::9/64", "10.1.2.3/24", "fd00::3/64"}
	ps := e.ports()
	if len(ps) != 1 {
		t.Fatalf("%d ports", len(ps))
	}
	s := ps[0].Spec
	if !s.PortSecurityOn() || !slices.Equal(s.Ip.GetAddresses(), want) {
		t.Errorf("port security %v, addresses %v; want on, %v", s.PortSecurityOn(), s.Ip.GetAddresses(), want)
	}
	if s.Labels[LabelMigrationSource] != "virt-launcher-vm1-src" || s.Labels[LabelMigrationCarried] != "10.1.2.3/24,fd00::3/64" {
		t.Errorf("labels %v", s.Labels)
	}
	var got []string
	for _, ip := range res.IPs {
		got = append(got, ip.Address.String())
		if ip.Interface == nil || *ip.Interface != 0 {
			t.Errorf("result address %s: interface %v", ip.Address.String(), ip.Interface)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("result addresses %v, want %v", got, want)
	}
	if r := guestDHCP(t, s.SocketPath, s.Mac); r.YIAddr != netip.MustParseAddr("10.1.2.9") {
		t.Errorf("DHCP offers %v, want the pod's own 10.1.2.9", r.YIAddr)
	}
	if l := logged(); len(l) != 1 || !strings.Contains(l[0], "target of live migration ns1/mig1: also allowing 10.1.2.3/24, fd00::3/64") ||
		!strings.Contains(l[0], "virt-launcher-vm1-src") || !strings.Contains(l[0], migIfName) {
		t.Errorf("logged %q", l)
	}
	if p := api.requested(); !slices.Contains(p, migPath) || !slices.Contains(p, migSrcPath) {
		t.Errorf("requested %v", p)
	}
	// ADD again (a retry) makes the same port; CHECK agrees.
	mustAdd(t, args)
	if err := CmdCheck(args); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := CmdDel(args); err != nil {
		t.Fatal(err)
	}
	if c := ipamCalls(calls); c != "ADD ADD CHECK DEL" {
		t.Errorf("IPAM calls %q", c)
	}
}

// Pods that are not migration targets, networks without IPAM and ports
// without port security: nothing is looked up and nothing is carried.
func TestNoMigrationLookups(t *testing.T) {
	fakeIPAM(t, "10.1.2.9/24")
	logged := captureLog(t)
	for _, tc := range []struct {
		name   string
		target bool
		extra  string
		want   []string
	}{
		{"not a target", false, `,"ipam":{"type":"fake-ipam"}`, []string{"10.1.2.9/24"}},
		{"no ipam", true, ``, nil},
		{"port security off", true, `,"ipam":{"type":"fake-ipam"},"portSecurity":false`, []string{"10.1.2.9/24"}},
	} {
		api := newFakeAPI(t, migrationTarget(tc.target), migVMIPath, migVMIJSON, migPath, migJSON,
			migSrcPath, sourcePod(migVMIOwner, sourceStatus("10.1.2.3")...))
		e := newEnv(t)
		e.allocate("c0-s0")
		args := cmdArgs(cid, migIfName, e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q%s`, api.kubeconfig, tc.extra)))
		mustAdd(t, args)
		s := e.ports()[0].Spec
		if !slices.Equal(s.Ip.GetAddresses(), tc.want) || s.Labels[LabelMigrationSource] != "" || s.Labels[LabelMigrationCarried] != "" {
			t.Errorf("%s: addresses %v, labels %v; want %v and no migration labels", tc.name, s.Ip.GetAddresses(), s.Labels, tc.want)
		}
		if p := api.requested(); hasMigrationLookups(p) || api.gets.Load() == 0 {
			t.Errorf("%s: requested %v", tc.name, p)
		}
		if err := CmdDel(args); err != nil {
			t.Fatal(err)
		}
	}
	if l := logged(); len(l) != 0 {
		t.Errorf("logged %q", l)
	}
}

// When the source's addresses cannot be read or used, the ADD fails
// naming what, and leaves nothing behind: KubeVirt reports the failed
// migration and retries it, and the VM keeps running on its source with
// its traffic, instead of arriving where its traffic is dropped.
func TestMigrationSourceUnreadable(t *testing.T) {
	src := sourcePod(migVMIOwner, sourceStatus("10.1.2.3")...)
	mig := func(spec, state string) string {
		return fmt.Sprintf(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstanceMigration","metadata":{"name":"mig1","namespace":"ns1","uid":"mig-uid"},"spec":%s,"status":{"phase":"Pending"%s}}`, spec, state)
	}
	nine := []string{"10.1.2.3", "10.1.2.4", "10.1.2.5", "10.1.2.6", "10.1.2.7", "10.1.2.8", "10.1.2.10", "10.1.2.11"}
	for _, tc := range []struct {
		name      string
		objects   []string // besides the VMI
		code      uint
		msg       string
		ipamAdded bool // the failure comes after the IPAM ADD (which is then undone)
	}{
		{"source pod not found", []string{migPath, migJSON}, ErrMigrationSource,
			"live migration target: reading the source pod ns1/virt-launcher-vm1-src of VirtualMachineInstanceMigration ns1/mig1 for the addresses its guest uses", false},
		{"migration not found", []string{migSrcPath, src}, ErrMigrationSource,
			"live migration target: reading VirtualMachineInstanceMigration ns1/mig1 for its source pod", false},
		{"no source pod yet", []string{migPath, mig(`{"vmiName":"vm1"}`, ""), migSrcPath, src}, types.ErrTryAgainLater,
			"VirtualMachineInstanceMigration ns1/mig1 names no source pod yet", false},
		{"decentralized", []string{migPath, mig(`{"vmiName":"vm1","receive":{"migrationID":"x"}}`, `,"migrationState":{"sourcePod":"vm1-launcher"}`)}, ErrMigrationSource,
			"receives the VM from another namespace or cluster (a decentralized migration)", false},
		{"another VMI's pod", []string{migPath, migJSON, migSrcPath, sourcePod(`[{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","name":"vm2","uid":"other"}]`, sourceStatus("10.1.2.3")...)},
			ErrMigrationSource, "is not a virt-launcher pod of VirtualMachineInstance vm1", false},
		{"no network-status", []string{migPath, migJSON, migSrcPath, sourcePod(migVMIOwner)}, ErrMigrationSource,
			"the source pod ns1/virt-launcher-vm1-src has no annotation k8s.v1.cni.cncf.io/network-status", false},
		{"no such interface", []string{migPath, migJSON, migSrcPath, sourcePod(migVMIOwner, sourceStatus("10.1.2.3")[:1]...)}, ErrMigrationSource,
			"network-status has no interface " + migIfName, false},
		{"bad address", []string{migPath, migJSON, migSrcPath, sourcePod(migVMIOwner, sourceStatus("10.1.2.300")...)}, ErrMigrationSource,
			`interface ` + migIfName + `: "10.1.2.300" is not an IP address`, false},
		{"outside the network", []string{migPath, migJSON, migSrcPath, sourcePod(migVMIOwner, sourceStatus("10.9.0.3")...)}, ErrMigrationSource,
			"address 10.9.0.3 of interface " + migIfName + " in the source pod virt-launcher-vm1-src (VirtualMachineInstanceMigration ns1/mig1) is in none of this network's IPAM subnets (10.1.2.0/24)", true},
		{"too many", []string{migPath, migJSON, migSrcPath, sourcePod(migVMIOwner, sourceStatus(nine...)...)}, ErrMigrationSource,
			"make 9; a port allows at most 8", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := fakeIPAM(t, "10.1.2.9/24")
			api := newFakeAPI(t, migrationTarget(true), append([]string{migVMIPath, migVMIJSON}, tc.objects...)...)
			e := newEnv(t)
			e.allocate("c0-s0")
			err := CmdAdd(cmdArgs(cid, migIfName, e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q,"ipam":{"type":"fake-ipam"}`, api.kubeconfig))))
			if te := cniErr(t, err); te.Code != tc.code || !strings.Contains(te.Msg, tc.msg) {
				t.Errorf("code %d %q, want %d naming %q", te.Code, err, tc.code, tc.msg)
			}
			if n := len(e.ports()); n != 0 {
				t.Errorf("%d ports", n)
			}
			want := ""
			if tc.ipamAdded {
				want = "ADD DEL"
			}
			if c := ipamCalls(calls); c != want {
				t.Errorf("IPAM calls %q, want %q", c, want)
			}
		})
	}
}

// The bound is the agent's.
func TestMaxPortAddresses(t *testing.T) {
	if maxPortAddresses != config.MaxIPs {
		t.Errorf("maxPortAddresses %d, the agent's bound %d", maxPortAddresses, config.MaxIPs)
	}
}
