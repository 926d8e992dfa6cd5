// Package dra hands the node's queue slots out through Kubernetes Dynamic
// Resource Allocation (resource.k8s.io/v1): it publishes the slots as
// devices of a ResourceSlice and prepares the claims the scheduler
// allocated from them. The node agent stays the one owner of the slots:
// preparing a claim reserves its slots there ("claim/<uid>"), so the device
// plugin, which may run beside it, never hands them out too.
package dra

import (
	"cmp"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// DriverName is the DRA driver's name, the devices' domain.
const DriverName = "queues.vhostmq.io"

// Device attributes: a claim keeps its slots on one NUMA node with a
// matchAttribute constraint on AttrNUMANode.
const (
	AttrNUMANode = "numaNode"
	AttrCPU      = "cpu"
	AttrSlot     = "slot"
)

// Devices lists one device per queue slot, named by the slot ID. The
// order interleaves the CPUs (every CPU's first slot, then every CPU's
// second, ...): the scheduler takes the first devices that fit, so a claim
// for n slots lands on n distinct CPUs while there are, as the device
// plugin's preferred allocation does. Slots the device plugin's side holds
// (an allocation's reservation, or a port no claim holds) are left out, so
// the capacity shown to DRA shrinks as the kubelet allocates; a claim's
// slots stay (the scheduler counts them as allocated itself).
func Devices(c *agentv1.Capacity) []resourceapi.Device {
	type ref struct {
		slot  *agentv1.Slot
		cpu   *agentv1.CPU
		index int
	}
	var refs []ref
	for _, cpu := range c.GetCpus() {
		for i, s := range cpu.GetSlots() {
			if held := s.GetReservedBy(); held != "" && !strings.HasPrefix(held, agentv1.OwnerClaim) || held == "" && s.GetPortId() != "" {
				continue
			}
			refs = append(refs, ref{s, cpu, i})
		}
	}
	slices.SortStableFunc(refs, func(a, b ref) int {
		return cmp.Or(cmp.Compare(a.index, b.index), cmp.Compare(a.cpu.GetId(), b.cpu.GetId()))
	})
	devices := make([]resourceapi.Device, 0, len(refs))
	for _, r := range refs {
		devices = append(devices, resourceapi.Device{
			Name: r.slot.GetId(),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				AttrNUMANode: {IntValue: ptr.To(int64(r.cpu.GetNumaNode()))},
				AttrCPU:      {IntValue: ptr.To(int64(r.cpu.GetId()))},
				AttrSlot:     {StringValue: ptr.To(r.slot.GetId())},
			},
		})
	}
	return devices
}
