package dra

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/vhostmq/vhostmq/dataplane/agent/agenttest"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/plugin"
)

func TestDevicesInterleaveCPUs(t *testing.T) {
	c := &agentv1.Capacity{Cpus: []*agentv1.CPU{
		{Id: 2, NumaNode: 0, Slots: []*agentv1.Slot{{Id: "c2-s0"}, {Id: "c2-s1"}}},
		{Id: 3, NumaNode: 1, Slots: []*agentv1.Slot{{Id: "c3-s0"}, {Id: "c3-s1"}, {Id: "c3-s2"}}},
		// the device plugin's: an allocation's, a port's without a claim
		{Id: 4, NumaNode: 1, Slots: []*agentv1.Slot{{Id: "c4-s0", ReservedBy: "alloc/qp-1"}, {Id: "c4-s1", PortId: "p1"},
			// a claim's, with and without its port: still offered
			{Id: "c4-s2", ReservedBy: "claim/u1", PortId: "p2"}}},
	}}
	var names []string
	for _, d := range Devices(c) {
		names = append(names, d.Name)
		cpu, numa := *d.Attributes[AttrCPU].IntValue, *d.Attributes[AttrNUMANode].IntValue
		if want := map[string]int64{"c2": 0, "c3": 1, "c4": 1}[d.Name[:2]]; numa != want || cpu != map[string]int64{"c2": 2, "c3": 3, "c4": 4}[d.Name[:2]] {
			t.Errorf("device %s: cpu %d numa %d", d.Name, cpu, numa)
		}
		if *d.Attributes[AttrSlot].StringValue != d.Name {
			t.Errorf("device %s: slot attribute %q", d.Name, *d.Attributes[AttrSlot].StringValue)
		}
	}
	if want := []string{"c2-s0", "c3-s0", "c2-s1", "c3-s1", "c3-s2", "c4-s2"}; !slices.Equal(names, want) {
		t.Errorf("devices %v, want %v (each CPU's first slot first, none the device plugin's)", names, want)
	}
}

type rig struct {
	node *agenttest.Node
	drv  *Driver
	cdi  string
}

func newRig(t *testing.T) *rig {
	node := agenttest.Start(t, "", 4) // one worker: c0-s0..c0-s3
	r := &rig{node: node, cdi: filepath.Join(node.Dir, "cdi")}
	var err error
	r.drv, err = New(Config{Agent: node.Client, NodeName: "node1", SocketRoot: node.SocketRoot, CDIDir: r.cdi,
		MTU: 1500, SocketUID: os.Getuid(), SocketGID: os.Getgid(), Logger: agenttest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func claim(uid, podClaim string, pod types.UID, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "vm-" + podClaim + "-x1", UID: types.UID(uid),
		Annotations: map[string]string{resourceapi.PodResourceClaimAnnotation: podClaim}}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "queues", Driver: DriverName, Pool: "node1", Device: d})
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vm", UID: pod}}
	return c
}

func (r *rig) prepare(t *testing.T, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	t.Helper()
	out, err := r.drv.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 {
		t.Fatalf("%d results for one claim", len(out))
	}
	return out[c.UID]
}

func (r *rig) reservations(t *testing.T, pod string) []*agentv1.Reservation {
	t.Helper()
	l, err := r.node.Client.ListReservations(context.Background(), &agentv1.ListReservationsRequest{Pod: pod})
	if err != nil {
		t.Fatal(err)
	}
	return l.Reservations
}

