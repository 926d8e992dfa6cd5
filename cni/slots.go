package cni

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/plugin"
)

// How one pod's queue pairs are shared between its vhostmq interfaces.
//
// The pod's devices of ResourceName (one container's, as kubelet gave
// them to one Allocate call) are sorted: S = s0 < s1 < ... < sN-1. Multus
// hands the k-th vhostmq network of the pod the device S[k] (it sorts the
// IDs the same way and takes one per network), so k is the index of
// deviceID in S. With q queue pairs per interface (vhostmq.io/queues, else
// the network's queuePairs, else N), interface k serves S[k*q : k*q+q].
// One network takes the whole allocation by default; a pod with two
// networks on 8 queue pairs says vhostmq.io/queues: "4" (the KubeVirt
// webhook does) and gets S[0:4] and S[4:8]. When the plugin can count the
// pod's vhostmq networks k (it reads the pod) and N == k < k*q, as when no
// webhook raised KubeVirt's one unit per network, interface k keeps S[k]
// alone and its q queue pairs share that slot's CPU. Otherwise an
// interface whose range runs past N fails with an error that says so.

// slotSet is the pod's allocation and this interface's index in it.
type slotSet struct {
	all   []string // sorted
	index int      // of this interface (Multus' network index)
	dir   string   // allocation directory under the socket root
	// A DRA claim's: the agent reservation the port names, the socket's
	// file name and the directory the container sees it in (else
	// <ifname>.sock in containerSocketDir, the device plugin's).
	reservation, socket, ctrDir string
}

// split returns the slots of interface s.index with q queue pairs each;
// from names where q came from, for the error. networks is the pod's
// number of vhostmq networks, 0 if unknown.
func (s *slotSet) split(q uint32, from string, networks int) ([]string, error) {
	n := len(s.all)
	start := s.index * int(q)
	if start+int(q) <= n && (networks == 0 || networks*int(q) <= n) {
		return s.all[start : start+int(q)], nil
	}
	if networks > 0 && n == networks && s.index < n {
		// Exactly one slot per network: KubeVirt asked one per network and
		// no webhook raised it. Each network keeps its own slot and its q
		// queue pairs share that slot's CPU. Any other shortfall is an
		// error: q is at most what the pod was given.
		return s.all[s.index : s.index+1], nil
	}
	if networks > 1 {
		return nil, types.NewError(ErrNoAllocation,
			fmt.Sprintf("%d vhostmq networks × %d queue pairs (from %s) need %d queue slots, the pod has %d allocated (%s)", networks, q, from, networks*int(q), n, strings.Join(s.all, ",")),
			fmt.Sprintf("request %d %s (the vhostmq webhook does) or lower %s", networks*int(q), DefaultResourceName, from))
	}
	if s.index == 0 {
		return nil, types.NewError(ErrNoAllocation,
			fmt.Sprintf("%s asks for %d queue pairs, the pod has %d allocated (%s)", from, q, n, strings.Join(s.all, ",")),
			fmt.Sprintf("request %d %s or lower %s", q, DefaultResourceName, from))
	}
	return nil, types.NewError(ErrNoAllocation,
		fmt.Sprintf("interface %d of the pod needs queue slots %d..%d (%d queue pairs each, from %s), the pod has %d allocated (%s)", s.index, start, start+int(q)-1, q, from, n, strings.Join(s.all, ",")),
		fmt.Sprintf("request %d %s in total or lower the pod annotation %s", int(q)*(s.index+1), DefaultResourceName, AnnotationQueues))
}

// findSlots finds the pod's allocation: from the kubelet's pod-resources
// API when it answers, else from the allocation record holding deviceID.
func findSlots(conf *NetConf, pod podArgs) (*slotSet, error) {
	devices, err := podDevices(conf.PodResourcesSocket, conf.ResourceName, pod)
	switch {
	case err == nil && len(devices) > 0:
		return fromPodResources(conf, devices)
	case err != nil && !errors.Is(err, errNoPodResources):
		return nil, types.NewError(types.ErrTryAgainLater, "asking the kubelet for the pod's "+conf.ResourceName+" devices", err.Error())
	}
	// Without pod-resources (or without an answer for this pod): the
	// device plugin's record of the allocation that holds deviceID, else
	// a DRA claim prepared for the pod.
	if conf.device == "" {
		if set, err := fromClaim(conf, pod); set != nil || err != nil {
			return set, err
		}
		return nil, types.NewError(ErrNoDevice, fmt.Sprintf("no %s device allocated to this pod", conf.ResourceName),
			"the pod must request "+conf.ResourceName+" and the NetworkAttachmentDefinition carry the annotation k8s.v1.cni.cncf.io/resourceName: "+conf.ResourceName+" so that Multus passes deviceID")
	}
	alloc, err := findAllocation(conf.SocketRoot, conf.device)
	if err != nil {
		return nil, types.NewError(types.ErrIOFailure, "finding the allocation of device "+conf.device, err.Error())
	}
	if alloc == nil {
		return nil, noAllocation(conf)
	}
	return &slotSet{all: alloc.slots, index: slices.Index(alloc.slots, conf.device), dir: alloc.dir}, nil
}

func noAllocation(conf *NetConf) error {
	return types.NewError(ErrNoAllocation, fmt.Sprintf("device %q: no allocation under socketRoot %s", conf.device, conf.SocketRoot),
		"the device plugin writes .qp-<hash>.slots there; check that socketRoot matches its --socket-root")
}

