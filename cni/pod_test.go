package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/vhostmq/vhostmq/cni/kubevirt/vmi"
	"github.com/vhostmq/vhostmq/dataplane/agent/agenttest"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// apiServer serves one pod the way kube-apiserver does, for client-go.
// The real API server is exercised by hack/cluster/test-cni.sh.
func apiServer(t *testing.T, pod *corev1.Pod, objects ...string) (kubeconfig string, gets *atomic.Int32) {
	t.Helper()
	f := newFakeAPI(t, pod, objects...)
	return f.kubeconfig, f.gets
}

// fakeAPI is apiServer's server: gets counts the reads of the pod,
// requested lists every path asked for.
type fakeAPI struct {
	kubeconfig string
	gets       *atomic.Int32
	mu         sync.Mutex
	paths      []string
}

func (f *fakeAPI) requested() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.paths)
}

func newFakeAPI(t *testing.T, pod *corev1.Pod, objects ...string) *fakeAPI {
	t.Helper()
	f := &fakeAPI{gets: &atomic.Int32{}}
	// objects: URL path, JSON, URL path, JSON, ...
	byPath := map[string]string{}
	for i := 0; i+1 < len(objects); i += 2 {
		byPath[objects[i]] = objects[i+1]
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.paths = append(f.paths, r.URL.Path)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if o, ok := byPath[r.URL.Path]; ok {
			fmt.Fprint(w, o)
			return
		}
		if r.URL.Path != fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", pod.Namespace, pod.Name) {
			w.WriteHeader(http.StatusNotFound)
			json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: "Failure", Reason: metav1.StatusReasonNotFound, Code: 404, Message: "pods not found"})
			return
		}
		f.gets.Add(1)
		pod.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
		json.NewEncoder(w).Encode(pod)
	}))
	t.Cleanup(srv.Close)
	f.kubeconfig = filepath.Join(t.TempDir(), "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, srv.URL)
	if err := os.WriteFile(f.kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func launcherPod(annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "vm1-launcher", UID: "uid-1", Annotations: annotations}}
}

