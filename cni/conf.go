// Package cni is the vhostmq CNI plugin: it turns a pod's allocated queue
// slots (vhostmq.io/queue-pairs devices, as Multus passes them) into a
// dataplane port with a vhost-user socket in the pod's allocation
// directory, and tells Multus and KubeVirt where that socket is through a
// device-info file.
package cni

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// Defaults of NetConf.
const (
	DefaultAgentSocket        = "/run/vhostmq/api.sock"
	DefaultSocketRoot         = "/var/run/vhostmq"
	DefaultContainerSocketDir = "/var/run/vhostmq"
	DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	DefaultResourceName       = "vhostmq.io/queue-pairs"

	minMTU        = 68
	maxMTU        = 9702
	maxQueuePairs = 128
	maxSunPath    = 108
	maxVLAN       = 4094
	maxVNI        = 1<<24 - 1
)

// Error codes of this plugin (the CNI spec reserves 0-99).
const (
	// ErrNoDevice: the pod has no vhostmq.io/queue-pairs device for this
	// network (no deviceID from Multus).
	ErrNoDevice uint = 100
	// ErrNoAllocation: the device ID belongs to no allocation under the
	// socket root (wrong socketRoot, or the device plugin did not run).
	ErrNoAllocation uint = 101
	// ErrAgentRejected: the node agent refused the port.
	ErrAgentRejected uint = 102
	// ErrPortMismatch: CHECK found the port missing or different.
	ErrPortMismatch uint = 103
)