// TestPrepareUnprepare: a prepared claim holds exactly its allocated slots
// in the agent (for its pod), has its socket directory and a CDI spec
// mounting it where the metadata says the socket is; preparing again
// changes nothing; unpreparing leaves nothing, twice.
func TestPrepareUnprepare(t *testing.T) {
	r := newRig(t)
	c := claim("uid-1", "nic", "pod-1", "c0-s1", "c0-s2")
	kube := fake.NewClientset(c.DeepCopy())
	r.drv.cfg.Kube = kube
	res := r.prepare(t, c)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	const socket = "/var/run/vhostmq/nic/" + plugin.ClaimSocketName
	// the claim's device status: Ready, with the socket and the slots
	got, err := kube.ResourceV1().ResourceClaims("ns1").Get(context.Background(), c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 2 {
		t.Fatalf("status.devices %+v, want one per allocated device", got.Status.Devices)
	}
	for i, d := range got.Status.Devices {
		var sd StatusData
		if err := json.Unmarshal(d.Data.Raw, &sd); err != nil || sd.VhostUserPath != socket || !slices.Equal(sd.Slots, []string{"c0-s1", "c0-s2"}) ||
			d.Device != []string{"c0-s1", "c0-s2"}[i] || len(d.Conditions) != 1 || d.Conditions[0].Type != "Ready" || d.Conditions[0].Status != metav1.ConditionTrue {
			t.Errorf("status.devices[%d] %+v (data %s: %v)", i, d, d.Data.Raw, err)
		}
	}
	if len(res.Devices) != 2 || res.Devices[0].DeviceName != "c0-s1" || res.Devices[1].PoolName != "node1" {
		t.Fatalf("devices %+v", res.Devices)
	}
	if !slices.Equal(res.Devices[0].CDIDeviceIDs, []string{"vhostmq.io/queues=claim-uid-1"}) || len(res.Devices[1].CDIDeviceIDs) != 0 {
		t.Errorf("CDI devices %v / %v, want the claim's one on the first device only", res.Devices[0].CDIDeviceIDs, res.Devices[1].CDIDeviceIDs)
	}
	for _, d := range res.Devices {
		if p := d.Metadata.Attributes[AttrVhostUserPath].StringValue; p == nil || *p != socket {
			t.Errorf("device %s: metadata %s = %v, want %s", d.DeviceName, AttrVhostUserPath, p, socket)
		}
		if m := d.Metadata.Attributes[AttrMTU].IntValue; m == nil || *m != 1500 {
			t.Errorf("device %s: metadata mtu %v", d.DeviceName, m)
		}
	}
	rs := r.reservations(t, "pod-1")
	if len(rs) != 1 || rs[0].Owner != "claim/uid-1" || !slices.Equal(rs[0].Slots, []string{"c0-s1", "c0-s2"}) {
		t.Fatalf("agent reservations of pod-1: %v", rs)
	}
	host := filepath.Join(r.node.SocketRoot, plugin.ClaimDir("uid-1"))
	if fi, err := os.Stat(host); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o770 {
		t.Fatalf("socket directory %s: %v %v", host, fi, err)
	}
	b, err := os.ReadFile(filepath.Join(r.cdi, "vhostmq.io-queues_claim-uid-1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Kind != "vhostmq.io/queues" || len(spec.Devices) != 1 || spec.Devices[0].Name != "claim-uid-1" || spec.Version == "" {
		t.Fatalf("CDI spec %s", b)
	}
	edits := spec.Devices[0].ContainerEdits
	if len(edits.Mounts) != 1 || edits.Mounts[0].HostPath != host || edits.Mounts[0].ContainerPath != filepath.Dir(socket) {
		t.Errorf("CDI mounts %+v, want %s at %s", edits.Mounts, host, filepath.Dir(socket))
	}
	if !slices.Contains(edits.Env, plugin.EnvSlots+"=c0-s1,c0-s2") || !slices.Contains(edits.Env, EnvSocket+"="+socket) {
		t.Errorf("CDI env %v", edits.Env)
	}

	rec, err := plugin.ReadClaimRecord(r.node.SocketRoot, string(c.UID))
	if err != nil || rec.ContainerDir != filepath.Dir(socket) || !slices.Equal(rec.Slots, []string{"c0-s1", "c0-s2"}) || rec.Name != c.Name {
		t.Fatalf("the claim's record for the CNI: %+v %v", rec, err)
	}

	// The kubelet asks again (its restart): the same answer, nothing more.
	if again := r.prepare(t, c); again.Err != nil || len(again.Devices) != 2 {
		t.Fatalf("prepared again: %+v", again)
	}
	if rs := r.reservations(t, ""); len(rs) != 1 {
		t.Errorf("reservations after preparing twice: %v", rs)
	}

	// The CNI makes the claim's port: the next poll writes its network data.
	if got.Status.Devices[0].NetworkData != nil {
		t.Errorf("network data before the port exists: %+v", got.Status.Devices[0].NetworkData)
	}
	if _, err := r.node.Client.CreatePort(context.Background(), &agentv1.CreatePortRequest{Spec: &agentv1.PortSpec{
		Id: "p1", SocketPath: filepath.Join(host, plugin.ClaimSocketName), Role: agentv1.Role_ROLE_SERVER, QueuePairs: 2,
		Reservation: "claim/uid-1", Mac: "52:54:00:00:00:01", Labels: map[string]string{agentv1.LabelInterface: "net1"}}}); err != nil {
		t.Fatal(err)
	}
	r.drv.describePorts(context.Background())
	got, _ = kube.ResourceV1().ResourceClaims("ns1").Get(context.Background(), c.Name, metav1.GetOptions{})
	for i, d := range got.Status.Devices {
		if nd := d.NetworkData; nd == nil || nd.InterfaceName != "net1" || nd.HardwareAddress != "52:54:00:00:00:01" || len(d.Conditions) != 1 {
			t.Errorf("status.devices[%d] after the port: network data %+v, conditions %v", i, nd, d.Conditions)
		}
	}
	if len(r.drv.pending) != 0 {
		t.Errorf("claims still waiting for their port: %v", r.drv.pending)
	}
	if _, err := r.node.Client.DeletePort(context.Background(), &agentv1.DeletePortRequest{Id: "p1"}); err != nil {
		t.Fatal(err)
	}

	obj := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: "ns1", Name: c.Name}, UID: c.UID}
	for i := range 2 {
		out, err := r.drv.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{obj})
		if err != nil || out[c.UID] != nil {
			t.Fatalf("unprepare #%d: %v %v", i+1, err, out)
		}
	}
	if rs := r.reservations(t, ""); len(rs) != 0 {
		t.Errorf("reservations after unprepare: %v", rs)
	}
	for _, p := range []string{host, filepath.Join(r.cdi, "vhostmq.io-queues_claim-uid-1.json"), plugin.ClaimRecordFile(r.node.SocketRoot, string(c.UID))} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after unprepare (%v)", p, err)
		}
	}
}