func TestAnnotationsTuneThePort(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0", "c0-s1", "c0-s2", "c0-s3")
	kc, gets := apiServer(t, launcherPod(map[string]string{
		AnnotationQueues: "2", AnnotationSocketMode: "client", AnnotationPolling: "busy", "other.io/x": "y"}))
	conf := e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q,"socketMode":"server","polling":"interrupt","queuePairs":4`, kc))
	mustAdd(t, cmdArgs(cid, "net1", conf))
	if gets.Load() == 0 {
		t.Fatal("the pod was not read")
	}
	s := e.ports()[0].Spec
	// Annotations override the network configuration.
	if s.QueuePairs != 2 || strings.Join(s.Slots, ",") != "c0-s0,c0-s1" || s.Role != agentv1.Role_ROLE_SERVER || s.Polling != agentv1.PollingMode_POLLING_BUSY {
		t.Errorf("spec %v", s)
	}
	if err := CmdCheck(cmdArgs(cid, "net1", conf)); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// The second vhostmq network of the pod: Multus passes the second
	// sorted device; it gets the next two slots.
	conf2 := []byte(strings.Replace(string(conf), `"deviceID":"c0-s0"`, `"deviceID":"c0-s1"`, 1))
	mustAdd(t, cmdArgs(cid, "net2", conf2))
	p, err := e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: PortID(cid, "net2")})
	if err != nil || strings.Join(p.Spec.Slots, ",") != "c0-s2,c0-s3" {
		t.Errorf("second network: %v %v", p, err)
	}
	// A third one would run past the allocation.
	conf3 := []byte(strings.Replace(string(conf), `"deviceID":"c0-s0"`, `"deviceID":"c0-s2"`, 1))
	err = CmdAdd(cmdArgs(cid, "net3", conf3))
	if te := cniErr(t, err); te.Code != ErrNoAllocation || !strings.Contains(te.Msg, "interface 2 of the pod needs queue slots 4..5") {
		t.Errorf("third network: %v", err)
	}
}

// vhostmq.io/port-security overrides the network's portSecurity, both ways;
// turning it off needs the NAD's portSecurityOptOut.
func TestPortSecurityAnnotation(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0")
	e.allocate("c0-s1")
	e.allocate("c0-s2")
	kc, _ := apiServer(t, launcherPod(map[string]string{AnnotationPortSecurity: "false"}))
	err := CmdAdd(cmdArgs(cid, "net3", e.conf(fmt.Sprintf(`,"deviceID":"c0-s2","kubeconfig":%q`, kc))))
	if te := cniErr(t, err); te.Code != ErrBadAnnotation || !strings.Contains(te.Msg, "portSecurityOptOut: true") {
		t.Errorf("opt-out on a NAD that does not allow it: %v", err)
	}
	if ps := e.ports(); len(ps) != 0 {
		t.Errorf("the refused ADD left %d ports", len(ps))
	}
	for _, tc := range []struct {
		device, ifname, netconf, annotation string
		want                                bool
	}{
		{"c0-s0", "net1", `,"portSecurityOptOut":true`, "false", false},
		{"c0-s1", "net2", `,"portSecurity":false`, "true", true},
	} {
		kc, _ := apiServer(t, launcherPod(map[string]string{AnnotationPortSecurity: tc.annotation}))
		args := cmdArgs(cid, tc.ifname, e.conf(fmt.Sprintf(`,"deviceID":%q,"kubeconfig":%q%s`, tc.device, kc, tc.netconf)))
		mustAdd(t, args)
		p, err := e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: PortID(cid, tc.ifname)})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.PortSecurityOn() != tc.want {
			t.Errorf("network %q, annotation %q: port security on = %v, want %v", tc.netconf, tc.annotation, p.Spec.PortSecurityOn(), tc.want)
		}
		if err := CmdCheck(args); err != nil {
			t.Errorf("network %q, annotation %q: CHECK: %v", tc.netconf, tc.annotation, err)
		}
	}
}

func TestBadAnnotations(t *testing.T) {
	e := newEnv(t)
	e.allocate("c0-s0", "c0-s1")
	for _, tc := range []struct {
		key, value, msg string
	}{
		{AnnotationQueues, "0", `pod annotation vhostmq.io/queues: "0" is not a number of queue pairs in 1..128`},
		{AnnotationQueues, "four", `pod annotation vhostmq.io/queues: "four" is not`},
		{AnnotationQueues, "-1", `pod annotation vhostmq.io/queues: "-1" is not`},
		{AnnotationSocketMode, "both", `pod annotation vhostmq.io/socket-mode: "both" is not "server"`},
		{AnnotationPolling, "spin", `pod annotation vhostmq.io/polling: "spin" is not interrupt, adaptive or busy`},
		{AnnotationPolling, "", `pod annotation vhostmq.io/polling: "" is not`},
		{AnnotationPortSecurity, "off", `pod annotation vhostmq.io/port-security: "off" is not "true"`},
		{AnnotationPortSecurity, "True", `pod annotation vhostmq.io/port-security: "True" is not "true"`},
		{AnnotationPortSecurity, "", `pod annotation vhostmq.io/port-security: "" is not "true"`},
	} {
		kc, _ := apiServer(t, launcherPod(map[string]string{tc.key: tc.value}))
		err := CmdAdd(cmdArgs(cid, "net1", e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q`, kc))))
		if te := cniErr(t, err); te.Code != ErrBadAnnotation || !strings.Contains(te.Msg, tc.msg) {
			t.Errorf("%s=%q: %v", tc.key, tc.value, err)
		}
	}
	// More queues than allocated names the annotation.
	kc, _ := apiServer(t, launcherPod(map[string]string{AnnotationQueues: "3"}))
	err := CmdAdd(cmdArgs(cid, "net1", e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q`, kc))))
	if te := cniErr(t, err); te.Code != ErrNoAllocation || !strings.Contains(te.Msg, "pod annotation vhostmq.io/queues asks for 3 queue pairs, the pod has 2") {
		t.Errorf("too many queues: %v", err)
	}
	// A pod the API server does not know, and a replaced pod.
	kc, _ = apiServer(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "other"}})
	err = CmdAdd(cmdArgs(cid, "net1", e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q`, kc))))
	if te := cniErr(t, err); te.Code != ErrPodLookup || !strings.Contains(te.Msg, "reading pod ns1/vm1-launcher") {
		t.Errorf("unknown pod: %v", err)
	}
	replaced := launcherPod(nil)
	replaced.UID = "uid-2"
	kc, _ = apiServer(t, replaced)
	err = CmdAdd(cmdArgs(cid, "net1", e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q`, kc))))
	if te := cniErr(t, err); te.Code != ErrPodLookup || !strings.Contains(te.Msg, "the pod was replaced") {
		t.Errorf("replaced pod: %v", err)
	}
	// An API server that does not answer: try again later.
	err = CmdAdd(cmdArgs(cid, "net1", e.conf(fmt.Sprintf(`,"deviceID":"c0-s0","kubeconfig":%q`, writeKubeconfig(t, "https://127.0.0.1:1")))))
	if te := cniErr(t, err); te.Code != types.ErrTryAgainLater {
		t.Errorf("API server down: %v", err)
	}
	if n := len(e.ports()); n != 0 {
		t.Errorf("%d ports left by bad annotations", n)
	}
}

func writeKubeconfig(t *testing.T, server string) string {
	p := filepath.Join(t.TempDir(), "kc")
	os.WriteFile(p, []byte(fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", server)), 0o600)
	return p
}

// kubelet serves the pod-resources API (List, and Get unless getMissing)
// over a unix socket, as the kubelet does.
type kubelet struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	pods       []*podresourcesapi.PodResources
	getMissing bool
	lists      atomic.Int32
}

func (k *kubelet) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	k.lists.Add(1)
	return &podresourcesapi.ListPodResourcesResponse{PodResources: k.pods}, nil
}

func (k *kubelet) Get(_ context.Context, r *podresourcesapi.GetPodResourcesRequest) (*podresourcesapi.GetPodResourcesResponse, error) {
	if k.getMissing {
		return nil, status.Error(codes.Unimplemented, "feature gate KubeletPodResourcesGet is off")
	}
	for _, p := range k.pods {
		if p.Name == r.PodName && p.Namespace == r.PodNamespace {
			return &podresourcesapi.GetPodResourcesResponse{PodResources: p}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s/%s not found", r.PodNamespace, r.PodName)
}

func serveKubelet(t *testing.T, socket string, k *kubelet) {
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, k)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
}

func devices(container string, ids ...string) *podresourcesapi.ContainerResources {
	c := &podresourcesapi.ContainerResources{Name: container}
	for _, id := range ids {
		// one entry per device, as the kubelet lists devices with topology
		c.Devices = append(c.Devices, &podresourcesapi.ContainerDevices{ResourceName: DefaultResourceName, DeviceIds: []string{id}})
	}
	return c
}

func TestSlotsFromPodResources(t *testing.T) {
	for _, getMissing := range []bool{false, true} {
		t.Run(fmt.Sprintf("getMissing=%v", getMissing), func(t *testing.T) {
			e := newEnv(t)
			host := e.allocate("c0-s3", "c0-s1", "c0-s2")
			// No .slots record: only the kubelet knows the set.
			os.Remove(filepath.Join(e.SocketRoot, "."+filepath.Base(host)+".slots"))
			k := &kubelet{getMissing: getMissing, pods: []*podresourcesapi.PodResources{
				{Name: "other", Namespace: "ns1", Containers: []*podresourcesapi.ContainerResources{devices("compute", "c0-s0")}},
				{Name: "vm1-launcher", Namespace: "ns1", Containers: []*podresourcesapi.ContainerResources{
					{Name: "sidecar"}, devices("compute", "c0-s3", "c0-s1", "c0-s2")}},
			}}
			serveKubelet(t, filepath.Join(e.Dir, "pod-resources.sock"), k)
			// No deviceID at all (a NAD without resourceName): the pod's
			// only container with devices gives the set.
			mustAdd(t, cmdArgs(cid, "net1", e.conf("")))
			s := e.ports()[0].Spec
			if strings.Join(s.Slots, ",") != "c0-s1,c0-s2,c0-s3" || s.SocketPath != filepath.Join(host, "net1.sock") {
				t.Errorf("spec %v", s)
			}
			if getMissing != (k.lists.Load() > 0) {
				t.Errorf("List called %d times with Get missing=%v", k.lists.Load(), getMissing)
			}
			// A deviceID that is not the pod's is refused.
			err := CmdAdd(cmdArgs(cid, "net2", e.conf(`,"deviceID":"c0-s0"`)))
			if te := cniErr(t, err); te.Code != ErrNoAllocation || !strings.Contains(te.Msg, `deviceID "c0-s0" is not one of the pod's`) {
				t.Errorf("foreign deviceID: %v", err)
			}
		})
	}
}

