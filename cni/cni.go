package cni

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ipam"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/cni/kubevirt/vmi"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/plugin"
)

// Labels the plugin puts on the ports it creates.
const (
	LabelContainerID  = "cni.containerID"
	LabelIfName       = "cni.ifname"
	LabelPodNamespace = "k8s.pod.namespace"
	LabelPodName      = "k8s.pod.name"
	LabelPodUID       = "k8s.pod.uid"
	LabelInterface    = agentv1.LabelInterface
	LabelNetwork      = "network"
	// On the port of a live migration's target pod: the source pod, and
	// the addresses taken over from it (comma-separated) besides the
	// pod's own IPAM addresses.
	LabelMigrationSource  = "migration.source-pod"
	LabelMigrationCarried = "migration.carried-ips"

	pendingDir = ".cni-pending-del"
)

// Timeout bounds each call to the agent.
var Timeout = 10 * time.Second

// Funcs are the plugin's commands, for skel.PluginMainFuncs.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: CmdAdd, Del: CmdDel, Check: CmdCheck, GC: CmdGC, Status: CmdStatus}
}

// Versions are the CNI spec versions the plugin supports.
var Versions = version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

// About is the plugin's one-line description for VERSION.
const About = "vhostmq: multiqueue vhost-user ports for KubeVirt VMs"

// PortID is the agent port ID of an attachment: deterministic, so that
// ADD retries, DEL, CHECK and GC agree without any local state.
func PortID(containerID, ifname string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifname))
	return "cni-" + hex.EncodeToString(sum[:12])
}

// generatedMAC is a locally administered unicast address derived from the
// attachment.
func generatedMAC(containerID, ifname string) net.HardwareAddr {
	return vmi.DerivedMAC("mac/" + containerID + "/" + ifname)
}

func dial(path string) (agentv1.AgentClient, func(), error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return agentv1.NewAgentClient(conn), func() { conn.Close() }, nil
}

// unreachable tells whether an agent error means the agent is not there
// (as opposed to refusing the request).
func unreachable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// agentError turns an agent error into a CNI error.
func agentError(op string, err error) *types.Error {
	if unreachable(err) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%s: vhostmq agent not reachable", op), err.Error())
	}
	return types.NewError(ErrAgentRejected, fmt.Sprintf("%s: %s", op, status.Convert(err).Message()), status.Code(err).String())
}

// allocation is a device plugin allocation: its slot IDs and directory.
type allocation struct {
	slots []string
	dir   string // name under the socket root, qp-<hash>
}

// findAllocation finds the allocation holding device under root, by the
// .qp-<hash>.slots files the device plugin writes beside each directory.
func findAllocation(root, device string) (*allocation, error) {
	files, err := filepath.Glob(filepath.Join(root, ".qp-*.slots"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var ids []string
		found := false
		for _, id := range strings.Split(strings.TrimSpace(string(b)), ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
				found = found || id == device
			}
		}
		if !found {
			continue
		}
		slices.Sort(ids) // the order Multus indexes networks by
		dir := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "."), ".slots")
		if want := plugin.AllocationDir(ids); want != dir {
			return nil, fmt.Errorf("%s lists slots %s whose directory is %s", f, strings.Join(ids, ","), want)
		}
		return &allocation{slots: ids, dir: dir}, nil
	}
	return nil, nil
}

// ---- ADD -------------------------------------------------------------

// CmdAdd creates the port and prints the result.
func CmdAdd(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	res, err := add(args, conf)
	if err != nil {
		return err
	}
	return types.PrintResult(res, conf.CNIVersion)
}

func validIfName(s string) error {
	if s == "" || s == "." || s == ".." || len(s) > 15 || strings.ContainsAny(s, "/: \t\n") {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_IFNAME: %q is not a valid interface name", s), "")
	}
	return nil
}