// fromPodResources picks the container whose devices hold deviceID (or
// the only container with devices) and checks the device plugin made
// its allocation directory.
func fromPodResources(conf *NetConf, devices map[string][]string) (*slotSet, error) {
	var ids []string
	if conf.device != "" {
		for _, d := range devices {
			if slices.Contains(d, conf.device) {
				ids = d
			}
		}
		if ids == nil {
			return nil, types.NewError(ErrNoAllocation, fmt.Sprintf("deviceID %q is not one of the pod's %s devices", conf.device, conf.ResourceName), "")
		}
	} else {
		if len(devices) > 1 {
			names := make([]string, 0, len(devices))
			for c := range devices {
				names = append(names, c)
			}
			slices.Sort(names)
			return nil, types.NewError(ErrNoDevice, fmt.Sprintf("containers %s all have %s devices and no deviceID says which to use", strings.Join(names, ", "), conf.ResourceName), "")
		}
		for _, d := range devices {
			ids = d
		}
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	dir := plugin.AllocationDir(ids)
	if _, err := os.Stat(filepath.Join(conf.SocketRoot, dir)); err != nil {
		return nil, types.NewError(ErrNoAllocation, fmt.Sprintf("the allocation directory of devices %s is missing under socketRoot %s", strings.Join(ids, ","), conf.SocketRoot), err.Error())
	}
	index := 0
	if conf.device != "" {
		index = slices.Index(ids, conf.device)
	}
	return &slotSet{all: ids, index: index, dir: dir}, nil
}

var errNoPodResources = errors.New("pod-resources API not available")

// podDevices asks the kubelet's pod-resources API for the pod's devices of
// resource, per container. errNoPodResources: no socket, or no pod named.
func podDevices(socket, resource string, pod podArgs) (map[string][]string, error) {
	if pod.Name == "" || pod.Namespace == "" {
		return nil, errNoPodResources
	}
	if _, err := os.Stat(socket); err != nil {
		return nil, errNoPodResources
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	client := podresourcesapi.NewPodResourcesListerClient(conn)
	var pr []*podresourcesapi.PodResources
	// Get answers for one pod; kubelets without it (feature gate off)
	// answer Unimplemented, and List does.
	got, err := client.Get(ctx, &podresourcesapi.GetPodResourcesRequest{PodName: pod.Name, PodNamespace: pod.Namespace})
	switch status.Code(err) {
	case codes.OK:
		pr = append(pr, got.GetPodResources())
	case codes.Unimplemented, codes.NotFound, codes.Unknown:
		list, err := client.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
		if err != nil {
			return nil, fmt.Errorf("pod-resources List: %w", err)
		}
		pr = list.GetPodResources()
	default:
		return nil, fmt.Errorf("pod-resources Get: %w", err)
	}
	out := map[string][]string{}
	for _, p := range pr {
		if p.GetName() != pod.Name || p.GetNamespace() != pod.Namespace {
			continue
		}
		for _, c := range p.GetContainers() {
			if ids := plugin.ContainerDevices(c, resource); len(ids) > 0 {
				out[c.GetName()] = append(out[c.GetName()], ids...)
			}
		}
	}
	return out, nil
}

// fromClaim finds the pod's prepared DRA claim (queues.vhostmq.io): the
// agent's reservation for the pod, and the record the DRA driver wrote
// beside the claim's directory. nil, nil if the pod has none. One claim
// is one interface; a pod with several is refused, naming them.
func fromClaim(conf *NetConf, pod podArgs) (*slotSet, error) {
	if pod.UID == "" {
		return nil, nil
	}
	client, closeConn, err := dial(conf.AgentSocket)
	if err != nil {
		return nil, agentError("finding the pod's DRA claim", err)
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	l, err := client.ListReservations(ctx, &agentv1.ListReservationsRequest{Pod: pod.UID})
	if err != nil {
		return nil, agentError("finding the pod's DRA claim", err)
	}
	var claims []*agentv1.Reservation
	for _, r := range l.GetReservations() {
		if strings.HasPrefix(r.GetOwner(), agentv1.OwnerClaim) {
			claims = append(claims, r)
		}
	}
	switch {
	case len(claims) == 0:
		return nil, nil
	case len(claims) > 1:
		owners := make([]string, len(claims))
		for i, c := range claims {
			owners[i] = c.GetOwner()
		}
		return nil, types.NewError(ErrNoAllocation, fmt.Sprintf("the pod has %d vhostmq claims (%s); one interface per pod is served from DRA claims", len(claims), strings.Join(owners, ", ")), "")
	}
	uid := strings.TrimPrefix(claims[0].GetOwner(), agentv1.OwnerClaim)
	rec, err := plugin.ReadClaimRecord(conf.SocketRoot, uid)
	if err != nil {
		return nil, types.NewError(ErrNoAllocation, fmt.Sprintf("claim %s of the pod: no record under socketRoot %s", uid, conf.SocketRoot),
			err.Error()+" (the DRA driver writes it when it prepares the claim; check that socketRoot matches its --socket-root)")
	}
	all := slices.Clone(claims[0].GetSlots())
	slices.Sort(all)
	return &slotSet{all: all, dir: plugin.ClaimDir(uid), reservation: claims[0].GetOwner(), socket: plugin.ClaimSocketName, ctrDir: rec.ContainerDir}, nil
}
