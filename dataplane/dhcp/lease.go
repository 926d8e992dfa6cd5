// Package dhcp is the dataplane's DHCPv4 server for guests (RFC 2131): it
// answers a port's guest with that port's one lease — the address, prefix,
// gateway, routes and DNS of the IPAM result the CNI handed over — so that
// a guest with a stock DHCP client comes up with the address Kubernetes
// shows. There is no pool and no lease database: a port has exactly one
// lease, fixed when the port is created.
//
// The parser is strict (the guest is not trusted): anything malformed is
// dropped and counted, never half-answered.
package dhcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Route is one classless static route (option 121).
type Route struct {
	Dst netip.Prefix
	Via netip.Addr // the next hop; the unspecified address means on-link
}

// Lease is what one guest gets.
type Lease struct {
	// MAC is the guest's address: only a client with this chaddr is
	// answered. Zero means any client on the port.
	MAC [6]byte
	// Addr is the guest's address and prefix, e.g. 10.1.2.3/24.
	Addr netip.Prefix
	// Gateway is the default router (option 3); invalid means none.
	Gateway netip.Addr
	// Routes are sent as option 121; the default route via Gateway is
	// added to them, since a client that uses option 121 ignores option 3.
	Routes []Route
	DNS    []netip.Addr
	// Search is the DNS search list (option 119; the first also as the
	// domain name, option 15).
	Search []string
	// LeaseTime is the lease duration (option 51); 0 means DefaultLeaseTime.
	LeaseTime time.Duration
	// MTU is the interface MTU (option 26); 0 means not sent.
	MTU int
	// ServerID is the server identifier (option 54) and the replies'
	// source address; invalid means the gateway, else the first other
	// address of the subnet.
	ServerID netip.Addr
}

// DefaultLeaseTime is a day: the address never changes while the port
// lives, so renewals need not be frequent.
const DefaultLeaseTime = 24 * time.Hour

// Bounds on a lease, so that the reply always fits the 576-byte message
// every client must accept.
const (
	MaxRoutes = 16
	MaxDNS    = 4
	MaxSearch = 6
	minMTU    = 68
	maxMTU    = 9702
)

// Validate checks a lease and names the first bad field.
func (l *Lease) Validate() error {
	if !l.Addr.IsValid() || !l.Addr.Addr().Is4() {
		return fmt.Errorf("address: %v is not an IPv4 address with a prefix", l.Addr)
	}
	a := l.Addr.Addr()
	if l.Addr.Bits() < 1 || l.Addr.Bits() > 32 {
		return fmt.Errorf("address: prefix /%d is outside /1../32", l.Addr.Bits())
	}
	if a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return fmt.Errorf("address: %v cannot be a guest's address", a)
	}
	if l.Addr.Bits() <= 30 && (a == l.Addr.Masked().Addr() || a == broadcast(l.Addr)) {
		return fmt.Errorf("address: %v is the network or broadcast address of %v", a, l.Addr.Masked())
	}
	if l.Gateway.IsValid() {
		if !l.Gateway.Is4() || l.Gateway.IsUnspecified() || l.Gateway.IsMulticast() {
			return fmt.Errorf("gateway: %v is not a unicast IPv4 address", l.Gateway)
		}
		if l.Gateway == a {
			return fmt.Errorf("gateway: %v is the guest's own address", l.Gateway)
		}
	}
	if len(l.Routes) > MaxRoutes {
		return fmt.Errorf("routes: %d routes; at most %d", len(l.Routes), MaxRoutes)
	}
	for i, r := range l.Routes {
		if !r.Dst.IsValid() || !r.Dst.Addr().Is4() {
			return fmt.Errorf("routes[%d].dst: %v is not an IPv4 prefix", i, r.Dst)
		}
		if r.Dst.Masked() != r.Dst {
			return fmt.Errorf("routes[%d].dst: %v has host bits set (want %v)", i, r.Dst, r.Dst.Masked())
		}
		if !r.Via.IsValid() {
			if l.Gateway.IsValid() {
				continue // via the gateway, filled in by encode
			}
			return fmt.Errorf("routes[%d].via: missing and the lease has no gateway", i)
		}
		if !r.Via.Is4() || r.Via.IsMulticast() {
			return fmt.Errorf("routes[%d].via: %v is not a unicast IPv4 address", i, r.Via)
		}
	}
	if len(l.DNS) > MaxDNS {
		return fmt.Errorf("dns: %d servers; at most %d", len(l.DNS), MaxDNS)
	}
	for i, d := range l.DNS {
		if !d.Is4() || d.IsUnspecified() || d.IsMulticast() {
			return fmt.Errorf("dns[%d]: %v is not a unicast IPv4 address", i, d)
		}
	}
	if len(l.Search) > MaxSearch {
		return fmt.Errorf("search: %d domains; at most %d", len(l.Search), MaxSearch)
	}
	for i, s := range l.Search {
		if err := checkDomain(s); err != nil {
			return fmt.Errorf("search[%d]: %w", i, err)
		}
	}
	if l.LeaseTime < 0 || l.LeaseTime > 0 && l.LeaseTime < time.Minute || l.LeaseTime > 365*24*time.Hour {
		return fmt.Errorf("leaseTime: %v is outside 1m..8760h", l.LeaseTime)
	}
	if l.MTU != 0 && (l.MTU < minMTU || l.MTU > maxMTU) {
		return fmt.Errorf("mtu: %d is outside %d..%d", l.MTU, minMTU, maxMTU)
	}
	if l.ServerID.IsValid() && (!l.ServerID.Is4() || l.ServerID == a || l.ServerID.IsUnspecified() || l.ServerID.IsMulticast()) {
		return fmt.Errorf("serverID: %v is not a unicast IPv4 address other than the guest's", l.ServerID)
	}
	if l.MAC[0]&1 != 0 {
		return fmt.Errorf("mac: %x is a multicast address", l.MAC)
	}
	return nil
}