// TestPrepareRefusals: a claim the agent cannot give its slots (taken by
// another claim, not a slot of this node), one from another node's pool, or
// not allocated fails alone, naming why, and leaves nothing behind; the
// other claims of the same call are prepared.
func TestPrepareRefusals(t *testing.T) {
	r := newRig(t)
	good := claim("uid-ok", "nic", "pod-1", "c0-s0")
	taken := claim("uid-taken", "nic", "pod-2", "c0-s0", "c0-s1")
	noSlot := claim("uid-noslot", "nic", "pod-3", "c9-s9")
	otherPool := claim("uid-pool", "nic", "pod-4", "c0-s3")
	otherPool.Status.Allocation.Devices.Results[0].Pool = "node2"
	unallocated := claim("uid-unalloc", "nic", "pod-5")
	unallocated.Status.Allocation = nil
	badName := claim("uid-name", "NIC_1", "pod-6", "c0-s2")
	out, err := r.drv.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{good, taken, noSlot, otherPool, unallocated, badName})
	if err != nil {
		t.Fatal(err)
	}
	if out[good.UID].Err != nil {
		t.Errorf("the good claim: %v", out[good.UID].Err)
	}
	for _, x := range []struct {
		c    *resourceapi.ResourceClaim
		want string
	}{
		{taken, `reserved by "claim/uid-ok"`},
		{noSlot, `no slot "c9-s9"`},
		{otherPool, `pool: "node2" is not this node's pool "node1"`},
		{unallocated, "status.allocation: not allocated"},
		{badName, `directory name "NIC_1"`},
	} {
		if err := out[x.c.UID].Err; err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("claim %s: %v, want an error with %q", x.c.UID, err, x.want)
		}
		if _, err := os.Stat(filepath.Join(r.node.SocketRoot, plugin.ClaimDir(string(x.c.UID)))); !os.IsNotExist(err) {
			t.Errorf("claim %s: socket directory left (%v)", x.c.UID, err)
		}
		if _, err := os.Stat(cdiSpecPath(r.cdi, cdiName(x.c.UID))); !os.IsNotExist(err) {
			t.Errorf("claim %s: CDI spec left (%v)", x.c.UID, err)
		}
	}
	if rs := r.reservations(t, ""); len(rs) != 1 || rs[0].Owner != "claim/uid-ok" {
		t.Errorf("reservations: %v, want only the good claim's", rs)
	}
	// A claim of another driver only is nothing to prepare.
	foreign := claim("uid-foreign", "gpu", "pod-7", "gpu-0")
	foreign.Status.Allocation.Devices.Results[0].Driver = "gpu.example.com"
	if res := r.prepare(t, foreign); res.Err != nil || len(res.Devices) != 0 {
		t.Errorf("another driver's claim: %+v", res)
	}
}

// TestPrepareRollsBack: when the CDI spec cannot be written, the claim's
// reservation and socket directory go again.
func TestPrepareRollsBack(t *testing.T) {
	r := newRig(t)
	if err := os.WriteFile(r.cdi, nil, 0o644); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	c := claim("uid-1", "nic", "pod-1", "c0-s0")
	if res := r.prepare(t, c); res.Err == nil || !strings.Contains(res.Err.Error(), "CDI spec") {
		t.Fatalf("prepare with an unwritable CDI directory: %+v", res)
	}
	if rs := r.reservations(t, ""); len(rs) != 0 {
		t.Errorf("reservation left: %v", rs)
	}
	if _, err := os.Stat(filepath.Join(r.node.SocketRoot, plugin.ClaimDir(string(c.UID)))); !os.IsNotExist(err) {
		t.Errorf("socket directory left (%v)", err)
	}
}