// socketPaths returns the host and container socket paths of ifname in
// the allocation (a DRA claim's socket has its own name and place).
func socketPaths(conf *NetConf, set *slotSet, ifname string) (string, string, error) {
	name, ctrDir := ifname+".sock", conf.ContainerSocketDir
	if set.socket != "" {
		name, ctrDir = set.socket, set.ctrDir
	}
	host := filepath.Join(conf.SocketRoot, set.dir, name)
	ctr := filepath.Join(ctrDir, name)
	if len(host) >= maxSunPath {
		return "", "", configError("socketRoot: socket path %q is %d bytes; a unix socket path must be shorter than %d", host, len(host), maxSunPath)
	}
	if len(ctr) >= maxSunPath {
		return "", "", configError("containerSocketDir: socket path %q is %d bytes; a unix socket path must be shorter than %d", ctr, len(ctr), maxSunPath)
	}
	return host, ctr, nil
}

// attachment is what an ADD makes: the port spec and the socket path the
// container sees. Building it creates nothing.
type attachment struct {
	spec       *agentv1.PortSpec
	ctrSocket  string
	socketMode string   // device-info mode, seen from the container
	pod        *podView // nil without a kubeconfig
}

// plan builds the attachment of an ADD or CHECK from the configuration,
// the pod's annotations and its allocation.
func plan(args *skel.CmdArgs, conf *NetConf) (*attachment, error) {
	if err := validIfName(args.IfName); err != nil {
		return nil, err
	}
	pod := parseArgs(args.Args)
	pv, err := readPod(conf, pod)
	if err != nil {
		return nil, err
	}
	var ps podSettings
	var annotations map[string]string
	if pv != nil {
		annotations = pv.pod.Annotations
		if ps, err = parseAnnotations(annotations); err != nil {
			return nil, err
		}
	}
	bw, err := portBandwidth(conf, annotations)
	if err != nil {
		return nil, err
	}
	set, err := findSlots(conf, pod)
	if err != nil {
		return nil, err
	}
	// Queue pairs per interface: the pod's annotation (the webhook writes
	// it), else the sidecar's rule on the VMI of a virt-launcher pod, else
	// the network's queuePairs, else the whole allocation.
	pairs, from := uint32(len(set.all)), "the allocation"
	switch {
	case ps.queues != 0:
		pairs, from = ps.queues, "pod annotation "+AnnotationQueues
	default:
		q, vfrom, ok := uint32(0), "", false
		if pv != nil {
			if q, vfrom, ok, err = pv.vmiQueues(); err != nil {
				return nil, err
			}
		}
		switch {
		case ok:
			pairs, from = q, vfrom
		case conf.QueuePairs != 0:
			pairs, from = conf.QueuePairs, "queuePairs"
		}
	}
	networks := 0 // unknown without the API server
	if pv != nil {
		if networks, err = pv.networks(conf.ResourceName); err != nil {
			return nil, err
		}
	}
	slots, err := set.split(pairs, from, networks)
	if err != nil {
		return nil, err
	}
	host, ctr, err := socketPaths(conf, set, args.IfName)
	if err != nil {
		return nil, err
	}
	mac := conf.mac
	if mac == nil && pod.MAC != "" {
		if mac, err = parseMAC(pod.MAC); err != nil {
			return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS MAC: "+err.Error(), "")
		}
	}
	if mac == nil && pv != nil {
		// A VM's NIC: the MAC the binding sidecar gives the guest.
		s, err := pv.vmiMAC(args.IfName)
		if err != nil {
			return nil, err
		}
		if s != "" {
			mac, _ = net.ParseMAC(s)
		}
	}
	if mac == nil {
		mac = generatedMAC(args.ContainerID, args.IfName)
	}
	role, mode := conf.role, conf.SocketMode
	if ps.socketMode != "" {
		role, mode = ps.role, ps.socketMode
	}
	poll := conf.poll
	if ps.pollSet {
		poll = ps.poll
	}
	security := *conf.PortSecurity
	if ps.security != nil {
		if security && !*ps.security && !conf.PortSecurityOptOut {
			return nil, types.NewError(ErrBadAnnotation, fmt.Sprintf("pod annotation %s: \"false\" is not allowed on network %q: its NAD does not set portSecurityOptOut: true (whoever writes the NAD decides whether its pods may send from any address)", AnnotationPortSecurity, conf.Name), "")
		}
		security = *ps.security
	}
	s := &agentv1.PortSpec{
		Id:          PortID(args.ContainerID, args.IfName),
		SocketPath:  host,
		Role:        role,
		QueuePairs:  pairs,
		Slots:       slots,
		Mac:         mac.String(),
		Mtu:         conf.MTU,
		Polling:     poll,
		Network:     conf.Name,
		Vlan:        conf.VLAN,
		Vni:         conf.VNI,
		Uplink:      conf.Uplink,
		Dhcp:        *conf.DHCP,
		Reservation: set.reservation,
		Bandwidth:   bw,
		Labels: map[string]string{
			LabelContainerID: args.ContainerID,
			LabelIfName:      args.IfName,
			LabelInterface:   args.IfName,
		},
	}
	s.PortSecurity = &security
	if conf.Name != "" {
		s.Labels[LabelNetwork] = conf.Name
	}
	for k, v := range map[string]string{LabelPodNamespace: pod.Namespace, LabelPodName: pod.Name, LabelPodUID: pod.UID} {
		if v != "" {
			s.Labels[k] = v
		}
	}
	// Keep the allocation directory as the device plugin made it: the
	// agent applies the spec's mode and owner to the socket's directory.
	if fi, err := os.Stat(filepath.Dir(host)); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid := st.Uid, st.Gid
			s.SocketUid, s.SocketGid = &uid, &gid
			s.SocketMode = uint32(fi.Mode().Perm() & 0o770)
		}
	}
	return &attachment{spec: s, ctrSocket: ctr, socketMode: mode, pod: pv}, nil
}