// checkDomain accepts a DNS name of letters, digits, hyphens and dots, as
// resolv.conf takes it.
func checkDomain(s string) error {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return fmt.Errorf("%q is not a domain name", s)
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%q is not a domain name", s)
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("%q is not a domain name", s)
			}
		}
	}
	return nil
}

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(a[:]) | (1<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(a[:], v)
	return netip.AddrFrom4(a)
}

func mask(bits int) [4]byte {
	var m [4]byte
	binary.BigEndian.PutUint32(m[:], ^uint32(0)<<(32-bits))
	return m
}

// serverID picks the server identifier: configured, else the gateway,
// else the first address of the subnet that is not the guest's.
func (l *Lease) serverID() netip.Addr {
	if l.ServerID.IsValid() {
		return l.ServerID
	}
	if l.Gateway.IsValid() {
		return l.Gateway
	}
	first := l.Addr.Masked().Addr()
	if l.Addr.Bits() <= 30 {
		first = first.Next()
	}
	if first == l.Addr.Addr() {
		first = first.Next()
	}
	return first
}

var errTooLong = errors.New("options do not fit a 576-byte message")

// options encodes the configuration options every reply carries (all but
// message type, server identifier and the lease times), once per lease.
func (l *Lease) options() ([]byte, error) {
	var b []byte
	m := mask(l.Addr.Bits())
	b = append(b, optSubnetMask, 4)
	b = append(b, m[:]...)
	if l.Addr.Bits() <= 30 {
		bc := broadcast(l.Addr).As4()
		b = append(b, optBroadcast, 4)
		b = append(b, bc[:]...)
	}
	if l.Gateway.IsValid() {
		g := l.Gateway.As4()
		b = append(b, optRouter, 4)
		b = append(b, g[:]...)
	}
	if len(l.Routes) > 0 {
		var r []byte
		hasDefault := false
		for _, rt := range l.Routes {
			via := rt.Via
			if !via.IsValid() {
				via = l.Gateway
			}
			hasDefault = hasDefault || rt.Dst.Bits() == 0
			r = appendRoute(r, rt.Dst, via)
		}
		if !hasDefault && l.Gateway.IsValid() {
			r = appendRoute(r, netip.PrefixFrom(netip.IPv4Unspecified(), 0), l.Gateway)
		}
		if len(r) > 255 {
			return nil, errTooLong
		}
		b = append(b, optClasslessRoutes, byte(len(r)))
		b = append(b, r...)
	}
	if len(l.DNS) > 0 {
		b = append(b, optDNS, byte(4*len(l.DNS)))
		for _, d := range l.DNS {
			a := d.As4()
			b = append(b, a[:]...)
		}
	}
	if len(l.Search) > 0 {
		first := strings.TrimSuffix(l.Search[0], ".")
		b = append(b, optDomainName, byte(len(first)))
		b = append(b, first...)
		var s []byte
		for _, d := range l.Search {
			s = appendDomain(s, d)
		}
		if len(s) > 255 {
			return nil, errTooLong
		}
		b = append(b, optDomainSearch, byte(len(s)))
		b = append(b, s...)
	}
	if l.MTU != 0 {
		b = append(b, optMTU, 2, byte(l.MTU>>8), byte(l.MTU))
	}
	// fixed part (236) + magic (4) + type (3) + server ID (6) + three
	// times (18) + end (1) + these, in 576 - 28 bytes of IP and UDP
	if 236+4+3+6+18+1+len(b) > minMessage {
		return nil, errTooLong
	}
	return b, nil
}

// appendRoute encodes one RFC 3442 route: the prefix length, the
// significant octets of the destination, the router.
func appendRoute(b []byte, dst netip.Prefix, via netip.Addr) []byte {
	b = append(b, byte(dst.Bits()))
	d := dst.Addr().As4()
	b = append(b, d[:(dst.Bits()+7)/8]...)
	v := via.As4()
	return append(b, v[:]...)
}

// appendDomain encodes a name as RFC 1035 labels, uncompressed (RFC 3397
// allows it).
func appendDomain(b []byte, name string) []byte {
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		b = append(b, byte(len(label)))
		b = append(b, label...)
	}
	return append(b, 0)
}
