// Package binding is vhostmq's KubeVirt network binding plugin: a hook
// sidecar that, when virt-launcher defines the domain, gives every VMI
// interface bound to vhostmq a multiqueue vhost-user NIC on the socket the
// CNI plugin reported, and makes guest memory shareable with the
// dataplane.
package binding

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/vhostmq/vhostmq/cni/kubevirt/vmi"
)

// NetworkInfo is KubeVirt's downward-API network-info file
// (/etc/podinfo/network-info): the Multus network-status entries of
// interfaces whose binding asks for device-info.
type NetworkInfo struct {
	Interfaces []NetworkInfoInterface `json:"interfaces"`
}

// NetworkInfoInterface is one interface of NetworkInfo; Network is the
// VMI network name.
type NetworkInfoInterface struct {
	Network    string `json:"network"`
	MAC        string `json:"mac"`
	MTU        int    `json:"mtu"`
	DeviceInfo *struct {
		Type      string `json:"type"`
		Version   string `json:"version"`
		VhostUser *struct {
			Mode string `json:"mode"`
			Path string `json:"path"`
		} `json:"vhost-user"`
	} `json:"deviceInfo"`
}

// ParseNetworkInfo decodes a network-info file.
func ParseNetworkInfo(b []byte) (*NetworkInfo, error) {
	ni := &NetworkInfo{}
	if err := json.Unmarshal(b, ni); err != nil {
		return nil, fmt.Errorf("network-info: %w", err)
	}
	return ni, nil
}

// AliasPrefix is KubeVirt's prefix for user aliases: KubeVirt maps a
// domain interface back to the VMI interface by alias "ua-<name>".
const AliasPrefix = "ua-"

// ErrNoDeviceInfo: the network-info file has no vhost-user device-info for
// an interface bound to vhostmq (the CNI did not run for it, or the
// binding is not registered with downwardAPI: device-info).
var ErrNoDeviceInfo = errors.New("no vhost-user device-info")

// Mutate returns domainXML with a vhost-user NIC for every interface of v
// bound to plugin, its source from ni. Running it again on its own output
// changes nothing (virt-launcher calls it more than once, and again on a
// migration target).
func Mutate(domainXML []byte, v *vmi.VMI, ni *NetworkInfo, plugin string, log *slog.Logger) ([]byte, error) {
	ifaces := v.BoundTo(plugin)
	if len(ifaces) == 0 {
		return domainXML, nil
	}
	dom := &libvirtxml.Domain{}
	if err := dom.Unmarshal(string(domainXML)); err != nil {
		return nil, fmt.Errorf("domain XML: %w", err)
	}
	queues, clamped, err := v.Queues()
	if err != nil {
		return nil, err
	}
	if clamped {
		log.Warn("queue pairs clamped", "vcpus", v.VCPUs(), "queues", queues, "max", vmi.MaxQueuePairs)
	}
	rx, tx, err := v.QueueSizes()
	if err != nil {
		return nil, err
	}
	if dom.Devices == nil {
		dom.Devices = &libvirtxml.DomainDeviceList{}
	}
	for _, iface := range ifaces {
		src, err := source(ni, iface.Name)
		if err != nil {
			return nil, err
		}
		want := libvirtxml.DomainInterface{
			Source: &libvirtxml.DomainInterfaceSource{VHostUser: &libvirtxml.DomainInterfaceSourceVHostUser{
				Chardev: &libvirtxml.DomainChardevSource{UNIX: src}}},
			Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio-non-transitional"},
			Driver: &libvirtxml.DomainInterfaceDriver{Queues: uint(queues), RXQueueSize: rx, TXQueueSize: tx},
			Alias:  &libvirtxml.DomainAlias{Name: AliasPrefix + iface.Name},
		}
		want.MAC = &libvirtxml.DomainInterfaceMAC{Address: macFor(v, iface, ni)}
		if i := findAlias(dom.Devices.Interfaces, want.Alias.Name); i >= 0 {
			old := dom.Devices.Interfaces[i]
			want.Address, want.ACPI, want.Boot, want.ROM = old.Address, old.ACPI, old.Boot, old.ROM
			dom.Devices.Interfaces[i] = want
		} else {
			dom.Devices.Interfaces = append(dom.Devices.Interfaces, want)
		}
		log.Info("vhost-user interface", "interface", iface.Name, "socket", src.Path, "mode", src.Mode, "queues", queues, "rxQueueSize", rx, "txQueueSize", tx)
	}
	shareMemory(dom)
	out, err := dom.Marshal()
	if err != nil {
		return nil, fmt.Errorf("domain XML: %w", err)
	}
	return []byte(out), nil
}

// source is the vhost-user socket of VMI network name, from network-info.
// The device-info mode is the pod's (QEMU's) side, as libvirt's is.
func source(ni *NetworkInfo, name string) (*libvirtxml.DomainChardevSourceUNIX, error) {
	if ni != nil {
		for _, e := range ni.Interfaces {
			if e.Network != name || e.DeviceInfo == nil {
				continue
			}
			d := e.DeviceInfo
			if d.Type != "vhost-user" || d.VhostUser == nil || d.VhostUser.Path == "" {
				return nil, fmt.Errorf("interface %s: device-info is %q, want vhost-user with a path: %w", name, d.Type, ErrNoDeviceInfo)
			}
			switch d.VhostUser.Mode {
			case "server", "client":
			default:
				return nil, fmt.Errorf("interface %s: device-info vhost-user mode %q is not server or client", name, d.VhostUser.Mode)
			}
			return &libvirtxml.DomainChardevSourceUNIX{Path: d.VhostUser.Path, Mode: d.VhostUser.Mode}, nil
		}
	}
	return nil, fmt.Errorf("interface %s: %w in network-info (is the binding registered with downwardAPI: device-info, and did the vhostmq CNI run for it?)", name, ErrNoDeviceInfo)
}

// macFor is the VMI's MAC for iface, else network-info's (the CNI's
// port), else the one derived from the VMI (the CNI derives the same).
func macFor(v *vmi.VMI, iface vmi.Interface, ni *NetworkInfo) string {
	if iface.MacAddress != "" {
		return strings.ToLower(iface.MacAddress)
	}
	if ni != nil {
		for _, e := range ni.Interfaces {
			if e.Network == iface.Name && e.MAC != "" {
				return strings.ToLower(e.MAC)
			}
		}
	}
	return v.MAC(iface.Name)
}

func findAlias(ifaces []libvirtxml.DomainInterface, alias string) int {
	for i, x := range ifaces {
		if x.Alias != nil && x.Alias.Name == alias {
			return i
		}
	}
	return -1
}

// shareMemory makes guest RAM visible to the dataplane: memfd-backed and
// shared, unless hugepages already back it (then only shared).
func shareMemory(dom *libvirtxml.Domain) {
	mb := dom.MemoryBacking
	if mb == nil {
		mb = &libvirtxml.DomainMemoryBacking{}
		dom.MemoryBacking = mb
	}
	if mb.MemorySource == nil && mb.MemoryHugePages == nil {
		mb.MemorySource = &libvirtxml.DomainMemorySource{Type: "memfd"}
	}
	mb.MemoryAccess = &libvirtxml.DomainMemoryAccess{Mode: "shared"}
	// A NUMA cell's memAccess overrides memoryBacking's.
	if dom.CPU != nil && dom.CPU.Numa != nil {
		for i := range dom.CPU.Numa.Cell {
			if dom.CPU.Numa.Cell[i].MemAccess != "" {
				dom.CPU.Numa.Cell[i].MemAccess = "shared"
			}
		}
	}
}
