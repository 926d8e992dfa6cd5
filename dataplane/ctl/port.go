package ctl

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"

	"github.com/spf13/pflag"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

func portAddSetup(fs *pflag.FlagSet) runFunc {
	var (
		socket           string
		role             string // "": unspecified, the agent's default (client)
		queues           = uint32(1)
		slots            []string
		mac              string
		mtu              uint32
		uid, gid, mode   uint32
		polling          string // "": unspecified, the agent's default (adaptive)
		labels           = map[string]string{}
		uidFlag, gidFlag = &uint32Value{p: &uid}, &uint32Value{p: &gid}
		network, uplink  string
		vlan, vni        uint32
		dhcp             bool
		addresses, dns   []string
		gateway          string
		portSecurity     bool
	)
	fs.StringVar(&socket, "socket", "", "absolute `PATH` of the port's vhost-user socket (required)")
	fs.Var(&enumValue{p: &role, allowed: []string{"server", "client"}}, "role", "`ROLE` of the dataplane on the socket: client (it dials QEMU; the default) or server (it listens)")
	fs.Var(&uint32Value{p: &queues}, "queues", "`N` queue pairs, 1..128")
	fs.Var(&listValue{p: &slots}, "slots", "`SLOTS` to serve the pairs, comma-separated; pair i on slot i mod count (default: any free)")
	fs.Var(&macValue{p: &mac}, "mac", "`MAC` address of the port")
	fs.Var(&uint32Value{p: &mtu}, "mtu", "MTU in `BYTES`, 68..9702 (default 1500)")
	fs.Var(uidFlag, "socket-uid", "`UID` to own the socket directory (and the socket, in server role)")
	fs.Var(gidFlag, "socket-gid", "`GID` to own the socket directory (and the socket, in server role)")
	fs.Var(&modeValue{p: &mode}, "socket-mode", "octal `MODE` of the socket directory, at most 0770 (default 0750)")
	fs.Var(&enumValue{p: &polling, allowed: []string{"interrupt", "adaptive", "busy"}}, "polling", "polling `MODE` of the workers: interrupt, adaptive (the default) or busy")
	fs.Var(&labelsValue{m: labels}, "label", "`KEY=VALUE` label, repeatable: k8s.pod.namespace, k8s.pod.name, interface, ...")
	fs.StringVar(&network, "network", "", "`NAME` of the port's network (its own MAC table; default: the default network)")
	fs.Var(&uint32Value{p: &vlan}, "vlan", "802.1Q `VID` of the network on the uplink, 1..4094 (default untagged)")
	fs.Var(&enumValue{p: &uplink, allowed: []string{"none", "tap", "af_xdp", "vxlan"}}, "uplink", "`KIND` of uplink the network uses: none (the default), tap, af_xdp or vxlan (the node's uplink of that kind)")
	fs.Var(&uint32Value{p: &vni}, "vni", "VXLAN network `ID` of the network on the vxlan uplink, 1..16777215 (required there)")
	fs.BoolVar(&dhcp, "dhcp", false, "answer the guest's DHCP with --address, --gateway and --dns")
	fs.Var(&listValue{p: &addresses}, "address", "the guest's `CIDRS`, comma-separated, e.g. 10.1.2.3/24")
	fs.StringVar(&gateway, "gateway", "", "the guest's default `ROUTER`")
	fs.Var(&listValue{p: &dns}, "dns", "DNS `SERVERS`, comma-separated")
	fs.BoolVar(&portSecurity, "port-security", true, "the guest may send only from --mac and --address; --port-security=false lets it send from any address (a guest that bridges or routes)")
	bw := addBandwidthFlags(fs, "-bandwidth")
	return func(ctx context.Context, c *cli, args []string) error {
		if socket == "" {
			return usageErrorf("missing --socket PATH (the port's vhost-user socket)")
		}
		spec := &agentv1.PortSpec{
			Id:         args[0],
			SocketPath: socket,
			// Unset role and polling stay unspecified (0), so that a
			// repeated add matches a port created without them.
			Role:       agentv1.Role(agentv1.Role_value["ROLE_"+strings.ToUpper(role)]),
			QueuePairs: queues,
			Slots:      slots,
			Mac:        mac,
			Mtu:        mtu,
			SocketMode: mode,
			Polling:    agentv1.PollingMode(agentv1.PollingMode_value["POLLING_"+strings.ToUpper(polling)]),
			Labels:     labels,
		}
		spec.Network, spec.Vlan, spec.Vni, spec.Uplink, spec.Dhcp = network, vlan, vni, uplink, dhcp
		if len(addresses) > 0 || gateway != "" || len(dns) > 0 {
			spec.Ip = &agentv1.IPConfig{Addresses: addresses, Gateway: gateway, DnsServers: dns}
		}
		if uidFlag.set {
			spec.SocketUid = &uid
		}
		if gidFlag.set {
			spec.SocketGid = &gid
		}
		if fs.Changed("port-security") {
			spec.PortSecurity = &portSecurity
		}
		spec.Bandwidth = bw.spec(nil)
		p, err := call(ctx, c, agentv1.AgentClient.CreatePort, &agentv1.CreatePortRequest{Spec: spec})
		if err != nil {
			return err
		}
		return c.printPort(p)
	}
}

