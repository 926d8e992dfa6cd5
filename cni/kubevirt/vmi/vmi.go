// Package vmi reads the parts of a KubeVirt VirtualMachineInstance that
// vhostmq acts on, and holds the one rule that says how many queue pairs a
// vhostmq interface gets, so that the binding sidecar (the guest NIC), the
// webhook (the pod's request) and the CNI (the port) agree.
//
// It decodes KubeVirt's JSON with its own small types instead of importing
// kubevirt.io/api, whose Kubernetes dependencies lag ours.
package vmi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Annotations on the VMI (KubeVirt copies VMI annotations to the
// virt-launcher pod, where the CNI reads the same keys).
const (
	AnnotationQueues      = "vhostmq.io/queues"
	AnnotationRxQueueSize = "vhostmq.io/rx-queue-size"
	AnnotationTxQueueSize = "vhostmq.io/tx-queue-size"
)

// MaxQueuePairs is the most queue pairs a vhostmq port serves.
const MaxQueuePairs = 128

// DefaultQueueSize is the virtqueue size the sidecar asks QEMU for.
const DefaultQueueSize = 1024

// VMI is the subset of kubevirt.io/api/core/v1.VirtualMachineInstance
// vhostmq reads.
type VMI struct {
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		UID         string            `json:"uid"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Domain struct {
			CPU *struct {
				Sockets uint32 `json:"sockets"`
				Cores   uint32 `json:"cores"`
				Threads uint32 `json:"threads"`
			} `json:"cpu"`
			Resources struct {
				Requests map[string]resource.Quantity `json:"requests"`
				Limits   map[string]resource.Quantity `json:"limits"`
			} `json:"resources"`
			Devices struct {
				NetworkInterfaceMultiqueue *bool       `json:"networkInterfaceMultiqueue"`
				Interfaces                 []Interface `json:"interfaces"`
			} `json:"devices"`
		} `json:"domain"`
		Networks []Network `json:"networks"`
	} `json:"spec"`
}

// Interface is a VMI interface.
type Interface struct {
	Name       string `json:"name"`
	MacAddress string `json:"macAddress"`
	Binding    *struct {
		Name string `json:"name"`
	} `json:"binding"`
}

// Network is a VMI network.
type Network struct {
	Name   string `json:"name"`
	Multus *struct {
		NetworkName string `json:"networkName"`
		Default     bool   `json:"default"`
	} `json:"multus"`
	Pod *struct{} `json:"pod"`
}

// Parse decodes a VMI's JSON.
func Parse(b []byte) (*VMI, error) {
	v := &VMI{}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, fmt.Errorf("vmi: %w", err)
	}
	return v, nil
}

// BoundTo returns the VMI's interfaces whose binding plugin is name.
func (v *VMI) BoundTo(name string) []Interface {
	var out []Interface
	for _, i := range v.Spec.Domain.Devices.Interfaces {
		if i.Binding != nil && i.Binding.Name == name {
			out = append(out, i)
		}
	}
	return out
}

// VCPUs is the guest's vCPU count as KubeVirt computes it: the CPU
// topology if one is given, else the CPU limit, else the request (rounded
// up), else 1.
func (v *VMI) VCPUs() int {
	if c := v.Spec.Domain.CPU; c != nil && (c.Sockets != 0 || c.Cores != 0 || c.Threads != 0) {
		n := 1
		for _, x := range []uint32{c.Sockets, c.Cores, c.Threads} {
			if x != 0 {
				n *= int(x)
			}
		}
		return n
	}
	for _, m := range []map[string]resource.Quantity{v.Spec.Domain.Resources.Limits, v.Spec.Domain.Resources.Requests} {
		if q, ok := m["cpu"]; ok {
			if n := int(math.Ceil(float64(q.MilliValue()) / 1000)); n >= 1 {
				return n
			}
		}
	}
	return 1
}

// Queues is how many queue pairs each vhostmq interface of the VMI gets:
// the vhostmq.io/queues annotation, else the vCPU count when
// networkInterfaceMultiqueue is on, else 1; clamped to 1..MaxQueuePairs
// (clamped reports it). A malformed annotation is an error naming it.
func (v *VMI) Queues() (n int, clamped bool, err error) {
	if s, ok := v.Metadata.Annotations[AnnotationQueues]; ok {
		x, err := strconv.Atoi(s)
		if err != nil || x < 1 || x > MaxQueuePairs {
			return 0, false, fmt.Errorf("annotation %s: %q is not a number of queue pairs in 1..%d", AnnotationQueues, s, MaxQueuePairs)
		}
		return x, false, nil
	}
	if mq := v.Spec.Domain.Devices.NetworkInterfaceMultiqueue; mq == nil || !*mq {
		return 1, false, nil
	}
	n = v.VCPUs()
	if n > MaxQueuePairs {
		return MaxQueuePairs, true, nil
	}
	return n, false, nil
}

// QueueSizes are the rx and tx virtqueue sizes: the annotations, else
// DefaultQueueSize. QEMU accepts powers of two in 256..1024.
func (v *VMI) QueueSizes() (rx, tx uint, err error) {
	size := func(key string) (uint, error) {
		s, ok := v.Metadata.Annotations[key]
		if !ok {
			return DefaultQueueSize, nil
		}
		x, err := strconv.Atoi(s)
		if err != nil || x < 256 || x > 1024 || x&(x-1) != 0 {
			return 0, fmt.Errorf("annotation %s: %q is not 256, 512 or 1024", key, s)
		}
		return uint(x), nil
	}
	if rx, err = size(AnnotationRxQueueSize); err != nil {
		return 0, 0, err
	}
	tx, err = size(AnnotationTxQueueSize)
	return rx, tx, err
}

// PodInterfaceName is the name KubeVirt gives the pod interface of a VMI
// network ("pod" and the first 11 hex digits of the SHA-256 of the
// network name): Multus passes it to the CNI as CNI_IFNAME.
func PodInterfaceName(network string) string {
	sum := sha256.Sum256([]byte(network))
	return "pod" + hex.EncodeToString(sum[:])[:11]
}

// NetworkOfPodInterface returns the VMI network whose pod interface is
// ifname, or "".
func (v *VMI) NetworkOfPodInterface(ifname string) string {
	for _, n := range v.Spec.Networks {
		if PodInterfaceName(n.Name) == ifname {
			return n.Name
		}
	}
	return ""
}

// MAC is the guest MAC of interface name: the VMI's macAddress, else one
// derived from the VMI's UID and the interface name, so that the binding
// sidecar (the guest NIC) and the CNI (the port, network-status) agree
// without talking, and a migration target derives the same one. It is a
// locally administered unicast address.
func (v *VMI) MAC(name string) string {
	for _, i := range v.Spec.Domain.Devices.Interfaces {
		if i.Name == name && i.MacAddress != "" {
			return strings.ToLower(i.MacAddress)
		}
	}
	return DerivedMAC("vhostmq-mac/" + v.Metadata.UID + "/" + name).String()
}

// DerivedMAC is a locally administered unicast address derived from seed:
// the same seed gives the same address on every node.
func DerivedMAC(seed string) net.HardwareAddr {
	sum := sha256.Sum256([]byte(seed))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&0xfc | 0x02
	return mac
}