func add(args *skel.CmdArgs, conf *NetConf) (*current.Result, error) {
	at, err := plan(args, conf)
	if err != nil {
		return nil, err
	}
	s := at.spec
	// A live migration's target: what its guest uses on the source pod,
	// read before anything is made (port security checks addresses only
	// with IPAM).
	var src *migrationSource
	if conf.IPAM.Type != "" && s.PortSecurityOn() && at.pod != nil {
		if src, err = at.pod.migrationSource(args.IfName); err != nil {
			return nil, err
		}
	}
	client, closeConn, err := dial(conf.AgentSocket)
	if err != nil {
		return nil, types.NewError(types.ErrInternal, "agent client", err.Error())
	}
	defer closeConn()
	retryPending(client, conf.SocketRoot)
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	var undo []func() error
	rollback := func(cause error) error {
		var errs []error
		for i := len(undo) - 1; i >= 0; i-- {
			if err := undo[i](); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("%w (and rolling back: %v)", cause, errors.Join(errs...))
		}
		return cause
	}
	// Addresses first: the guest learns them from the result (KubeVirt
	// shows them) and, with dhcp, from the dataplane's DHCP server.
	if conf.IPAM.Type != "" {
		r, err := ipam.ExecAdd(conf.IPAM.Type, args.StdinData)
		if err != nil {
			return nil, ipamError("ipam ADD", conf.IPAM.Type, err)
		}
		undo = append(undo, func() error { return ipam.ExecDel(conf.IPAM.Type, args.StdinData) })
		ir, err := current.NewResultFromResult(r)
		if err != nil {
			return nil, rollback(types.NewError(types.ErrDecodingFailure, "ipam "+conf.IPAM.Type+" result", err.Error()))
		}
		if len(ir.IPs) == 0 {
			return nil, rollback(types.NewError(types.ErrInvalidNetworkConfig, "ipam "+conf.IPAM.Type+" returned no addresses", ""))
		}
		for _, ip := range ir.IPs {
			ip.Interface = current.Int(0)
		}
		res.IPs, res.Routes, res.DNS = ir.IPs, ir.Routes, ir.DNS
		if s.Dhcp {
			s.Ip = ipConfig(ir)
		} else if s.PortSecurityOn() {
			// port security: the addresses the guest may send from
			// (gateway, routes and DNS are for DHCP only)
			s.Ip = &agentv1.IPConfig{Addresses: ipConfig(ir).Addresses}
		}
		if src != nil {
			added, err := carryAddresses(s, res, src, args.IfName)
			if err != nil {
				return nil, rollback(err)
			}
			s.Labels[LabelMigrationSource] = src.pod
			if len(added) > 0 {
				s.Labels[LabelMigrationCarried] = strings.Join(added, ",")
				logf("port %s (pod %s/%s, interface %s): target of live migration %s: also allowing %s, the interface's addresses in the source pod %s",
					s.Id, s.Labels[LabelPodNamespace], s.Labels[LabelPodName], args.IfName, src.migration, strings.Join(added, ", "), src.pod)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	port, err := client.CreatePort(ctx, &agentv1.CreatePortRequest{Spec: s})
	if err != nil {
		return nil, rollback(agentError("creating port "+s.Id, err))
	}
	undo = append(undo, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		defer cancel()
		_, err := client.DeletePort(ctx, &agentv1.DeletePortRequest{Id: s.Id})
		return err
	})
	if f := conf.RuntimeConfig.CNIDeviceInfoFile; f != "" {
		if err := writeDeviceInfo(f, at.socketMode, at.ctrSocket); err != nil {
			return nil, rollback(types.NewError(types.ErrIOFailure, "writing device-info "+f, err.Error()))
		}
	}
	mac := s.Mac
	if port.GetSpec().GetMac() != "" {
		mac = port.GetSpec().GetMac()
	}
	res.Interfaces = []*current.Interface{{Name: args.IfName, Mac: mac, Mtu: int(port.GetStatus().GetMtu()), Sandbox: args.Netns, SocketPath: at.ctrSocket}}
	return res, nil
}

// ipamSpeaks11 tells whether the IPAM plugin knows STATUS and GC (CNI
// 1.1); older ones (Debian 12 ships 1.0) are not asked.
func ipamSpeaks11(plugin string) bool {
	paths := filepath.SplitList(os.Getenv("CNI_PATH"))
	path, err := invoke.FindInPath(plugin, paths)
	if err != nil {
		return false
	}
	vi, err := invoke.GetVersionInfo(context.Background(), path, nil)
	return err == nil && slices.Contains(vi.SupportedVersions(), "1.1.0")
}

// ipConfig is the IPAM result as the agent's port IP configuration (what
// its DHCP server hands out).
func ipConfig(r *current.Result) *agentv1.IPConfig {
	c := &agentv1.IPConfig{}
	for _, ip := range r.IPs {
		c.Addresses = append(c.Addresses, ip.Address.String())
		if c.Gateway == "" && ip.Gateway != nil && ip.Address.IP.To4() != nil && ip.Gateway.To4() != nil {
			c.Gateway = ip.Gateway.String()
		}
	}
	for _, rt := range r.Routes {
		route := &agentv1.Route{Dst: rt.Dst.String()}
		if rt.GW != nil {
			route.Gateway = rt.GW.String()
		}
		c.Routes = append(c.Routes, route)
	}
	c.DnsServers = append(c.DnsServers, r.DNS.Nameservers...)
	if r.DNS.Domain != "" && !slices.Contains(r.DNS.Search, r.DNS.Domain) {
		c.DnsSearch = append(c.DnsSearch, r.DNS.Domain)
	}
	c.DnsSearch = append(c.DnsSearch, r.DNS.Search...)
	return c
}

// ipamError keeps the delegated plugin's CNI error code.
func ipamError(op, plugin string, err error) error {
	var te *types.Error
	if errors.As(err, &te) {
		return types.NewError(te.Code, fmt.Sprintf("%s (%s): %s", op, plugin, te.Msg), te.Details)
	}
	return types.NewError(types.ErrInternal, fmt.Sprintf("%s (%s)", op, plugin), err.Error())
}

// writeDeviceInfo replaces f with a vhost-user device-info file (Multus'
// helpers refuse to overwrite, and the file is read-only).
func writeDeviceInfo(f, mode, path string) error {
	b, err := json.Marshal(plugin.DeviceInfo{Type: "vhost-user", Version: "1.1.0",
		VhostUser: &plugin.VhostUserInfo{Mode: mode, Path: path}})
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		return err
	}
	if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile(f, b, 0o444)
}

// ---- DEL -------------------------------------------------------------

// CmdDel deletes the port. It succeeds when the port, the netns or the
// agent is gone; an unreachable agent leaves a pending deletion that the
// next ADD or GC retries.
func CmdDel(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	if f := conf.RuntimeConfig.CNIDeviceInfoFile; f != "" {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			return types.NewError(types.ErrIOFailure, "removing device-info "+f, err.Error())
		}
	}
	// Addresses are released even when the agent is away.
	if conf.IPAM.Type != "" {
		if err := ipam.ExecDel(conf.IPAM.Type, args.StdinData); err != nil {
			return ipamError("ipam DEL", conf.IPAM.Type, err)
		}
	}
	id := PortID(args.ContainerID, args.IfName)
	client, closeConn, err := dial(conf.AgentSocket)
	if err != nil {
		return types.NewError(types.ErrInternal, "agent client", err.Error())
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if _, err := client.DeletePort(ctx, &agentv1.DeletePortRequest{Id: id}); err != nil {
		if unreachable(err) {
			if perr := addPending(conf.SocketRoot, id, args.ContainerID, args.IfName); perr != nil {
				return types.NewError(types.ErrTryAgainLater, "vhostmq agent not reachable, and recording the pending deletion failed", perr.Error())
			}
			return nil
		}
		return agentError("deleting port "+id, err)
	}
	removePending(conf.SocketRoot, id)
	retryPending(client, conf.SocketRoot)
	return nil
}

type pendingDel struct {
	ID          string    `json:"id"`
	ContainerID string    `json:"containerID"`
	IfName      string    `json:"ifname"`
	Since       time.Time `json:"since"`
}

func addPending(root, id, containerID, ifname string) error {
	dir := filepath.Join(root, pendingDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(pendingDel{ID: id, ContainerID: containerID, IfName: ifname, Since: time.Now().UTC()})
	tmp := filepath.Join(dir, "."+id+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, id))
}

func removePending(root, id string) { os.Remove(filepath.Join(root, pendingDir, id)) }

// pendingIDs lists the port IDs whose deletion is pending.
func pendingIDs(root string) []string {
	ents, err := os.ReadDir(filepath.Join(root, pendingDir))
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range ents {
		if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// retryPending deletes the ports of pending deletions; it stops at the
// first unreachable error and reports how many remain.
func retryPending(client agentv1.AgentClient, root string) int {
	ids := pendingIDs(root)
	left := len(ids)
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), Timeout)
		_, err := client.DeletePort(ctx, &agentv1.DeletePortRequest{Id: id})
		cancel()
		if err != nil {
			if unreachable(err) {
				return left
			}
			continue // e.g. a static port: leave it for an operator
		}
		removePending(root, id)
		left--
	}
	return left
}

