package dataplane

// Port security: what a guest port may send. Checked per frame in
// classify (direct chains) and txWalk (the rest), on a copy of the
// frame's head (scratch.snap, the walker's peek) that is also what the
// destinations get: the guest cannot rewrite a field between the check
// and the copy.

import (
	"encoding/binary"
	"math/bits"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// PortSecurity says which source addresses a guest port may send from.
// On (the zero value), a frame must come from the port's own MAC
// (netdev.Config.MAC), in the Ethernet header and in the ARP and NDP
// link-layer address fields, and, when IPs are given, carry one of them
// in its ARP sender, IPv4 source, IPv6 source and NDP advertised target
// fields; anything else is dropped and counted (drops.spoofed), so one
// VM cannot take another's traffic by sending from its addresses. A
// guest port's frames carry no VLAN tag (its network adds the tag on the
// uplink).
//
// A port given no MAC takes the first unicast source its guest sends
// that no other port of its network owns, for the length of its session.
type PortSecurity struct {
	// Off lets the guest send from any address and have every source it
	// uses learned: for guests that bridge or route other hosts' frames.
	Off bool
	// IPs the guest may send from, from the pod's IPAM. A family IPAM gave
	// no address of is not checked (an IPv4-only network leaves the
	// guest's IPv6 alone). The unspecified addresses (0.0.0.0 for DHCP and
	// ARP probes, :: for duplicate address detection) are always allowed,
	// and with IPv6 addresses the link-local address derived from the
	// port's MAC (modified EUI-64, as OVN allows): a guest that forms
	// stable-privacy link-local addresses must use EUI-64 ones, or have
	// port security off.
	IPs []netip.Addr
}

// snapMax bounds the frame head the walker's check reads: an NDP advertisement with
// its link-layer option is 86 bytes. An NDP frame whose options go past
// it is refused rather than half checked.
const snapMax = 128

// guardMode is how much of a frame the port's security checks.
type guardMode uint8

const (
	guardOff guardMode = iota // any source; learned
	guardMAC                  // the port's MAC: Ethernet source, ARP sender, NDP link-layer options
	guardIP                   // and the port's IPs
)

// guard is a port's PortSecurity as the workers apply it.
type guard struct {
	mode   guardMode
	sticky bool                      // no MAC was given: the guest's first source is claimed
	mac    uint64                    // the port's MAC (a Key) when not sticky
	claim  atomic.Pointer[stickyMAC] // sticky: this session's address
	v4     []uint32                  // allowed IPv4 sources
	v6     [][16]byte                // allowed IPv6 sources (the derived link-local one included)
}

// stickyMAC is the address a port given no MAC claimed, and the session
// (netdev.Port.Connects) it was claimed in.
type stickyMAC struct {
	key     uint64
	session uint64
}

func newGuard(sec PortSecurity, mac net.HardwareAddr) *guard {
	g := &guard{mode: guardMAC}
	if sec.Off {
		g.mode = guardOff
		return g
	}
	if len(mac) == 6 {
		var m vswitch.MAC
		copy(m[:], mac)
		g.mac = vswitch.KeyOf(m)
	} else {
		g.sticky = true
	}
	if len(sec.IPs) == 0 {
		return g
	}
	g.mode = guardIP
	for _, ip := range sec.IPs {
		ip = ip.Unmap()
		if ip.Is4() {
			a := ip.As4()
			g.v4 = append(g.v4, binary.BigEndian.Uint32(a[:]))
		} else {
			g.v6 = append(g.v6, ip.As16())
		}
	}
	if len(g.v6) > 0 && !g.sticky {
		g.v6 = append(g.v6, linkLocal(mac))
	}
	return g
}

// linkLocal is the IPv6 link-local address a guest forms from mac
// (modified EUI-64, RFC 4291 appendix A).
func linkLocal(mac net.HardwareAddr) [16]byte {
	return [16]byte{0: 0xfe, 1: 0x80, 8: mac[0] ^ 2, 9: mac[1], 10: mac[2], 11: 0xff, 12: 0xfe, 13: mac[3], 14: mac[4], 15: mac[5]}
}

// burstMAC is the source a burst's frames must carry: the port's MAC,
// its sticky claim in session, or noKey when it has none yet.
func (g *guard) burstMAC(session uint64) uint64 {
	if !g.sticky {
		return g.mac
	}
	if c := g.claim.Load(); c != nil && c.session == session {
		return c.key
	}
	return noKey
}

const (
	etherARP  = 0x0806
	etherIPv4 = 0x0800
	etherIPv6 = 0x86dd
	etherVLAN = 0x8100
	etherQinQ = 0x88a8
)

// check decides a frame whose source address is already known to be the
// port's, from snap (a copy of its first bytes, len(snap) = min(frame
// length, snapMax), at least an Ethernet header). It returns whether the
// frame may go and how many leading bytes the decision read: the ones a
// destination must get from snap, not from the guest's buffer.
func (g *guard) check(snap []byte, mac uint64) (ok bool, n int) {
	switch binary.BigEndian.Uint16(snap[12:14]) {
	case etherARP:
		// htype Ethernet, ptype IPv4, hlen 6, plen 4; then sha, spa
		if len(snap) < 42 {
			return false, 0
		}
		if h := binary.BigEndian.Uint64(snap[14:22]); h>>16 != 0x000108000604 || (h&0xffff != 1 && h&0xffff != 2) {
			return false, 0
		}
		if vswitch.Key(snap[22:28]) != mac {
			return false, 0
		}
		return verdict(g.mode != guardIP || g.allows4(binary.BigEndian.Uint32(snap[28:32])), 42)
	case etherIPv4:
		if g.mode != guardIP {
			return true, 14
		}
		if len(snap) < 34 {
			return false, 0
		}
		return verdict(g.allows4(binary.BigEndian.Uint32(snap[26:30])), 34)
	case etherIPv6:
		if len(snap) < 54 {
			return verdict(g.mode != guardIP, 14)
		}
		if g.mode == guardIP && !g.allows6(snap[22:38]) {
			return false, 0
		}
		if snap[20] != 58 || len(snap) < 58 { // not ICMPv6 right after the header
			return true, 54
		}
		return g.checkNDP(snap, mac)
	case etherVLAN, etherQinQ:
		return false, 0
	}
	return true, 14
}

// verdict is check's answer: n bytes read when ok, 0 when not.
func verdict(ok bool, n int) (bool, int) {
	if !ok {
		return false, 0
	}
	return true, n
}

// checkNDP checks the NDP messages that claim addresses: a router or
// neighbour solicitation's source link-layer option, a neighbour
// advertisement's target address and target link-layer option.
func (g *guard) checkNDP(snap []byte, mac uint64) (bool, int) {
	opts := 0
	switch snap[54] { // ICMPv6 type
	case 133: // router solicitation
		opts = 54 + 8
	case 135: // neighbour solicitation
		opts = 54 + 24
	case 136: // neighbour advertisement
		if len(snap) < 78 || (g.mode == guardIP && !g.allows6(snap[62:78])) {
			return false, 0
		}
		opts = 54 + 24
	default:
		return true, 58
	}
	if len(snap) < opts {
		return false, 0
	}
	// options: type, length in 8-byte units, data
	i := opts
	for i < len(snap) {
		if i+2 > len(snap) || snap[i+1] == 0 {
			return false, 0
		}
		end := i + 8*int(snap[i+1])
		if end > len(snap) {
			return false, 0 // runs past what was read (or the frame)
		}
		if (snap[i] == 1 || snap[i] == 2) && vswitch.Key(snap[i+2:i+8]) != mac { // source or target link-layer address
			return false, 0
		}
		i = end
	}
	return true, i
}

func (g *guard) allows4(ip uint32) bool {
	if ip == 0 || len(g.v4) == 0 {
		return true // DHCP, ARP probes; or IPAM gave no IPv4 address: not checked
	}
	for _, a := range g.v4 {
		if a == ip {
			return true
		}
	}
	return false
}

func (g *guard) allows6(ip []byte) bool {
	a := [16]byte(ip)
	if a == ([16]byte{}) || len(g.v6) == 0 {
		return true // duplicate address detection; or IPAM gave no IPv6 address: not checked
	}
	for _, b := range g.v6 {
		if a == b {
			return true
		}
	}
	return false
}

// checks is check for a frame whose head the walker read (its peek).
func (g *guard) checks(head []byte, mac uint64) bool {
	ok, _ := g.check(head[:min(len(head), snapMax)], mac)
	return ok
}

// claimMAC lets a port given no MAC take smac as its address for this
// session, when it has none yet, smac is a unicast address no other port
// of its network owns and not the node's own: the burst's frames must
// carry it from then on. It reports whether smac is now the port's.
func (w *worker) claimMAC(b *txBurst, smac uint64) bool {
	src := b.src
	g := src.guard
	if !g.sticky || b.mac != noKey || vswitch.KeyIsMulticast(smac) || smac == 0 || w.dp.reserved(smac) {
		return false
	}
	mac := vswitch.MACOf(smac)
	if ownedByOther(src, mac) {
		return false
	}
	session := src.dev.Connects()
	old := g.claim.Load()
	if old != nil && old.session == session {
		return false // another pair's worker claimed one first
	}
	if !g.claim.CompareAndSwap(old, &stickyMAC{key: smac, session: session}) {
		return false
	}
	if old != nil && old.key != smac {
		src.net.macs.Unpin(vswitch.MACOf(old.key), src)
	}
	src.net.macs.Pin(mac, src, b.now)
	b.mac = smac
	w.dp.log.Info("port given no MAC took its guest's first source address", "port", src.dev.Name(), "mac", net.HardwareAddr(mac[:]).String(), "session", session)
	return true
}

// reserved reports whether k is one of the node's own addresses.
func (d *Dataplane) reserved(k uint64) bool {
	own := d.own.Load()
	if own == nil {
		return false
	}
	_, ok := (*own)[k]
	return ok
}

// pinOwn makes a secured port's configured MAC its entry in the MAC
// table, unless another port has it (two ports of one VM during a live
// migration on one node): that one keeps it until this one's guest
// speaks or announces itself.
func (d *Dataplane) pinOwn(p *port) {
	if p.guard.mode == guardOff || p.mac == noKey {
		return
	}
	mac := vswitch.MACOf(p.mac)
	if ownedByOther(p, mac) {
		return
	}
	p.net.macs.Pin(mac, p, time.Now().UnixNano())
}

// repin gives the addresses a removed port owned to another port of its
// network configured with the same MAC (the other side of a migration).
func (d *Dataplane) repin(gone *port) {
	if gone.mac == noKey {
		return
	}
	for _, p := range *gone.net.ports.Load() {
		if p != gone && p.mac == gone.mac && p.guard.mode != guardOff {
			d.pinOwn(p)
			return
		}
	}
}

// announced handles a frontend's SEND_RARP (after a live migration): the
// address moves to the port, when the port's security allows it that
// address.
func (d *Dataplane) announced(p *port, hw net.HardwareAddr) {
	var m vswitch.MAC
	copy(m[:], hw)
	k := vswitch.KeyOf(m)
	now := time.Now().UnixNano()
	switch g := p.guard; {
	case g.mode == guardOff && !d.reserved(k):
		p.net.macs.Learn(m, p, now)
	case g.mode != guardOff && !g.sticky && k == g.mac:
		p.net.macs.Pin(m, p, now)
	case g.sticky && !d.reserved(k) && !m.IsMulticast() && !m.IsZero() && !ownedByOther(p, m):
		p.net.macs.Pin(m, p, now) // its guest's frames claim it (claimMAC)
	default:
		p.dev.Vrings()[1].Counters.DropSpoofed.Add(1)
		d.log.Warn("frontend announced an address that is not its port's (RARP refused)", "port", p.dev.Name(), "mac", hw.String())
		return
	}
	d.log.Info("guest announced after migration (RARP)", "port", p.dev.Name(), "mac", hw.String())
	d.broadcastAnnounce(p, k)
}

// ownedByOther reports whether another port of p's network owns mac.
func ownedByOther(p *port, mac vswitch.MAC) bool {
	owner, ok := p.net.macs.Lookup(mac)
	return ok && owner != p
}

// adoptMAC takes an address the predecessor process had learned on p
// (a handoff): only its own when its security is on.
func (p *port) adoptMAC(mac vswitch.MAC, now int64) bool {
	switch g := p.guard; {
	case g.mode == guardOff:
		return p.net.macs.Learn(mac, p, now)
	case g.sticky:
		return !ownedByOther(p, mac) && p.net.macs.Pin(mac, p, now)
	default:
		return vswitch.KeyOf(mac) == g.mac && p.net.macs.Pin(mac, p, now)
	}
}

// patchKind says which fields of a direct frame port security read, and
// its destinations get from the plan (applyPatch) rather than from the
// guest's buffer, which the guest may rewrite between the check and the
// copy.
type patchKind uint8

const (
	patchNone patchKind = iota // not checked (security off)
	patchEth                   // the source MAC and the Ethernet type
	patchIPv4                  // and the IPv4 source
	patchIPv6                  // and the IPv6 next header and source
)

// patchLen covers every patched field (the IPv6 source ends at 38).
const patchLen = 38

// guardVerdict is what direct decided.
type guardVerdict uint8

const (
	guardPass guardVerdict = iota
	guardWalk              // ARP, NDP: the walker checks them on its copy
	guardDrop              // spoofed
)

// direct decides a direct frame already known to come from the port's
// MAC (plan.smac, c.head read), recording what its destinations must
// get. ARP and ICMPv6 (NDP) frames, whose checks read further, walk:
// the walker checks the copy it delivers from.
func (g *guard) direct(p *txPlan, c *checked, etype uint16, frame []byte, src6 *[16]byte) guardVerdict {
	switch etype {
	case etherIPv4:
		if g.mode != guardIP {
			p.patch = patchEth
			return guardPass
		}
		if len(frame) < 34 {
			return guardDrop
		}
		if c.ip4 = binary.LittleEndian.Uint32(frame[26:30]); !g.allows4(bits.ReverseBytes32(c.ip4)) {
			return guardDrop
		}
		p.patch = patchIPv4
	case etherIPv6:
		if len(frame) < 54 {
			if g.mode == guardIP {
				return guardDrop
			}
			p.patch = patchEth // too short to hold NDP
			return guardPass
		}
		if c.nh = frame[20]; c.nh == 58 {
			return guardWalk
		}
		*src6 = [16]byte(frame[22:38])
		if g.mode == guardIP && !g.allows6(src6[:]) {
			return guardDrop
		}
		p.patch = patchIPv6
	case etherARP:
		return guardWalk
	case etherVLAN, etherQinQ:
		return guardDrop
	default:
		p.patch = patchEth
	}
	return guardPass
}

// checked is what port security read of a direct frame, as it lay in
// the frame (little-endian loads: applyPatch stores them back as they
// were).
type checked struct {
	head uint64 // bytes 6..14: the source MAC and the Ethernet type
	ip4  uint32 // the IPv4 source
	nh   uint8  // the IPv6 next header
}

// applyPatch writes what port security checked of gathered frame i (its
// plan p) over b, a destination's copy of the frame.
func (s *scratch) applyPatch(b []byte, p *txPlan, i int) {
	c := &s.chk[i]
	binary.LittleEndian.PutUint64(b[6:14], c.head)
	if p.patch == patchIPv4 {
		binary.LittleEndian.PutUint32(b[26:30], c.ip4)
	} else if p.patch == patchIPv6 {
		s.patchIPv6(b, i)
	}
}

func (s *scratch) patchIPv6(b []byte, i int) {
	b[20] = s.chk[i].nh
	*(*[16]byte)(b[22:38]) = s.src6[i]
}