func TestNoDevicesAnywhere(t *testing.T) {
	e := newEnv(t)
	serveKubelet(t, filepath.Join(e.Dir, "pod-resources.sock"), &kubelet{pods: []*podresourcesapi.PodResources{
		{Name: "vm1-launcher", Namespace: "ns1", Containers: []*podresourcesapi.ContainerResources{{Name: "compute"}}}}})
	err := CmdAdd(cmdArgs(cid, "net1", e.conf("")))
	if te := cniErr(t, err); te.Code != ErrNoDevice || !strings.Contains(te.Msg, "no vhostmq.io/queue-pairs device allocated to this pod") {
		t.Errorf("no devices: %v", err)
	}
	if n := len(e.ports()); n != 0 {
		t.Errorf("%d ports", n)
	}
}

// A virt-launcher pod without the webhook: KubeVirt asked one unit per
// network, the VMI has 4 vCPUs and multiqueue. Each network keeps its own
// slot and gets 4 queue pairs sharing it; with 8 slots (the webhook's
// request) each gets 4 slots of its own.
func TestLauncherPodQueuesFromVMI(t *testing.T) {
	nad := func(name, res string) (string, string) {
		return "/apis/k8s.cni.cncf.io/v1/namespaces/ns1/network-attachment-definitions/" + name,
			fmt.Sprintf(`{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{"name":%q,"namespace":"ns1","annotations":{"k8s.v1.cni.cncf.io/resourceName":%q}},"spec":{"config":"{}"}}`, name, res)
	}
	p1, n1 := nad("vhu-a", DefaultResourceName)
	p2, n2 := nad("vhu-b", DefaultResourceName)
	p3, n3 := nad("br", "")
	vmiPath := "/apis/kubevirt.io/v1/namespaces/ns1/virtualmachineinstances/vm1"
	vmiJSON := `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"vm1","namespace":"ns1"},"spec":{"domain":{"cpu":{"cores":4},"devices":{"networkInterfaceMultiqueue":true}}}}`
	pod := launcherPod(map[string]string{"k8s.v1.cni.cncf.io/networks": "vhu-a,br,vhu-b"})
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: "vm1", UID: "x"}}
	kc, _ := apiServer(t, pod, p1, n1, p2, n2, p3, n3, vmiPath, vmiJSON)

	for _, tc := range []struct {
		slots      []string
		net1, net2 string
	}{
		{[]string{"c0-s0", "c0-s1"}, "c0-s0", "c0-s1"},
		{[]string{"c0-s0", "c0-s1", "c0-s2", "c0-s3", "c0-s4", "c0-s5", "c0-s6", "c0-s7"}, "c0-s0,c0-s1,c0-s2,c0-s3", "c0-s4,c0-s5,c0-s6,c0-s7"},
	} {
		e := &env{Node: agenttest.Start(t, "", 8), t: t}
		e.allocate(tc.slots...)
		base := e.conf(fmt.Sprintf(`,"kubeconfig":%q,"deviceID":%q`, kc, tc.slots[0]))
		mustAdd(t, cmdArgs(cid, "net1", base))
		second := []byte(strings.Replace(string(base), `"deviceID":"`+tc.slots[0]+`"`, `"deviceID":"`+tc.slots[1]+`"`, 1))
		mustAdd(t, cmdArgs(cid, "net2", second))
		for ifname, want := range map[string]string{"net1": tc.net1, "net2": tc.net2} {
			p, err := e.Client.GetPort(context.Background(), &agentv1.GetPortRequest{Id: PortID(cid, ifname)})
			if err != nil || p.Spec.QueuePairs != 4 || strings.Join(p.Spec.Slots, ",") != want || len(p.Status.Queues) != 4 {
				t.Errorf("%d slots, %s: %v %v, want 4 pairs on %s", len(tc.slots), ifname, p, err, want)
			}
		}
		if err := CmdCheck(cmdArgs(cid, "net2", second)); err != nil {
			t.Errorf("CHECK: %v", err)
		}
	}
	// Three slots for two networks of four pairs: neither one per network
	// nor enough; an error, not a quietly smaller port.
	e := &env{Node: agenttest.Start(t, "", 8), t: t}
	e.allocate("c0-s0", "c0-s1", "c0-s2")
	err := CmdAdd(cmdArgs(cid, "net1", e.conf(fmt.Sprintf(`,"kubeconfig":%q,"deviceID":"c0-s0"`, kc))))
	if te := cniErr(t, err); te.Code != ErrNoAllocation || !strings.Contains(te.Msg, "2 vhostmq networks × 4 queue pairs (from VirtualMachineInstance vm1) need 8 queue slots, the pod has 3") {
		t.Errorf("3 slots: %v", err)
	}
}