func portDelSetup(*pflag.FlagSet) runFunc {
	return func(ctx context.Context, c *cli, args []string) error {
		resp, err := call(ctx, c, agentv1.AgentClient.DeletePort, &agentv1.DeletePortRequest{Id: args[0]})
		if err != nil {
			return err
		}
		if c.output == "json" {
			return writeJSON(c.stdout, portDelJSON{ID: args[0], Existed: resp.GetExisted()})
		}
		if resp.GetExisted() {
			_, err = fmt.Fprintf(c.stdout, "port %s deleted\n", args[0])
		} else {
			_, err = fmt.Fprintf(c.stdout, "port %s did not exist: nothing to delete\n", args[0])
		}
		return err
	}
}

type portDelJSON struct {
	ID      string `json:"id"`
	Existed bool   `json:"existed"`
}

func portShowSetup(*pflag.FlagSet) runFunc {
	return func(ctx context.Context, c *cli, args []string) error {
		p, err := call(ctx, c, agentv1.AgentClient.GetPort, &agentv1.GetPortRequest{Id: args[0]})
		if err != nil {
			return err
		}
		return c.printPort(p)
	}
}

func portListSetup(*pflag.FlagSet) runFunc {
	return func(ctx context.Context, c *cli, _ []string) error {
		resp, err := call(ctx, c, agentv1.AgentClient.ListPorts, &agentv1.ListPortsRequest{})
		if err != nil {
			return err
		}
		ports := resp.GetPorts()
		sort.SliceStable(ports, func(i, j int) bool { return ports[i].GetSpec().GetId() < ports[j].GetSpec().GetId() })
		if c.output == "json" {
			out := portListJSON{Ports: make([]portJSON, len(ports))}
			for i, p := range ports {
				out.Ports[i] = toPortJSON(p)
			}
			return writeJSON(c.stdout, out)
		}
		t := newTable(c.stdout)
		head := []string{"ID", "ROLE", "SOCKET", "QUEUES", "CONNECTED", "CONNECTS", "MTU", "POD"}
		if c.output == "wide" {
			head = append(head, "MAC", "POLLING", "CPUS")
		}
		t.row(head...)
		for _, p := range ports {
			j := toPortJSON(p)
			cells := []string{j.ID, j.Role, j.Socket,
				fmt.Sprintf("%d/%d", j.Status.EnabledPairs, j.QueuePairs),
				yesNo(j.Status.Connected), count(j.Status.Connects), fmt.Sprint(j.Status.MTU), pod(j.Labels)}
			if c.output == "wide" {
				cells = append(cells, j.MAC, j.Polling, joinInts(j.cpus()))
			}
			t.row(cells...)
		}
		return t.flush()
	}
}

type portListJSON struct {
	Ports []portJSON `json:"ports"`
}

