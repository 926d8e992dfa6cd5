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
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
	// AttrSlots (device metadata only): every slot of the claim
	AttrSlots = "slots"
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
			if heldByDevicePlugin(s) {
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

// heldByDevicePlugin: the slot is the device plugin side's (an
// allocation's reservation, or a port no claim holds), not DRA's to give.
func heldByDevicePlugin(s *agentv1.Slot) bool {
	held := s.GetReservedBy()
	return held != "" && !strings.HasPrefix(held, agentv1.OwnerClaim) || held == "" && s.GetPortId() != ""
}

// CapQueuePairs is the consumable capacity of a NUMA node's device
// (DevicesPerNUMA): a claim asks capacity.requests[queuePairs] (a C identifier, as the API requires).
const CapQueuePairs = "queuePairs"

// numaDevicePrefix names DevicesPerNUMA's devices: numa-<node>.
const numaDevicePrefix = "numa-"

// DevicesPerNUMA lists one device per NUMA node instead of one per slot:
// its consumable capacity queuePairs (KEP-5075, DRAConsumableCapacity) is
// the node's slots the device plugin's side does not hold, shared by any
// number of claims (1..all per request). The scheduler then only counts;
// preparing the claim picks the slots (the agent: distinct CPUs first).
// A node without such slots is left out.
func DevicesPerNUMA(c *agentv1.Capacity) []resourceapi.Device {
	free := map[int32]int64{}
	var nodes []int32
	for _, cpu := range c.GetCpus() {
		n := cpu.GetNumaNode()
		if _, ok := free[n]; !ok {
			nodes = append(nodes, n)
			free[n] = 0
		}
		for _, s := range cpu.GetSlots() {
			if !heldByDevicePlugin(s) {
				free[n]++
			}
		}
	}
	slices.Sort(nodes)
	var devices []resourceapi.Device
	for _, n := range nodes {
		if free[n] == 0 {
			continue
		}
		devices = append(devices, resourceapi.Device{
			Name:                     numaDevicePrefix + strconv.Itoa(int(n)),
			AllowMultipleAllocations: ptr.To(true),
			Attributes:               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{AttrNUMANode: {IntValue: ptr.To(int64(n))}},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapQueuePairs: {
				Value: *resource.NewQuantity(free[n], resource.DecimalSI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default: resource.NewQuantity(1, resource.DecimalSI),
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(1, resource.DecimalSI),
						Max: resource.NewQuantity(free[n], resource.DecimalSI), Step: resource.NewQuantity(1, resource.DecimalSI)},
				},
			}},
		})
	}
	return devices
}

// numaOfDevice: the NUMA node of a DevicesPerNUMA device name.
func numaOfDevice(name string) (int32, bool) {
	s, ok := strings.CutPrefix(name, numaDevicePrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 32)
	return int32(n), err == nil && n >= 0
}
