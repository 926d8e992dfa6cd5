package agent

import (
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
)

// Defaults applied to a spec before it is compared, stored or used.
const (
	DefaultMTU        = 1500
	DefaultSocketMode = 0o750
	maxLabels         = 32
	maxSunPath        = 108
)

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,63}$`)

func invalid(field, format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "spec.%s: %s", field, fmt.Sprintf(format, args...))
}

// normalize returns a copy of spec with defaults filled in, so that two
// requests that mean the same port compare equal.
func normalize(spec *agentv1.PortSpec) *agentv1.PortSpec {
	n := clone(spec)
	if n.Role == agentv1.Role_ROLE_UNSPECIFIED {
		n.Role = agentv1.Role_ROLE_CLIENT
	}
	if n.Mtu == 0 {
		n.Mtu = DefaultMTU
	}
	if n.SocketMode == 0 {
		n.SocketMode = DefaultSocketMode
	}
	if n.Polling == agentv1.PollingMode_POLLING_UNSPECIFIED {
		n.Polling = agentv1.PollingMode_POLLING_ADAPTIVE
	}
	if n.Mac != "" {
		if mac, err := net.ParseMAC(n.Mac); err == nil {
			n.Mac = mac.String()
		}
	}
	normalizeIP(n.Ip)
	if n.Uplink == "" {
		n.Uplink = UplinkNone
	}
	if n.PortSecurityOn() {
		// Unset is on: stored only when off, so a state file without
		// ports that turn it off stays readable by older agents.
		n.PortSecurity = nil
	}
	n.Bandwidth = normalizeBandwidth(n.Bandwidth)
	return n
}

// validate checks a normalized spec against this node and names the first
// bad field.
func (a *Agent) validate(s *agentv1.PortSpec, static bool) error {
	if s == nil {
		return status.Error(codes.InvalidArgument, "spec: missing")
	}
	if !idPattern.MatchString(s.Id) {
		return invalid("id", "%q must be 1..63 characters of A-Z a-z 0-9 . _ -", s.Id)
	}
	p := s.SocketPath
	switch {
	case p == "":
		return invalid("socket_path", "must not be empty")
	case !filepath.IsAbs(p) || filepath.Clean(p) != p:
		return invalid("socket_path", "%q must be an absolute, clean path", p)
	case len(p) >= maxSunPath:
		return invalid("socket_path", "%q is %d bytes; a unix socket path must be shorter than %d", p, len(p), maxSunPath)
	case !static && !under(p, a.cfg.SocketRoot):
		return invalid("socket_path", "%q is not under the socket root %s", p, a.cfg.SocketRoot)
	case p == a.cfg.APISocket:
		return invalid("socket_path", "%q is the agent's API socket", p)
	}
	if _, ok := agentv1.Role_name[int32(s.Role)]; !ok {
		return invalid("role", "%d is not server or client", s.Role)
	}
	if s.QueuePairs < 1 || s.QueuePairs > vhostuser.MaxQueuePairs {
		return invalid("queue_pairs", "%d is outside 1..%d", s.QueuePairs, vhostuser.MaxQueuePairs)
	}
	seen := map[string]bool{}
	for i, id := range s.Slots {
		if a.slotByID(id) == nil {
			return invalid(fmt.Sprintf("slots[%d]", i), "%q is not a queue slot of this node (see GetCapacity)", id)
		}
		if seen[id] {
			return invalid(fmt.Sprintf("slots[%d]", i), "%q is listed twice", id)
		}
		seen[id] = true
	}
	if len(s.Slots) > int(s.QueuePairs) {
		return invalid("slots", "%d slots for %d queue pairs", len(s.Slots), s.QueuePairs)
	}
	if s.Mac != "" {
		mac, err := net.ParseMAC(s.Mac)
		if err != nil || len(mac) != 6 {
			return invalid("mac", "%q is not an Ethernet address like 52:54:00:12:34:56", s.Mac)
		}
		if mac[0]&1 != 0 {
			return invalid("mac", "%q is a multicast address", s.Mac)
		}
	}
	if s.Mtu < netdev.MinMTU || s.Mtu > netdev.MaxMTU {
		return invalid("mtu", "%d is outside %d..%d", s.Mtu, netdev.MinMTU, netdev.MaxMTU)
	}
	if s.SocketMode&^0o770 != 0 {
		return invalid("socket_mode", "%#o is wider than 0770 (socket directories are never world-accessible)", s.SocketMode)
	}
	if _, ok := agentv1.PollingMode_name[int32(s.Polling)]; !ok {
		return invalid("polling", "%d is not interrupt, adaptive or busy", s.Polling)
	}
	if len(s.Labels) > maxLabels {
		return invalid("labels", "%d labels; at most %d", len(s.Labels), maxLabels)
	}
	for k, v := range s.Labels {
		if k == "" || len(k) > 253 || len(v) > 1024 || strings.ContainsAny(k, " \t\n") {
			return invalid("labels", "label %q is empty, too long or has spaces", k)
		}
	}
	if err := validateBandwidth("spec.", s.Bandwidth); err != nil {
		return err
	}
	return a.validateNetwork(s)
}

// under reports whether path lies strictly below root.
func under(path, root string) bool {
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
}

// firstDifference names the first field in which two normalized specs
// differ, for AlreadyExists errors.
func firstDifference(a, b *agentv1.PortSpec) string {
	switch {
	case a.SocketPath != b.SocketPath:
		return "socket_path"
	case a.Role != b.Role:
		return "role"
	case a.QueuePairs != b.QueuePairs:
		return "queue_pairs"
	case strings.Join(a.Slots, ",") != strings.Join(b.Slots, ","):
		return "slots"
	case a.Mac != b.Mac:
		return "mac"
	case a.Mtu != b.Mtu:
		return "mtu"
	case a.SocketUid == nil != (b.SocketUid == nil) || a.SocketUid != nil && *a.SocketUid != *b.SocketUid:
		return "socket_uid"
	case a.SocketGid == nil != (b.SocketGid == nil) || a.SocketGid != nil && *a.SocketGid != *b.SocketGid:
		return "socket_gid"
	case a.SocketMode != b.SocketMode:
		return "socket_mode"
	case a.Polling != b.Polling:
		return "polling"
	case !sameLabels(a.Labels, b.Labels):
		return "labels"
	case a.Network != b.Network:
		return "network"
	case a.Vlan != b.Vlan:
		return "vlan"
	case !proto.Equal(a.Ip, b.Ip):
		return "ip"
	case a.Dhcp != b.Dhcp:
		return "dhcp"
	case a.Uplink != b.Uplink:
		return "uplink"
	case a.Vni != b.Vni:
		return "vni"
	case a.PortSecurityOn() != b.PortSecurityOn():
		return "port_security"
	case !proto.Equal(a.Bandwidth, b.Bandwidth):
		return "bandwidth"
	}
	return ""
}

func sameLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