// portJSON is a port as -o json prints it, defaults resolved (role
// client, polling adaptive, MTU 1500, socket mode 0750).
type portJSON struct {
	ID         string            `json:"id"`
	Socket     string            `json:"socket"`
	Role       string            `json:"role"`
	QueuePairs uint32            `json:"queue_pairs"`
	Slots      []string          `json:"slots"` // as requested; [] = any free
	MAC        string            `json:"mac"`
	MTU        uint32            `json:"mtu"`
	SocketUID  *uint32           `json:"socket_uid"` // null: the agent's default
	SocketGID  *uint32           `json:"socket_gid"`
	SocketMode string            `json:"socket_mode"` // octal, "0750"
	Polling    string            `json:"polling"`
	Labels     map[string]string `json:"labels"`
	Pod        string            `json:"pod"` // namespace/name from the labels, or ""
	Network    string            `json:"network"`
	VLAN       uint32            `json:"vlan"`
	VNI        uint32            `json:"vni,omitempty"`
	Uplink     string            `json:"uplink"`
	DHCP       bool              `json:"dhcp"`
	IP         *ipJSON           `json:"ip"` // null: none given
	// PortSecurity: the guest may send only from mac and ip.addresses.
	PortSecurity bool           `json:"port_security"`
	Bandwidth    *bandwidthJSON `json:"bandwidth"` // null: no rate limit
	Status       portStatusJSON `json:"status"`
}

type ipJSON struct {
	Addresses    []string    `json:"addresses"`
	Gateway      string      `json:"gateway"`
	Routes       []routeJSON `json:"routes"`
	DNSServers   []string    `json:"dns_servers"`
	DNSSearch    []string    `json:"dns_search"`
	LeaseSeconds uint32      `json:"lease_seconds"`
}

type routeJSON struct {
	Dst     string `json:"dst"`
	Gateway string `json:"gateway"`
}

func toIPJSON(ip *agentv1.IPConfig) *ipJSON {
	if ip == nil {
		return nil
	}
	j := &ipJSON{Addresses: append([]string{}, ip.GetAddresses()...), Gateway: ip.GetGateway(), Routes: []routeJSON{},
		DNSServers: append([]string{}, ip.GetDnsServers()...), DNSSearch: append([]string{}, ip.GetDnsSearch()...),
		LeaseSeconds: ip.GetLeaseSeconds()}
	for _, r := range ip.GetRoutes() {
		j.Routes = append(j.Routes, routeJSON{Dst: r.GetDst(), Gateway: r.GetGateway()})
	}
	return j
}

type portStatusJSON struct {
	Connected    bool             `json:"connected"`
	Connects     uint64           `json:"connects"`
	EnabledPairs uint32           `json:"enabled_pairs"`
	MTU          uint32           `json:"mtu"`
	Queues       []assignmentJSON `json:"queues"`
	Memory       memoryJSON       `json:"memory"`
	Faults       faultsJSON       `json:"faults"`
}

// memoryJSON says whether the frontend can take back the memory it
// shared: F_SEAL_SHRINK on the files behind its regions and dirty log.
type memoryJSON struct {
	Regions         uint32 `json:"regions"`
	ShrinkSealed    uint32 `json:"shrink_sealed"`
	Log             bool   `json:"log"`
	LogShrinkSealed bool   `json:"log_shrink_sealed"`
	Sealed          bool   `json:"sealed"` // nothing can be taken back
}

// faultsJSON counts sessions ended because the frontend took back memory.
type faultsJSON struct {
	GuestMemory uint64 `json:"guest_memory"`
	DirtyLog    uint64 `json:"dirty_log"`
}

type assignmentJSON struct {
	Pair uint32 `json:"pair"`
	Slot string `json:"slot"`
	CPU  int32  `json:"cpu"`
}

func roleName(r agentv1.Role) string {
	switch r {
	case agentv1.Role_ROLE_UNSPECIFIED, agentv1.Role_ROLE_CLIENT:
		return "client"
	case agentv1.Role_ROLE_SERVER:
		return "server"
	}
	return fmt.Sprintf("role-%d", int32(r))
}

