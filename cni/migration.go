package cni

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// A KubeVirt live migration's target pod gets a new IPAM address, while
// the guest it receives goes on using the addresses it had on the source
// pod. With port security on, the target port allows those too, or the
// guest's traffic from them would be dropped as spoofed.
//
// KubeVirt (kubevirt.io/api/core/v1 and pkg/virt-controller/watch/migration,
// 1.4 to 1.7) marks the target pod when it creates it (createTargetPod):
// the label kubevirt.io/migrationJobUID and the annotation
// kubevirt.io/migrationJobName name the VirtualMachineInstanceMigration,
// whose status.migrationState.sourcePod the migration controller sets while
// the migration is Pending (controller.SetSourcePod: the VMI's newest pod
// on the VMI's node), in the same pass that creates the target pod. The
// VMI's own status.migrationState is no use here: KubeVirt fills it at the
// hand-off, once the target pod is Ready, after this ADD; until then it
// describes the previous migration. Multus records the addresses of every
// attachment of a pod in its k8s.v1.cni.cncf.io/network-status annotation,
// by pod interface name, and KubeVirt gives an interface the same name in
// the source and target pods (namescheme: hashed, or ordinal when the
// source has ordinal names).

// Names KubeVirt and Multus give.
const (
	kubevirtMigrationJobUID  = "kubevirt.io/migrationJobUID"       // label of a migration's target pod: the migration's UID
	kubevirtMigrationJobName = "kubevirt.io/migrationJobName"      // annotation of a migration's target pod: its name
	multusNetworkStatus      = "k8s.v1.cni.cncf.io/network-status" // annotation: the pod's attachments and their addresses
)

// ErrMigrationSource: the pod is a live migration's target and the
// addresses its guest has on the source pod could not be read or used.
const ErrMigrationSource uint = 106

// maxPortAddresses is the most addresses the agent takes in a port's
// ip.addresses (dataplane/agent/ipconfig.go, dataplane/config.MaxIPs).
const maxPortAddresses = 8

var vmimGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstancemigrations"}

// logf writes a line to the plugin's stderr, which the runtime or Multus
// logs.
var logf = func(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "vhostmq-cni: "+format+"\n", args...)
}

// migrationSource is what the target pod of a live migration takes over
// from its source pod for one interface.
type migrationSource struct {
	migration string // namespace/name of the VirtualMachineInstanceMigration
	pod       string // the source pod's name (same namespace)
	ips       []netip.Addr
}

// vmim is the subset of a VirtualMachineInstanceMigration read here.
type vmim struct {
	Metadata struct {
		UID string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		VMIName string `json:"vmiName"`
		// receive: the target side of a decentralized migration, whose
		// source is in another namespace or cluster
		Receive *json.RawMessage `json:"receive"`
	} `json:"spec"`
	Status struct {
		MigrationState *struct {
			SourcePod string `json:"sourcePod"`
		} `json:"migrationState"`
	} `json:"status"`
}

// networkStatus is an entry of Multus' k8s.v1.cni.cncf.io/network-status.
type networkStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface"`
	IPs       []string `json:"ips"`
}

// launcherOwner is the VMI owning a virt-launcher pod, or nil.
func launcherOwner(pod *corev1.Pod) *metav1.OwnerReference {
	for i, o := range pod.OwnerReferences {
		if o.Kind == "VirtualMachineInstance" && strings.HasPrefix(o.APIVersion, "kubevirt.io/") {
			return &pod.OwnerReferences[i]
		}
	}
	return nil
}

func migrationError(format string, args ...any) error {
	return types.NewError(ErrMigrationSource, fmt.Sprintf(format, args...), "")
}

// migrationAPIError is ErrMigrationSource for answers that will not
// change (not found, forbidden), try-again-later for the rest.
func migrationAPIError(what string, err error) error {
	code := ErrMigrationSource
	if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
		code = types.ErrTryAgainLater
	}
	return types.NewError(code, what, err.Error())
}

