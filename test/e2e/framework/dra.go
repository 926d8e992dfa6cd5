//go:build e2e

package framework

import (
	"context"
	"slices"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// The DRA side: what the API server publishes (ResourceSlices, claims) and
// what the node agent holds (reservations), as small values for Eventually.

// NADResource is Multus' NetworkAttachmentDefinitions, for a dynamic
// client (the repository has no typed client of them).
var NADResource = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}

// SliceDevices lists the devices of driver's ResourceSlices of node.
func (f *Framework) SliceDevices(ctx context.Context, driver, node string) ([]resourcev1.Device, error) {
	l, err := f.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var devs []resourcev1.Device
	for _, s := range l.Items {
		if s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			devs = append(devs, s.Spec.Devices...)
		}
	}
	return devs, nil
}

// SliceNames observes the sorted device names of driver's slices of node.
func (f *Framework) SliceNames(ctx context.Context, driver, node string) func() ([]string, error) {
	return func() ([]string, error) {
		devs, err := f.SliceDevices(ctx, driver, node)
		if err != nil {
			return nil, err
		}
		names := []string{}
		for _, d := range devs {
			names = append(names, d.Name)
		}
		slices.Sort(names)
		return names, nil
	}
}

// Held is the agent's reserved slots: slot ID -> the reservation holding
// it ("alloc/..." for the device plugin's allocations, "claim/<uid>" for
// DRA claims).
func Held(ctx context.Context, agent agentv1.AgentClient) (map[string]string, error) {
	c, err := agent.GetCapacity(ctx, &agentv1.GetCapacityRequest{})
	if err != nil {
		return nil, err
	}
	held := map[string]string{}
	for _, cpu := range c.GetCpus() {
		for _, s := range cpu.GetSlots() {
			if s.GetReservedBy() != "" {
				held[s.GetId()] = s.GetReservedBy()
			}
		}
	}
	return held, nil
}

// HeldBy is the sorted, comma-separated slots the reservation owner holds
// ("" when none).
func HeldBy(held map[string]string, owner string) string {
	var ids []string
	for id, o := range held {
		if o == owner {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return strings.Join(ids, ",")
}

// ObserveHeld observes Held.
func ObserveHeld(ctx context.Context, agent agentv1.AgentClient) func() (map[string]string, error) {
	return func() (map[string]string, error) { return Held(ctx, agent) }
}

// PortsOfPod lists the agent's ports whose k8s.pod.name label is pod.
func PortsOfPod(ctx context.Context, agent agentv1.AgentClient, pod string) ([]*agentv1.Port, error) {
	l, err := agent.ListPorts(ctx, &agentv1.ListPortsRequest{})
	if err != nil {
		return nil, err
	}
	var ports []*agentv1.Port
	for _, p := range l.GetPorts() {
		if p.GetSpec().GetLabels()["k8s.pod.name"] == pod {
			ports = append(ports, p)
		}
	}
	return ports, nil
}

// ClaimOf is the name of the ResourceClaim a pod's claim entry got from
// its template ("" until the controller made it).
func (f *Framework) ClaimOf(ctx context.Context, ns, pod, entry string) (string, error) {
	p, err := f.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == entry && s.ResourceClaimName != nil {
			return *s.ResourceClaimName, nil
		}
	}
	return "", nil
}

// SortedCSV sorts a comma-separated list (empty items dropped).
func SortedCSV(s string) string {
	ids := slices.DeleteFunc(strings.Split(s, ","), func(x string) bool { return x == "" })
	slices.Sort(ids)
	return strings.Join(ids, ",")
}

// PortIDs observes the IDs of the node agent's ports.
func PortIDs(ctx context.Context, agent agentv1.AgentClient) func() ([]string, error) {
	return func() ([]string, error) {
		l, err := agent.ListPorts(ctx, &agentv1.ListPortsRequest{})
		if err != nil {
			return nil, err
		}
		ids := []string{}
		for _, p := range l.GetPorts() {
			ids = append(ids, p.GetSpec().GetId())
		}
		return ids, nil
	}
}