func pollingName(p agentv1.PollingMode) string {
	switch p {
	case agentv1.PollingMode_POLLING_UNSPECIFIED, agentv1.PollingMode_POLLING_ADAPTIVE:
		return "adaptive"
	case agentv1.PollingMode_POLLING_INTERRUPT:
		return "interrupt"
	case agentv1.PollingMode_POLLING_BUSY:
		return "busy"
	}
	return fmt.Sprintf("polling-%d", int32(p))
}

func toPortJSON(p *agentv1.Port) portJSON {
	s, st := p.GetSpec(), p.GetStatus()
	j := portJSON{
		ID:         s.GetId(),
		Socket:     s.GetSocketPath(),
		Role:       roleName(s.GetRole()),
		QueuePairs: s.GetQueuePairs(),
		Slots:      append([]string{}, s.GetSlots()...),
		MAC:        s.GetMac(),
		MTU:        s.GetMtu(),
		SocketUID:  s.SocketUid,
		SocketGID:  s.SocketGid,
		SocketMode: fmt.Sprintf("%04o", s.GetSocketMode()),
		Polling:    pollingName(s.GetPolling()),
		Labels:     map[string]string{},
		Pod:        pod(s.GetLabels()),
		Network:    s.GetNetwork(),
		VLAN:       s.GetVlan(),
		VNI:        s.GetVni(),
		Uplink:     s.GetUplink(),
		DHCP:       s.GetDhcp(),
		IP:         toIPJSON(s.GetIp()),
		Status: portStatusJSON{
			Connected:    st.GetConnected(),
			Connects:     st.GetConnects(),
			EnabledPairs: st.GetEnabledPairs(),
			MTU:          st.GetMtu(),
			Queues:       []assignmentJSON{},
			Faults:       faultsJSON{GuestMemory: st.GetFaults().GetGuestMemory(), DirtyLog: st.GetFaults().GetDirtyLog()},
		},
	}
	j.PortSecurity = s.PortSecurityOn()
	j.Bandwidth = toBandwidthJSON(s.GetBandwidth())
	if m := st.GetMemory(); m != nil {
		j.Status.Memory = memoryJSON{Regions: m.GetRegions(), ShrinkSealed: m.GetShrinkSealed(), Log: m.GetLog(), LogShrinkSealed: m.GetLogShrinkSealed(),
			Sealed: m.GetShrinkSealed() == m.GetRegions() && (!m.GetLog() || m.GetLogShrinkSealed())}
	}
	if j.MTU == 0 {
		j.MTU = 1500
	}
	if s.GetSocketMode() == 0 {
		j.SocketMode = "0750"
	}
	if j.Status.MTU == 0 {
		j.Status.MTU = j.MTU
	}
	for k, v := range s.GetLabels() {
		j.Labels[k] = v
	}
	for _, q := range st.GetQueues() {
		j.Status.Queues = append(j.Status.Queues, assignmentJSON{Pair: q.GetPair(), Slot: q.GetSlot(), CPU: q.GetCpu()})
	}
	sort.Slice(j.Status.Queues, func(a, b int) bool { return j.Status.Queues[a].Pair < j.Status.Queues[b].Pair })
	return j
}

// cpus lists the CPUs serving the port's pairs.
func (j *portJSON) cpus() []int32 {
	seen := map[int32]bool{}
	var cpus []int32
	for _, q := range j.Status.Queues {
		if !seen[q.CPU] {
			seen[q.CPU] = true
			cpus = append(cpus, q.CPU)
		}
	}
	sort.Slice(cpus, func(a, b int) bool { return cpus[a] < cpus[b] })
	return cpus
}

// printPort prints one port in detail (port show, port add).
func (c *cli) printPort(p *agentv1.Port) error {
	j := toPortJSON(p)
	if c.output == "json" {
		return writeJSON(c.stdout, j)
	}
	return writePortDetail(c.stdout, j)
}