// migrationSource returns, for the target pod of a KubeVirt live
// migration, the addresses the source pod's interface ifname has; nil
// for every other pod, which costs no API call. Whatever stands in the
// way (no migration, no source pod, no entry for ifname in its
// network-status) is an error naming it: a migration that fails and is
// retried is better than a guest whose traffic is dropped after it.
func (v *podView) migrationSource(ifname string) (*migrationSource, error) {
	uid, ok := v.pod.Labels[kubevirtMigrationJobUID]
	owner := launcherOwner(v.pod)
	if !ok || owner == nil {
		return nil, nil
	}
	ns := v.pod.Namespace
	name := v.pod.Annotations[kubevirtMigrationJobName]
	if name == "" {
		return nil, migrationError("pod %s/%s is the target of live migration %s (label %s) but has no annotation %s naming it: its source pod, and so the addresses its guest uses, cannot be found",
			ns, v.pod.Name, uid, kubevirtMigrationJobUID, kubevirtMigrationJobName)
	}
	mig := ns + "/" + name
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	u, err := v.dyn.Resource(vmimGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, migrationAPIError(fmt.Sprintf("live migration target: reading VirtualMachineInstanceMigration %s for its source pod", mig), err)
	}
	b, err := u.MarshalJSON()
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "VirtualMachineInstanceMigration "+mig, err.Error())
	}
	var m vmim
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "VirtualMachineInstanceMigration "+mig, err.Error())
	}
	switch {
	case m.Metadata.UID != uid:
		return nil, migrationError("live migration target: VirtualMachineInstanceMigration %s has UID %s, the pod's label %s says %s (the migration was replaced)", mig, m.Metadata.UID, kubevirtMigrationJobUID, uid)
	case m.Spec.VMIName != owner.Name:
		return nil, migrationError("live migration target: VirtualMachineInstanceMigration %s migrates VirtualMachineInstance %q, the pod belongs to %q", mig, m.Spec.VMIName, owner.Name)
	case m.Spec.Receive != nil:
		return nil, migrationError("live migration target: VirtualMachineInstanceMigration %s receives the VM from another namespace or cluster (a decentralized migration): the addresses its guest uses there cannot be read, and port security would drop its traffic from them", mig)
	}
	src := ""
	if m.Status.MigrationState != nil {
		src = m.Status.MigrationState.SourcePod
	}
	switch src {
	case "":
		return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("live migration target: VirtualMachineInstanceMigration %s names no source pod yet (status.migrationState.sourcePod)", mig), "")
	case v.pod.Name:
		return nil, migrationError("live migration target: VirtualMachineInstanceMigration %s names this pod as its source", mig)
	}
	p, err := v.core.CoreV1().Pods(ns).Get(ctx, src, metav1.GetOptions{})
	if err != nil {
		return nil, migrationAPIError(fmt.Sprintf("live migration target: reading the source pod %s/%s of VirtualMachineInstanceMigration %s for the addresses its guest uses", ns, src, mig), err)
	}
	if o := launcherOwner(p); o == nil || o.UID != owner.UID {
		return nil, migrationError("live migration target: the source pod %s/%s of VirtualMachineInstanceMigration %s is not a virt-launcher pod of VirtualMachineInstance %s (UID %s)", ns, src, mig, owner.Name, owner.UID)
	}
	raw, ok := p.Annotations[multusNetworkStatus]
	if !ok {
		return nil, migrationError("live migration target: the source pod %s/%s has no annotation %s: the addresses its guest uses on %s are unknown", ns, src, multusNetworkStatus, ifname)
	}
	var statuses []networkStatus
	if err := json.Unmarshal([]byte(raw), &statuses); err != nil {
		return nil, migrationError("live migration target: the source pod %s/%s's annotation %s: %v", ns, src, multusNetworkStatus, err)
	}
	for _, st := range statuses {
		if st.Interface != ifname {
			continue
		}
		s := &migrationSource{migration: mig, pod: src}
		for _, ip := range st.IPs {
			a, err := netip.ParseAddr(ip)
			if err != nil || a.Zone() != "" {
				return nil, migrationError("live migration target: the source pod %s/%s's annotation %s: interface %s: %q is not an IP address", ns, src, multusNetworkStatus, ifname, ip)
			}
			s.ips = append(s.ips, a.Unmap())
		}
		return s, nil
	}
	return nil, migrationError("live migration target: the source pod %s/%s's annotation %s has no interface %s: the addresses its guest uses there are unknown", ns, src, multusNetworkStatus, ifname)
}

// prefixOf is an IPAM result's address as a prefix, IPv4 unmapped.
func prefixOf(n net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, bits := n.Mask.Size()
	if a.Is4In6() {
		a = a.Unmap()
		if bits == 128 {
			ones -= 96
		}
	}
	p := netip.PrefixFrom(a, ones)
	return p, p.IsValid()
}

// carryAddresses adds to the port (the addresses port security allows)
// and to the result (so that the pod's network-status lists them, for the
// VM's next migration) the source's addresses this pod's IPAM result
// lacks, each with the prefix length of the result's subnet holding it,
// after the IPAM's own: DHCP still offers the new address. It returns
// those it added. An address outside every subnet of the result, or more
// addresses than a port takes, is an error.
func carryAddresses(s *agentv1.PortSpec, res *current.Result, src *migrationSource, ifname string) ([]string, error) {
	have := map[netip.Addr]bool{}
	var subnets []netip.Prefix
	for _, ip := range res.IPs {
		if p, ok := prefixOf(ip.Address); ok {
			have[p.Addr()] = true
			subnets = append(subnets, p.Masked())
		}
	}
	var added []string
	for _, a := range src.ips {
		if have[a] {
			continue
		}
		i := slices.IndexFunc(subnets, func(p netip.Prefix) bool { return p.Contains(a) })
		if i < 0 || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() {
			return nil, migrationError("live migration target: address %s of interface %s in the source pod %s (VirtualMachineInstanceMigration %s) is in none of this network's IPAM subnets (%s): it is not carried over",
				a, ifname, src.pod, src.migration, joinPrefixes(subnets))
		}
		p := netip.PrefixFrom(a, subnets[i].Bits())
		have[a] = true
		added = append(added, p.String())
		res.IPs = append(res.IPs, &current.IPConfig{Interface: current.Int(0),
			Address: net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(p.Bits(), a.BitLen())}})
	}
	if n := len(s.Ip.GetAddresses()) + len(added); n > maxPortAddresses {
		return nil, migrationError("live migration target: this pod's %d IPAM addresses and the %d the guest may still use from the source pod %s (%s) make %d; a port allows at most %d (restart the VM: a new pod starts from its own address)",
			len(s.Ip.GetAddresses()), len(added), src.pod, strings.Join(added, ", "), n, maxPortAddresses)
	}
	if len(added) > 0 {
		s.Ip.Addresses = append(s.Ip.Addresses, added...)
	}
	return added, nil
}

func joinPrefixes(ps []netip.Prefix) string {
	var ss []string
	for _, p := range ps {
		ss = append(ss, p.String())
	}
	return strings.Join(ss, ", ")
}