// The port of a VM's NIC gets the MAC the binding sidecar gives the guest
// (KubeVirt passes the CNI no MAC unless the VMI sets one).
func TestLauncherPodMACMatchesTheSidecar(t *testing.T) {
	vmiJSON := `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"vm1","namespace":"ns1","uid":"0b7c-uid"},
	 "spec":{"domain":{"devices":{"interfaces":[{"name":"fast","binding":{"name":"vhostmq"}},{"name":"fixed","binding":{"name":"vhostmq"},"macAddress":"CA:FE:00:00:00:01"}]}},
	 "networks":[{"name":"fast","multus":{"networkName":"vhu-net"}},{"name":"fixed","multus":{"networkName":"vhu-net"}}]}}`
	pod := launcherPod(nil)
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: "vm1", UID: "x"}}
	kc, _ := apiServer(t, pod, "/apis/kubevirt.io/v1/namespaces/ns1/virtualmachineinstances/vm1", vmiJSON)
	v, err := vmi.Parse([]byte(vmiJSON))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.allocate("c0-s0", "c0-s1")
	for _, tc := range []struct{ network, want string }{{"fast", v.MAC("fast")}, {"fixed", "ca:fe:00:00:00:01"}} {
		ifname := vmi.PodInterfaceName(tc.network)
		dev := map[string]string{"fast": "c0-s0", "fixed": "c0-s1"}[tc.network]
		res := mustAdd(t, cmdArgs(cid, ifname, e.conf(fmt.Sprintf(`,"kubeconfig":%q,"deviceID":%q,"queuePairs":1`, kc, dev))))
		if res.Interfaces[0].Mac != tc.want {
			t.Errorf("%s (%s): MAC %s, want %s", tc.network, ifname, res.Interfaces[0].Mac, tc.want)
		}
	}
	if m := v.MAC("fast"); m == v.MAC("other") || m[1] != '2' && m[1] != '6' && m[1] != 'a' && m[1] != 'e' {
		t.Errorf("derived MAC %s: not per interface or not locally administered unicast", m)
	}
}