func writePortDetail(w io.Writer, j portJSON) error {
	t := newTable(w)
	t.row("ID:", j.ID)
	if j.Pod != "" {
		t.row("Pod:", j.Pod)
	}
	t.row("Role:", j.Role)
	t.row("Socket:", j.Socket)
	owner := func(id *uint32) string {
		if id == nil {
			return "default"
		}
		return fmt.Sprint(*id)
	}
	t.row("Socket owner:", fmt.Sprintf("uid %s, gid %s, directory mode %s", owner(j.SocketUID), owner(j.SocketGID), j.SocketMode))
	if j.MAC == "" {
		t.row("MAC:", "(not set)")
	} else {
		t.row("MAC:", j.MAC)
	}
	t.row("Port security:", portSecurityLine(j))
	t.row("Bandwidth:", bandwidthLine(j.Bandwidth))
	if j.Status.MTU != j.MTU {
		t.row("MTU:", fmt.Sprintf("%d (spec %d)", j.Status.MTU, j.MTU))
	} else {
		t.row("MTU:", fmt.Sprint(j.MTU))
	}
	t.row("Polling:", j.Polling)
	t.row("Queue pairs:", fmt.Sprintf("%d configured, %d enabled", j.QueuePairs, j.Status.EnabledPairs))
	if len(j.Slots) == 0 {
		t.row("Slots:", "any free")
	} else {
		t.row("Slots:", strings.Join(j.Slots, ","))
	}
	connects := "connects"
	if j.Status.Connects == 1 {
		connects = "connect"
	}
	t.row("Connected:", fmt.Sprintf("%s (%d %s)", yesNo(j.Status.Connected), j.Status.Connects, connects))
	if j.Status.Connected {
		t.row("Memory:", memorySealsLine(j.Status.Memory))
	}
	if f := j.Status.Faults; f.GuestMemory+f.DirtyLog > 0 {
		n := f.GuestMemory + f.DirtyLog
		sessions := "sessions"
		if n == 1 {
			sessions = "session"
		}
		t.row("Faults:", fmt.Sprintf("%d %s ended: the frontend took back memory it shared (guest memory %d, dirty log %d)",
			n, sessions, f.GuestMemory, f.DirtyLog))
	}
	if len(j.Labels) == 0 {
		t.row("Labels:", "(none)")
	} else {
		t.line("Labels:")
		for _, k := range sortedKeys(j.Labels) {
			t.row("  "+k, j.Labels[k])
		}
	}
	if len(j.Status.Queues) == 0 {
		t.row("Queues:", "(none assigned)")
	} else {
		t.line("Queues:")
		t.row("  PAIR", "SLOT", "CPU")
		for _, q := range j.Status.Queues {
			t.row(fmt.Sprintf("  %d", q.Pair), q.Slot, fmt.Sprint(q.CPU))
		}
	}
	return t.flush()
}

// portSecurityLine says which source addresses the guest may send from.
func portSecurityLine(j portJSON) string {
	if !j.PortSecurity {
		return "off: the guest may send from any address"
	}
	mac := "MAC taken from the guest's first frame"
	if j.MAC != "" {
		mac = "MAC " + j.MAC
	}
	var ips []string
	if j.IP != nil {
		for _, a := range j.IP.Addresses {
			if p, err := netip.ParsePrefix(a); err == nil {
				a = p.Addr().String()
			}
			ips = append(ips, a)
		}
	}
	if len(ips) == 0 {
		return "on: " + mac + ", IP fields not checked (no IPAM addresses)"
	}
	return "on: " + mac + ", IPs " + strings.Join(ips, ", ")
}

// memorySealsLine says whether the frontend can take its memory back.
func memorySealsLine(m memoryJSON) string {
	if m.Regions == 0 && !m.Log {
		return "(none mapped)"
	}
	s := fmt.Sprintf("%d of %d regions sealed against shrinking", m.ShrinkSealed, m.Regions)
	if m.Log {
		s += fmt.Sprintf(", dirty log %s", map[bool]string{true: "sealed", false: "unsealed"}[m.LogShrinkSealed])
	}
	if m.Sealed {
		return s + ": the frontend cannot take it back"
	}
	return s + ": the frontend can take memory back (its session then ends)"
}