// ---- CHECK -----------------------------------------------------------

// CmdCheck verifies that the port exists as ADD made it.
func CmdCheck(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	at, err := plan(args, conf)
	if err != nil {
		return err
	}
	want := at.spec
	if conf.IPAM.Type != "" {
		if err := ipam.ExecCheck(conf.IPAM.Type, args.StdinData); err != nil {
			return ipamError("ipam CHECK", conf.IPAM.Type, err)
		}
	}
	client, closeConn, err := dial(conf.AgentSocket)
	if err != nil {
		return types.NewError(types.ErrInternal, "agent client", err.Error())
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	port, err := client.GetPort(ctx, &agentv1.GetPortRequest{Id: want.Id})
	if status.Code(err) == codes.NotFound {
		return types.NewError(ErrPortMismatch, fmt.Sprintf("port %s of %s is missing", want.Id, args.IfName), "")
	}
	if err != nil {
		return agentError("getting port "+want.Id, err)
	}
	got := port.GetSpec()
	mismatch := func(field string, g, w any) error {
		return types.NewError(ErrPortMismatch, fmt.Sprintf("port %s: %s is %v, want %v", want.Id, field, g, w), "")
	}
	switch {
	case got.GetSocketPath() != want.SocketPath:
		return mismatch("socket_path", got.GetSocketPath(), want.SocketPath)
	case got.GetQueuePairs() != want.QueuePairs:
		return mismatch("queue_pairs", got.GetQueuePairs(), want.QueuePairs)
	case len(port.GetStatus().GetQueues()) != int(want.QueuePairs):
		return mismatch("queues", len(port.GetStatus().GetQueues()), want.QueuePairs)
	case got.GetRole() != want.Role:
		return mismatch("role", got.GetRole(), want.Role)
	case !slices.Equal(got.GetSlots(), want.Slots):
		return mismatch("slots", got.GetSlots(), want.Slots)
	case got.PortSecurityOn() != want.PortSecurityOn():
		return mismatch("port_security", got.PortSecurityOn(), want.PortSecurityOn())
	case !proto.Equal(got.GetBandwidth(), want.Bandwidth):
		// vhostmqctl port bandwidth changed it since, or the annotations
		// did (they are read at ADD only).
		return mismatch("bandwidth", bandwidthString(got.GetBandwidth()), bandwidthString(want.Bandwidth))
	}
	// A port without a network was made by a plugin from before networks
	// (this one always names it): it keeps working as it was made.
	if got.GetNetwork() != "" {
		switch {
		case got.GetNetwork() != want.Network:
			return mismatch("network", got.GetNetwork(), want.Network)
		case got.GetVlan() != want.Vlan:
			return mismatch("vlan", got.GetVlan(), want.Vlan)
		case got.GetUplink() != want.Uplink:
			return mismatch("uplink", got.GetUplink(), want.Uplink)
		case got.GetVni() != want.Vni:
			return mismatch("vni", got.GetVni(), want.Vni)
		case got.GetDhcp() != want.Dhcp:
			return mismatch("dhcp", got.GetDhcp(), want.Dhcp)
		}
	}
	if conf.PrevResult != nil {
		prev, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, "prevResult: "+err.Error(), "")
		}
		var iface *current.Interface
		for _, i := range prev.Interfaces {
			if i.Name == args.IfName {
				iface = i
			}
		}
		if iface == nil {
			return types.NewError(ErrPortMismatch, fmt.Sprintf("prevResult has no interface %s", args.IfName), "")
		}
		if iface.Mac != "" && !strings.EqualFold(iface.Mac, got.GetMac()) {
			return mismatch("mac", got.GetMac(), iface.Mac)
		}
	}
	return nil
}

