package agent

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/dhcp"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
)

// Uplink kinds a network may name.
const (
	UplinkNone  = "none"
	UplinkTap   = "tap"
	UplinkAFXDP = "af_xdp"
	UplinkVXLAN = "vxlan"
)

// networkPattern admits NAD names (namespace/name) and plain names.
var networkPattern = regexp.MustCompile(`^[A-Za-z0-9._/-]{0,253}$`)

const maxAddresses = 8

// normalizeIP rewrites the addresses of an IP configuration in their
// canonical form, so that equal configurations compare equal.
func normalizeIP(ip *agentv1.IPConfig) {
	if ip == nil {
		return
	}
	for i, a := range ip.Addresses {
		if p, err := netip.ParsePrefix(a); err == nil {
			ip.Addresses[i] = p.String()
		}
	}
	if a, err := netip.ParseAddr(ip.Gateway); err == nil {
		ip.Gateway = a.String()
	}
	for _, r := range ip.Routes {
		if p, err := netip.ParsePrefix(r.GetDst()); err == nil {
			r.Dst = p.String()
		}
		if a, err := netip.ParseAddr(r.GetGateway()); err == nil {
			r.Gateway = a.String()
		}
	}
	for i, d := range ip.DnsServers {
		if a, err := netip.ParseAddr(d); err == nil {
			ip.DnsServers[i] = a.String()
		}
	}
	for i, s := range ip.DnsSearch {
		ip.DnsSearch[i] = strings.ToLower(strings.TrimSuffix(s, "."))
	}
}

// validateNetwork checks network, vlan, ip and dhcp, naming the field.
func (a *Agent) validateNetwork(s *agentv1.PortSpec) error {
	if !networkPattern.MatchString(s.Network) {
		return invalid("network", "%q must be 0..253 characters of A-Z a-z 0-9 . _ / -", s.Network)
	}
	if s.Vlan > vswitch.MaxVLAN {
		return invalid("vlan", "%d is outside 0..%d", s.Vlan, vswitch.MaxVLAN)
	}
	switch {
	case s.Uplink == UplinkVXLAN && (s.Vni == 0 || s.Vni > vxlan.MaxVNI):
		return invalid("vni", "%d is outside 1..%d (a network on the vxlan uplink needs one)", s.Vni, vxlan.MaxVNI)
	case s.Uplink == UplinkVXLAN && s.Vlan != 0:
		return invalid("vlan", "%d, but on the vxlan uplink a network is told apart by its vni, not a VLAN", s.Vlan)
	case s.Uplink != UplinkVXLAN && s.Vni != 0:
		return invalid("vni", "%d, but uplink is %q: a vni is for the vxlan uplink", s.Vni, s.Uplink)
	}
	switch s.Uplink {
	case UplinkNone:
	case UplinkTap, UplinkAFXDP, UplinkVXLAN:
		if !a.dp.HasUplink(s.Uplink) {
			return status.Errorf(codes.FailedPrecondition, "spec.uplink: %q, but this node has no %s uplink (agent config uplink.%s)", s.Uplink, s.Uplink, s.Uplink)
		}
		if err := a.dp.UplinkHealth(); err != nil {
			return status.Errorf(codes.FailedPrecondition, "spec.uplink: the %s uplink cannot carry traffic: %v", s.Uplink, err)
		}
		if err := a.dp.CheckUplinkMTU(int(s.Mtu)); err != nil {
			return status.Errorf(codes.FailedPrecondition, "spec.%v", err)
		}
	default:
		return invalid("uplink", "%q is not %q, %q, %q or %q", s.Uplink, UplinkNone, UplinkTap, UplinkAFXDP, UplinkVXLAN)
	}
	for _, r := range a.ports {
		if r.spec.Id == s.Id || r.spec.Network != s.Network {
			continue
		}
		if r.spec.Vlan != s.Vlan {
			return invalid("vlan", "%d, but port %q of network %q has vlan %d", s.Vlan, r.spec.Id, s.Network, r.spec.Vlan)
		}
		if r.spec.Uplink != s.Uplink {
			return invalid("uplink", "%q, but port %q of network %q has uplink %q", s.Uplink, r.spec.Id, s.Network, r.spec.Uplink)
		}
		if r.spec.Vni != s.Vni {
			return invalid("vni", "%d, but port %q of network %q has vni %d", s.Vni, r.spec.Id, s.Network, r.spec.Vni)
		}
	}
	if s.Ip == nil {
		if s.Dhcp {
			return invalid("ip", "missing; dhcp needs the port's IP configuration")
		}
		return nil
	}
	_, err := leaseOf(s)
	return err
}