// NetConf is the plugin's network configuration.
type NetConf struct {
	types.PluginConf

	// AgentSocket is the node agent's gRPC API socket.
	AgentSocket string `json:"agentSocket,omitempty"`
	// SocketRoot is the host directory under which the device plugin
	// makes one directory per allocation (qp-<hash>).
	SocketRoot string `json:"socketRoot,omitempty"`
	// ContainerSocketDir is where the container sees its allocation
	// directory.
	ContainerSocketDir string `json:"containerSocketDir,omitempty"`
	// MTU of the port; 0 = the agent's default (1500).
	MTU uint32 `json:"mtu,omitempty"`
	// QueuePairs of the port; 0 = one per allocated slot.
	QueuePairs uint32 `json:"queuePairs,omitempty"`
	// SocketMode is seen from the container application, as in the
	// device-info spec: "server" (default) = QEMU in the pod creates the
	// socket and the dataplane dials it; "client" = the dataplane listens.
	SocketMode string `json:"socketMode,omitempty"`
	// Polling is "interrupt", "adaptive" (default) or "busy".
	Polling string `json:"polling,omitempty"`
	// Kubeconfig lets the plugin read the pod's vhostmq.io/ annotations;
	// default DefaultKubeconfig if it exists, else annotations are not read.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// PodResourcesSocket is the kubelet's pod-resources API, which lists
	// every queue-pairs device of the pod; when it is absent the plugin
	// relies on deviceID and the device plugin's allocation records.
	PodResourcesSocket string `json:"podResourcesSocket,omitempty"`
	// ResourceName is the device plugin's extended resource.
	ResourceName string `json:"resourceName,omitempty"`
	// DHCP: the dataplane answers the guest's DHCPv4 client with the IPAM
	// result (address, gateway, routes, DNS). Default: on when ipam is
	// configured; false when the user runs their own DHCP server.
	DHCP *bool `json:"dhcp,omitempty"`
	// VLAN is the network's 802.1Q VLAN ID on the node's uplink, 1..4094;
	// 0 or absent = untagged.
	VLAN uint32 `json:"vlan,omitempty"`
	// Uplink is how the network leaves the node: "none" (the default:
	// VMs on this node only), "tap", "af_xdp" or "vxlan" (the node's
	// uplink of that kind, from the agent config).
	Uplink string `json:"uplink,omitempty"`
	// VNI is the network's VXLAN network identifier, 1..16777215, with
	// uplink "vxlan" (required there, refused elsewhere): the same
	// network on every node.
	VNI uint32 `json:"vni,omitempty"`
	// PortSecurity (default true): the guest may send only from its MAC
	// and IPAM addresses, so it cannot take another VM's traffic; false
	// for guests that bridge or route other hosts' frames.
	PortSecurity *bool `json:"portSecurity,omitempty"`
	// PortSecurityOptOut lets a pod turn port security off for itself
	// (vhostmq.io/port-security: "false"). Off by default: whoever writes
	// the NAD decides whether its tenants' pods may send from any
	// address, not each pod's author.
	PortSecurityOptOut bool `json:"portSecurityOptOut,omitempty"`

	// DeviceID and PCIBusID are injected by Multus.
	DeviceID string `json:"deviceID,omitempty"`
	PCIBusID string `json:"pciBusID,omitempty"`

	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`
	// Args is the CNI "args" convention; accepted and ignored.
	Args json.RawMessage `json:"args,omitempty"`

	role   agentv1.Role
	poll   agentv1.PollingMode
	device string // the effective device ID
	mac    net.HardwareAddr
}

// RuntimeConfig holds the capability arguments this plugin understands.
// Unknown keys are ignored: runtimes and Multus pass capability arguments
// the plugin did not ask for.
type RuntimeConfig struct {
	DeviceID          string `json:"deviceID,omitempty"`
	CNIDeviceInfoFile string `json:"CNIDeviceInfoFile,omitempty"`
	MAC               string `json:"mac,omitempty"`
	// Bandwidth is the bandwidth capability's BandwidthEntry (bandwidth.go),
	// read by ADD and CHECK only: a DEL always gets through.
	Bandwidth json.RawMessage `json:"bandwidth,omitempty"`
}

func configError(format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, args...), "")
}

// knownFields are the top-level keys a configuration may have: the CNI
// ones (including what runtimes and Multus inject) and this plugin's.
var knownFields = map[string]bool{
	"cniVersion": true, "name": true, "type": true, "capabilities": true, "ipam": true, "dns": true,
	"prevResult": true, "cni.dev/valid-attachments": true, "runtimeConfig": true, "args": true,
	"deviceID": true, "pciBusID": true,
	"agentSocket": true, "socketRoot": true, "containerSocketDir": true, "mtu": true, "queuePairs": true,
	"socketMode": true, "polling": true, "kubeconfig": true, "podResourcesSocket": true, "resourceName": true,
	"dhcp": true, "vlan": true, "uplink": true, "vni": true, "portSecurity": true, "portSecurityOptOut": true,
}

// loadConf parses and validates a configuration; every error is a
// *types.Error naming the field.
func loadConf(data []byte) (*NetConf, error) {
	// encoding/json matches field names case-insensitively; a config
	// must spell them exactly.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "failed to load netconf: "+err.Error(), "")
	}
	// Only top-level keys are checked: ipam belongs to the IPAM plugin and
	// runtimeConfig carries capability arguments for other plugins.
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if !knownFields[k] {
			return nil, types.NewError(types.ErrUnsupportedField, fmt.Sprintf("unknown field %q", k), "")
		}
	}
	// Typed fields with a message naming them, not encoding/json's.
	for _, f := range []struct {
		key, want string
		ok        func(json.RawMessage) bool
	}{
		{"dhcp", "true or false", func(r json.RawMessage) bool { s := string(r); return s == "true" || s == "false" }},
		{"portSecurity", "true or false", func(r json.RawMessage) bool { s := string(r); return s == "true" || s == "false" }},
		{"portSecurityOptOut", "true or false", func(r json.RawMessage) bool { s := string(r); return s == "true" || s == "false" }},
		{"vlan", "a number", func(r json.RawMessage) bool { var v uint32; return json.Unmarshal(r, &v) == nil }},
		{"vni", "a number", func(r json.RawMessage) bool { var v uint32; return json.Unmarshal(r, &v) == nil }},
		{"uplink", "a string", func(r json.RawMessage) bool { var v string; return json.Unmarshal(r, &v) == nil }},
	} {
		if r, ok := keys[f.key]; ok && !f.ok(r) {
			return nil, configError("%s: %s is not %s", f.key, r, f.want)
		}
	}
	n := &NetConf{}
	if err := json.Unmarshal(data, n); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "failed to load netconf: "+err.Error(), "")
	}
	var err error
	if err = version.ParsePrevResult(&n.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "prevResult: "+err.Error(), "")
	}
	if n.AgentSocket == "" {
		n.AgentSocket = DefaultAgentSocket
	}
	if n.SocketRoot == "" {
		n.SocketRoot = DefaultSocketRoot
	}
	if n.ContainerSocketDir == "" {
		n.ContainerSocketDir = DefaultContainerSocketDir
	}
	if n.PodResourcesSocket == "" {
		n.PodResourcesSocket = DefaultPodResourcesSocket
	}
	if n.ResourceName == "" {
		n.ResourceName = DefaultResourceName
	} else if d, r, ok := strings.Cut(n.ResourceName, "/"); !ok || d == "" || r == "" || strings.Contains(r, "/") {
		return nil, configError("resourceName: %q is not an extended resource name like %s", n.ResourceName, DefaultResourceName)
	}
	for _, p := range []struct{ field, path string }{
		{"agentSocket", n.AgentSocket}, {"socketRoot", n.SocketRoot}, {"containerSocketDir", n.ContainerSocketDir},
		{"podResourcesSocket", n.PodResourcesSocket}, {"kubeconfig", n.Kubeconfig},
	} {
		if p.field == "kubeconfig" && p.path == "" {
			continue
		}
		if !filepath.IsAbs(p.path) || filepath.Clean(p.path) != p.path {
			return nil, configError("%s: %q must be an absolute, clean path", p.field, p.path)
		}
	}
	if n.MTU != 0 && (n.MTU < minMTU || n.MTU > maxMTU) {
		return nil, configError("mtu: %d is outside %d..%d", n.MTU, minMTU, maxMTU)
	}
	if n.QueuePairs > maxQueuePairs {
		return nil, configError("queuePairs: %d is outside 1..%d", n.QueuePairs, maxQueuePairs)
	}
	if n.SocketMode == "" {
		n.SocketMode = "server"
	}
	if n.role, err = parseSocketMode(n.SocketMode); err != nil {
		return nil, configError("socketMode: %q is not \"server\" (QEMU creates the socket) or \"client\" (the dataplane does)", n.SocketMode)
	}
	if n.poll, err = parsePolling(n.Polling); err != nil {
		return nil, configError("polling: %q is not interrupt, adaptive or busy", n.Polling)
	}
	if _, ok := keys["ipam"]; ok && n.IPAM.Type == "" {
		return nil, configError("ipam: has no \"type\" (the IPAM plugin to delegate to, e.g. host-local)")
	}
	if n.DHCP == nil {
		on := n.IPAM.Type != ""
		n.DHCP = &on
	} else if *n.DHCP && n.IPAM.Type == "" {
		return nil, configError("dhcp: true needs ipam (the addresses the dataplane hands out)")
	}
	if n.PortSecurity == nil {
		on := true
		n.PortSecurity = &on
	}
	if n.VLAN > maxVLAN {
		return nil, configError("vlan: %d is outside 0..%d", n.VLAN, maxVLAN)
	}
	switch n.Uplink {
	case "":
		n.Uplink = "none"
	case "none", "tap", "af_xdp", "vxlan":
	default:
		return nil, configError("uplink: %q is not \"none\" (this node only), \"tap\", \"af_xdp\" or \"vxlan\" (the node's uplink of that kind)", n.Uplink)
	}
	switch {
	case n.Uplink == "vxlan" && (n.VNI == 0 || n.VNI > maxVNI):
		return nil, configError("vni: %d is outside 1..%d (uplink vxlan needs one)", n.VNI, maxVNI)
	case n.Uplink == "vxlan" && n.VLAN != 0:
		return nil, configError("vlan: %d, but on uplink vxlan a network is told apart by its vni, not a VLAN", n.VLAN)
	case n.Uplink != "vxlan" && n.VNI != 0:
		return nil, configError("vni: %d, but uplink is %q: a vni is for uplink vxlan", n.VNI, n.Uplink)
	}
	n.device = n.RuntimeConfig.DeviceID
	if n.device == "" {
		n.device = n.DeviceID
	} else if n.DeviceID != "" && n.DeviceID != n.device {
		return nil, configError("deviceID: %q differs from runtimeConfig.deviceID %q", n.DeviceID, n.device)
	}
	if strings.ContainsAny(n.device, "/,") {
		return nil, configError("deviceID: %q is not a queue slot ID", n.device)
	}
	if n.RuntimeConfig.MAC != "" {
		mac, err := parseMAC(n.RuntimeConfig.MAC)
		if err != nil {
			return nil, configError("runtimeConfig.mac: %v", err)
		}
		n.mac = mac
	}
	if f := n.RuntimeConfig.CNIDeviceInfoFile; f != "" && !filepath.IsAbs(f) {
		return nil, configError("runtimeConfig.CNIDeviceInfoFile: %q must be an absolute path", f)
	}
	return n, nil
}

func parseSocketMode(s string) (agentv1.Role, error) {
	switch s {
	case "server": // QEMU listens, the dataplane dials
		return agentv1.Role_ROLE_CLIENT, nil
	case "client":
		return agentv1.Role_ROLE_SERVER, nil
	}
	return 0, fmt.Errorf("bad socket mode %q", s)
}

func parsePolling(s string) (agentv1.PollingMode, error) {
	switch s {
	case "":
		return agentv1.PollingMode_POLLING_UNSPECIFIED, nil
	case "interrupt":
		return agentv1.PollingMode_POLLING_INTERRUPT, nil
	case "adaptive":
		return agentv1.PollingMode_POLLING_ADAPTIVE, nil
	case "busy":
		return agentv1.PollingMode_POLLING_BUSY, nil
	}
	return 0, fmt.Errorf("bad polling mode %q", s)
}

func parseMAC(s string) (net.HardwareAddr, error) {
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("%q is not an Ethernet address like 52:54:00:12:34:56", s)
	}
	if mac[0]&1 != 0 {
		return nil, fmt.Errorf("%q is a multicast address", s)
	}
	return mac, nil
}

// podArgs is what this plugin reads from CNI_ARGS. Unknown keys are
// ignored (runtimes pass many).
type podArgs struct {
	Namespace, Name, UID, MAC string
}

func parseArgs(s string) podArgs {
	var a podArgs
	for _, kv := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			a.Namespace = v
		case "K8S_POD_NAME":
			a.Name = v
		case "K8S_POD_UID":
			a.UID = v
		case "MAC":
			a.MAC = v
		}
	}
	return a
}