// ---- STATUS and GC ---------------------------------------------------

// CmdStatus reports whether the agent is reachable.
func CmdStatus(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	client, closeConn, err := dial(conf.AgentSocket)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "plugin not available", err.Error())
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if _, err := client.GetCapacity(ctx, &agentv1.GetCapacityRequest{}); err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "plugin not available", "vhostmq agent at "+conf.AgentSocket+": "+err.Error())
	}
	if conf.IPAM.Type != "" && ipamSpeaks11(conf.IPAM.Type) {
		if err := ipam.ExecStatus(conf.IPAM.Type, args.StdinData); err != nil {
			return ipamError("ipam STATUS", conf.IPAM.Type, err)
		}
	}
	return nil
}

// CmdGC deletes the ports this plugin created for this network whose
// attachment is not in cni.dev/valid-attachments, and retries pending
// deletions.
func CmdGC(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	client, closeConn, err := dial(conf.AgentSocket)
	if err != nil {
		return types.NewError(types.ErrInternal, "agent client", err.Error())
	}
	defer closeConn()
	if left := retryPending(client, conf.SocketRoot); left > 0 {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("%d pending port deletions: vhostmq agent not reachable", left), "")
	}
	valid := map[string]bool{}
	for _, a := range conf.ValidAttachments {
		valid[PortID(a.ContainerID, a.IfName)] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	list, err := client.ListPorts(ctx, &agentv1.ListPortsRequest{})
	if err != nil {
		return agentError("listing ports", err)
	}
	var errs []error
	for _, p := range list.GetPorts() {
		s := p.GetSpec()
		l := s.GetLabels()
		if _, ours := l[LabelContainerID]; !ours || l[LabelNetwork] != conf.Name {
			continue
		}
		if valid[s.GetId()] || valid[PortID(l[LabelContainerID], l[LabelIfName])] {
			continue
		}
		if _, err := client.DeletePort(ctx, &agentv1.DeletePortRequest{Id: s.GetId()}); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", s.GetId(), status.Convert(err).Message()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(ErrAgentRejected, "deleting stale ports", err.Error())
	}
	if conf.IPAM.Type != "" && ipamSpeaks11(conf.IPAM.Type) {
		if err := invoke.DelegateGC(context.Background(), conf.IPAM.Type, args.StdinData, nil); err != nil {
			return ipamError("ipam GC", conf.IPAM.Type, err)
		}
	}
	return nil
}