// leaseOf turns a port's IP configuration into its DHCP lease (the first
// IPv4 address; IPv6 addresses are accepted and not served), naming the
// bad field.
func leaseOf(s *agentv1.PortSpec) (*dhcp.Lease, error) {
	ip := s.Ip
	l := &dhcp.Lease{MTU: int(s.Mtu), LeaseTime: time.Duration(ip.LeaseSeconds) * time.Second}
	if len(ip.Addresses) > maxAddresses {
		return nil, invalid("ip.addresses", "%d addresses; at most %d", len(ip.Addresses), maxAddresses)
	}
	field := "ip.addresses"
	for i, a := range ip.Addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return nil, invalid(fmt.Sprintf("ip.addresses[%d]", i), "%q is not an address with a prefix like 10.1.2.3/24", a)
		}
		if p.Addr().Is4() && !l.Addr.IsValid() {
			l.Addr, field = p, fmt.Sprintf("ip.addresses[%d]", i)
		}
	}
	if !l.Addr.IsValid() {
		if s.Dhcp {
			return nil, invalid("ip.addresses", "no IPv4 address for dhcp to hand out")
		}
		l.Addr = netip.MustParsePrefix("192.0.2.2/24") // checks the rest against a placeholder
	}
	if ip.Gateway != "" {
		g, err := netip.ParseAddr(ip.Gateway)
		if err != nil {
			return nil, invalid("ip.gateway", "%q is not an IP address", ip.Gateway)
		}
		if g.Is4() {
			l.Gateway = g
		}
	}
	if len(ip.Routes) > dhcp.MaxRoutes {
		return nil, invalid("ip.routes", "%d routes; at most %d", len(ip.Routes), dhcp.MaxRoutes)
	}
	for i, r := range ip.Routes {
		dst, err := netip.ParsePrefix(r.GetDst())
		if err != nil {
			return nil, invalid(fmt.Sprintf("ip.routes[%d].dst", i), "%q is not a prefix like 192.168.0.0/16", r.GetDst())
		}
		if dst.Masked() != dst {
			return nil, invalid(fmt.Sprintf("ip.routes[%d].dst", i), "%q has host bits set (want %v)", r.GetDst(), dst.Masked())
		}
		var via netip.Addr
		if r.GetGateway() != "" {
			if via, err = netip.ParseAddr(r.GetGateway()); err != nil {
				return nil, invalid(fmt.Sprintf("ip.routes[%d].gateway", i), "%q is not an IP address", r.GetGateway())
			}
		}
		if !dst.Addr().Is4() {
			continue // IPv6 routes: not DHCPv4's
		}
		if !via.IsValid() && !l.Gateway.IsValid() {
			return nil, invalid(fmt.Sprintf("ip.routes[%d].gateway", i), "missing, and ip.gateway is not an IPv4 address")
		}
		if via.IsValid() && !via.Is4() {
			return nil, invalid(fmt.Sprintf("ip.routes[%d].gateway", i), "%q is not IPv4 like its destination", r.GetGateway())
		}
		l.Routes = append(l.Routes, dhcp.Route{Dst: dst, Via: via})
	}
	if len(ip.DnsServers) > dhcp.MaxDNS {
		return nil, invalid("ip.dns_servers", "%d servers; at most %d", len(ip.DnsServers), dhcp.MaxDNS)
	}
	for i, d := range ip.DnsServers {
		a, err := netip.ParseAddr(d)
		if err != nil || a.IsUnspecified() || a.IsMulticast() {
			return nil, invalid(fmt.Sprintf("ip.dns_servers[%d]", i), "%q is not a unicast IP address", d)
		}
		if a.Is4() {
			l.DNS = append(l.DNS, a)
		}
	}
	if len(ip.DnsSearch) > dhcp.MaxSearch {
		return nil, invalid("ip.dns_search", "%d domains; at most %d", len(ip.DnsSearch), dhcp.MaxSearch)
	}
	l.Search = ip.DnsSearch
	if ip.LeaseSeconds != 0 && (ip.LeaseSeconds < 60 || ip.LeaseSeconds > 365*24*3600) {
		return nil, invalid("ip.lease_seconds", "%d is outside 60..31536000", ip.LeaseSeconds)
	}
	if s.Mac != "" {
		if mac, err := net.ParseMAC(s.Mac); err == nil && len(mac) == 6 {
			l.MAC = [6]byte(mac)
		}
	}
	if err := l.Validate(); err != nil {
		// what is left: semantic checks (network address, gateway = own
		// address, search domain syntax, ...); name the spec's field
		msg := err.Error()
		for _, m := range []struct{ lease, spec string }{
			{"address:", field + ":"}, {"gateway:", "ip.gateway:"}, {"search", "ip.dns_search"},
			{"routes", "ip.routes"}, {"dns", "ip.dns_servers"}, {"mtu:", "mtu:"}, {"mac:", "mac:"},
		} {
			if strings.HasPrefix(msg, m.lease) {
				msg = m.spec + strings.TrimPrefix(msg, m.lease)
				break
			}
		}
		return nil, invalid(strings.SplitN(msg, ":", 2)[0], "%s", strings.TrimSpace(strings.SplitN(msg, ":", 2)[1]))
	}
	if _, err := dhcp.NewServer(*l, [6]byte{}); err != nil {
		return nil, invalid("ip", "%v", err)
	}
	return l, nil
}
