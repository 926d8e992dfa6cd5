package cni

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vhostmq/vhostmq/plugin"
	"github.com/vhostmq/vhostmq/plugin/dra"
)

// prepareClaim prepares a DRA claim of slots for the pod uid-1 (the pod
// of cmdArgs) with the real DRA driver.
func (e *env) prepareClaim(uid, podClaim string, slots ...string) {
	e.t.Helper()
	d, err := dra.New(dra.Config{Agent: e.Client, NodeName: "node1", SocketRoot: e.SocketRoot, CDIDir: filepath.Join(e.Dir, "cdi"),
		SocketUID: os.Getuid(), SocketGID: os.Getgid()})
	if err != nil {
		e.t.Fatal(err)
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "vm1-" + podClaim, UID: types.UID(uid),
		Annotations: map[string]string{resourceapi.PodResourceClaimAnnotation: podClaim}}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, s := range slots {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "queues", Driver: dra.DriverName, Pool: "node1", Device: s})
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vm1-launcher", UID: "uid-1"}}
	out, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || out[c.UID].Err != nil {
		e.t.Fatalf("preparing claim %s: %v %v", uid, err, out[c.UID].Err)
	}
}

// TestAddFromDRAClaim: a pod without a device plugin allocation but with a
// prepared DRA claim gets its port on exactly the claim's slots, naming
// the claim's reservation, with the socket where the claim's metadata says
// the container finds it; a second claim for the pod is refused, naming
// both.
func TestAddFromDRAClaim(t *testing.T) {
	e := newEnv(t)
	e.prepareClaim("claim-uid-1", "nic", "c0-s1", "c0-s2")
	args := cmdArgs(cid, "net1", e.conf(""))
	res := mustAdd(t, args)
	ports := e.ports()
	if len(ports) != 1 {
		t.Fatalf("%d ports, want 1", len(ports))
	}
	s := ports[0].Spec
	host := filepath.Join(e.SocketRoot, plugin.ClaimDir("claim-uid-1"), plugin.ClaimSocketName)
	if s.SocketPath != host || strings.Join(s.Slots, ",") != "c0-s1,c0-s2" || s.QueuePairs != 2 || s.Reservation != "claim/claim-uid-1" {
		t.Errorf("port spec %v", s)
	}
	if len(res.Interfaces) != 1 || res.Interfaces[0].SocketPath != "/var/run/vhostmq/nic/"+plugin.ClaimSocketName {
		t.Errorf("result interfaces %+v, want the socket at /var/run/vhostmq/nic/%s", res.Interfaces, plugin.ClaimSocketName)
	}
	if err := CmdDel(args); err != nil {
		t.Fatal(err)
	}
	if n := len(e.ports()); n != 0 {
		t.Fatalf("%d ports after DEL", n)
	}

	e.prepareClaim("claim-uid-2", "nic2", "c0-s3")
	conf, _ := loadConf(e.conf(""))
	_, err := add(args, conf)
	if te := cniErr(t, err); te.Code != ErrNoAllocation || !strings.Contains(te.Msg, "claim/claim-uid-1, claim/claim-uid-2") {
		t.Errorf("a pod with two claims: %v", err)
	}
	if n := len(e.ports()); n != 0 {
		t.Errorf("%d ports made for a refused ADD", n)
	}
}