// TestDevicesPerNUMA: one shareable device per NUMA node, its capacity the
// node's slots the device plugin's side does not hold (a claim's count),
// 1..capacity per request; a node with none is left out.
func TestDevicesPerNUMA(t *testing.T) {
	c := &agentv1.Capacity{Cpus: []*agentv1.CPU{
		{Id: 0, NumaNode: 0, Slots: []*agentv1.Slot{{Id: "c0-s0"}, {Id: "c0-s1", ReservedBy: "claim/u1"}}},
		{Id: 1, NumaNode: 0, Slots: []*agentv1.Slot{{Id: "c1-s0", ReservedBy: "alloc/qp-1"}, {Id: "c1-s1", PortId: "p1"}, {Id: "c1-s2"}}},
		{Id: 2, NumaNode: 1, Slots: []*agentv1.Slot{{Id: "c2-s0", ReservedBy: "alloc/qp-2"}}},
	}}
	devs := DevicesPerNUMA(c)
	if len(devs) != 1 || devs[0].Name != "numa-0" {
		t.Fatalf("devices %+v, want numa-0 only (node 1 has nothing free)", devs)
	}
	d := devs[0]
	capa := d.Capacity[CapQueuePairs]
	if capa.Value.Value() != 3 || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Errorf("numa-0: capacity %s, allowMultipleAllocations %v; want 3 (c0-s0, c0-s1, c1-s2), true", capa.Value.String(), d.AllowMultipleAllocations)
	}
	if p := capa.RequestPolicy; p == nil || p.Default.Value() != 1 || p.ValidRange.Min.Value() != 1 || p.ValidRange.Max.Value() != 3 || p.ValidRange.Step.Value() != 1 {
		t.Errorf("numa-0: request policy %+v", p)
	}
	if *d.Attributes[AttrNUMANode].IntValue != 0 {
		t.Errorf("numa-0: numaNode %d", *d.Attributes[AttrNUMANode].IntValue)
	}
}

// TestPreparePerNUMA: a share of a NUMA node's device reserves the
// consumed count there (the agent picks the slots); a claim above what is
// free, or without its consumed capacity, fails naming why.
func TestPreparePerNUMA(t *testing.T) {
	r := newRig(t)
	share := func(uid string, pod types.UID, q string) *resourceapi.ResourceClaim {
		c := claim(uid, "nic", pod, "numa-0")
		res := &c.Status.Allocation.Devices.Results[0]
		res.ShareID = ptr.To(types.UID("share-" + uid))
		if q != "" {
			res.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{CapQueuePairs: resource.MustParse(q)}
		}
		return c
	}
	c := share("uid-1", "pod-1", "3")
	res := r.prepare(t, c)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	rs := r.reservations(t, "pod-1")
	if len(rs) != 1 || len(rs[0].Slots) != 3 || rs[0].NumaNode != 0 {
		t.Fatalf("reservations %v, want 3 slots on NUMA node 0", rs)
	}
	if len(res.Devices) != 1 || res.Devices[0].DeviceName != "numa-0" || res.Devices[0].ShareID == nil || *res.Devices[0].ShareID != "share-uid-1" {
		t.Fatalf("devices %+v", res.Devices)
	}
	if s := res.Devices[0].Metadata.Attributes[AttrSlots].StringValue; s == nil || *s != strings.Join(rs[0].Slots, ",") {
		t.Errorf("metadata slots %v, want %v", s, rs[0].Slots)
	}
	if again := r.prepare(t, c); again.Err != nil {
		t.Errorf("prepared again: %v", again.Err)
	}
	if e := r.prepare(t, share("uid-2", "pod-2", "2")).Err; e == nil || !strings.Contains(e.Error(), "2 slots on NUMA node 0") {
		t.Errorf("a share above the free slots: %v", e)
	}
	if e := r.prepare(t, share("uid-3", "pod-3", "")).Err; e == nil || !strings.Contains(e.Error(), "consumedCapacity") {
		t.Errorf("a share without consumed capacity: %v", e)
	}
	if rs := r.reservations(t, ""); len(rs) != 1 {
		t.Errorf("refused shares left reservations: %v", rs)
	}
}
