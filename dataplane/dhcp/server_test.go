package dhcp

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"
)

var (
	guestMAC  = [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	serverMAC = [6]byte{0x02, 0x76, 0x6d, 0x71, 0, 1}
)

func testLease() Lease {
	return Lease{
		MAC:     guestMAC,
		Addr:    netip.MustParsePrefix("10.1.2.3/24"),
		Gateway: netip.MustParseAddr("10.1.2.1"),
		Routes: []Route{
			{Dst: netip.MustParsePrefix("192.168.0.0/16"), Via: netip.MustParseAddr("10.1.2.254")},
			{Dst: netip.MustParsePrefix("172.16.0.0/12")}, // via the gateway
		},
		DNS:       []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Search:    []string{"default.svc.cluster.local", "svc.cluster.local"},
		LeaseTime: time.Hour,
		MTU:       1450,
	}
}

func newServer(t testing.TB, l Lease) *Server {
	t.Helper()
	s, err := NewServer(l, serverMAC)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// msg describes a client message for clientFrame.
type msg struct {
	typ      byte
	xid      uint32
	flags    uint16
	ciaddr   [4]byte
	chaddr   [6]byte
	reqIP    []byte
	serverID []byte
	extra    []byte // raw options appended before the end option
}

// clientFrame builds a client message as a stock client sends it:
// broadcast Ethernet/IPv4, UDP 68→67 with a checksum.
func clientFrame(m msg) []byte {
	d := make([]byte, fixedLen)
	d[0], d[1], d[2] = 1, 1, 6
	binary.BigEndian.PutUint32(d[4:], m.xid)
	binary.BigEndian.PutUint16(d[10:], m.flags)
	copy(d[12:], m.ciaddr[:])
	copy(d[28:], m.chaddr[:])
	d = append(d, magic[:]...)
	d = append(d, optMessageType, 1, m.typ)
	if m.reqIP != nil {
		d = append(append(d, optRequestedIP, byte(len(m.reqIP))), m.reqIP...)
	}
	if m.serverID != nil {
		d = append(append(d, optServerID, byte(len(m.serverID))), m.serverID...)
	}
	d = append(d, optParams, 5, 1, 3, 6, 121, 26)
	d = append(d, m.extra...)
	d = append(d, optEnd)
	for len(d) < bootpMin {
		d = append(d, 0)
	}
	return ipUDP([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, m.chaddr, [4]byte{}, [4]byte{255, 255, 255, 255}, clientUDP, serverUDP, d)
}

const optParams = 55

func ipUDP(dst, src [6]byte, sip, dip [4]byte, sport, dport uint16, payload []byte) []byte {
	f := make([]byte, ethLen+ipLen+udpLen+len(payload))
	copy(f[0:], dst[:])
	copy(f[6:], src[:])
	f[12] = 0x08
	ip := f[ethLen:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:], sip[:])
	copy(ip[16:], dip[:])
	binary.BigEndian.PutUint16(ip[10:], checksum(0, ip[:ipLen]))
	u := ip[ipLen:]
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[udpLen:], payload)
	binary.BigEndian.PutUint16(u[6:], checksum(pseudo(sip[:], dip[:], len(u)), u))
	return f
}

// decoded is a reply taken apart and checked.
type decoded struct {
	ethDst, ethSrc [6]byte
	ipSrc, ipDst   [4]byte
	op             byte
	xid            uint32
	ciaddr, yiaddr [4]byte
	chaddr         [6]byte
	opts           map[byte][]byte
}

// decodeReply checks a server reply's headers and checksums and returns
// its fields.
func decodeReply(t testing.TB, f []byte) decoded {
	t.Helper()
	var d decoded
	if len(f) < ethLen+ipLen+udpLen+fixedLen+magicLen || len(f) > FrameSize {
		t.Fatalf("reply is %d bytes", len(f))
	}
	copy(d.ethDst[:], f[0:6])
	copy(d.ethSrc[:], f[6:12])
	ip := f[ethLen:]
	if ip[0] != 0x45 || ip[9] != 17 || int(binary.BigEndian.Uint16(ip[2:])) != len(ip) {
		t.Fatalf("bad IP header % x", ip[:ipLen])
	}
	if checksum(0, ip[:ipLen]) != 0 {
		t.Fatal("bad IP header checksum")
	}
	copy(d.ipSrc[:], ip[12:16])
	copy(d.ipDst[:], ip[16:20])
	u := ip[ipLen:]
	if binary.BigEndian.Uint16(u[0:]) != serverUDP || binary.BigEndian.Uint16(u[2:]) != clientUDP || int(binary.BigEndian.Uint16(u[4:])) != len(u) {
		t.Fatalf("bad UDP header % x", u[:udpLen])
	}
	if checksum(pseudo(ip[12:16], ip[16:20], len(u)), u) != 0 {
		t.Fatal("bad UDP checksum")
	}
	m := u[udpLen:]
	if len(m) < bootpMin || len(m) > minMessage {
		t.Fatalf("DHCP message is %d bytes, want %d..%d", len(m), bootpMin, minMessage)
	}
	d.op = m[0]
	d.xid = binary.BigEndian.Uint32(m[4:])
	copy(d.ciaddr[:], m[12:])
	copy(d.yiaddr[:], m[16:])
	copy(d.chaddr[:], m[28:])
	if [4]byte(m[fixedLen:fixedLen+4]) != magic {
		t.Fatal("no magic cookie")
	}
	d.opts = map[byte][]byte{}
	o := m[fixedLen+magicLen:]
	for i := 0; ; {
		if i >= len(o) {
			t.Fatal("no end option")
		}
		if o[i] == optEnd {
			break
		}
		if o[i] == optPad {
			i++
			continue
		}
		if _, dup := d.opts[o[i]]; dup {
			t.Fatalf("option %d twice", o[i])
		}
		d.opts[o[i]] = o[i+2 : i+2+int(o[i+1])]
		i += 2 + int(o[i+1])
	}
	return d
}

func handle(t testing.TB, s *Server, f []byte) []byte {
	t.Helper()
	out := make([]byte, FrameSize)
	return out[:s.Handle(f, out)]
}

func ip4(s string) [4]byte { return netip.MustParseAddr(s).As4() }

func TestDiscoverGetsOfferWithTheLease(t *testing.T) {
	s := newServer(t, testLease())
	r := handle(t, s, clientFrame(msg{typ: Discover, xid: 0x1234, chaddr: guestMAC}))
	if len(r) == 0 {
		t.Fatal("no OFFER")
	}
	d := decodeReply(t, r)
	want := map[byte][]byte{
		optMessageType:   {Offer},
		optServerID:      {10, 1, 2, 1},
		optSubnetMask:    {255, 255, 255, 0},
		optBroadcast:     {10, 1, 2, 255},
		optRouter:        {10, 1, 2, 1},
		optDNS:           {10, 96, 0, 10},
		optMTU:           {0x05, 0xaa},
		optLeaseTime:     {0, 0, 0x0e, 0x10},
		optRenewalTime:   {0, 0, 0x07, 0x08},
		optRebindingTime: {0, 0, 0x0c, 0x4e},
		optDomainName:    []byte("default.svc.cluster.local"),
		// RFC 3442: width, significant octets, router; the default route
		// is added because option 121 makes clients ignore option 3.
		optClasslessRoutes: {16, 192, 168, 10, 1, 2, 254, 12, 172, 16, 10, 1, 2, 1, 0, 10, 1, 2, 1},
		optDomainSearch: append([]byte("\x07default\x03svc\x07cluster\x05local\x00"),
			"\x03svc\x07cluster\x05local\x00"...),
	}
	for code, v := range want {
		if !bytes.Equal(d.opts[code], v) {
			t.Errorf("option %d = % x, want % x", code, d.opts[code], v)
		}
	}
	if len(d.opts) != len(want) {
		t.Errorf("%d options, want %d: %v", len(d.opts), len(want), d.opts)
	}
	if d.op != 2 || d.xid != 0x1234 || d.yiaddr != ip4("10.1.2.3") || d.chaddr != guestMAC {
		t.Errorf("op %d xid %#x yiaddr %v chaddr %x", d.op, d.xid, d.yiaddr, d.chaddr)
	}
	// no broadcast flag: unicast to the offered address and the client MAC
	if d.ethDst != guestMAC || d.ethSrc != serverMAC || d.ipDst != ip4("10.1.2.3") || d.ipSrc != ip4("10.1.2.1") {
		t.Errorf("eth %x<-%x ip %v<-%v", d.ethDst, d.ethSrc, d.ipDst, d.ipSrc)
	}
	if s.Counters.Discovers.Load() != 1 || s.Counters.Offers.Load() != 1 {
		t.Errorf("counters %d discovers %d offers", s.Counters.Discovers.Load(), s.Counters.Offers.Load())
	}
}

func TestBroadcastFlagGetsBroadcastReply(t *testing.T) {
	s := newServer(t, testLease())
	d := decodeReply(t, handle(t, s, clientFrame(msg{typ: Discover, flags: 0x8000, chaddr: guestMAC})))
	if d.ethDst != [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} || d.ipDst != [4]byte{255, 255, 255, 255} {
		t.Errorf("eth dst %x ip dst %v, want broadcast", d.ethDst, d.ipDst)
	}
}

func TestRequest(t *testing.T) {
	sid, mine, other := []byte{10, 1, 2, 1}, []byte{10, 1, 2, 3}, []byte{10, 1, 2, 99}
	for _, tc := range []struct {
		name   string
		m      msg
		want   byte // 0: no reply
		ipDst  [4]byte
		ctr    func(*Counters) uint64
		ciaddr [4]byte
	}{
		{"selecting", msg{reqIP: mine, serverID: sid}, Ack, ip4("10.1.2.3"), func(c *Counters) uint64 { return c.Acks.Load() }, [4]byte{}},
		{"selecting a wrong address", msg{reqIP: other, serverID: sid}, Nak, ip4("255.255.255.255"), func(c *Counters) uint64 { return c.Naks.Load() }, [4]byte{}},
		{"selecting without an address", msg{serverID: sid}, Nak, ip4("255.255.255.255"), func(c *Counters) uint64 { return c.Naks.Load() }, [4]byte{}},
		{"another server chosen", msg{reqIP: mine, serverID: []byte{10, 1, 2, 7}}, 0, [4]byte{}, func(c *Counters) uint64 { return c.Ignored.Load() }, [4]byte{}},
		{"init-reboot", msg{reqIP: mine}, Ack, ip4("10.1.2.3"), func(c *Counters) uint64 { return c.Acks.Load() }, [4]byte{}},
		{"init-reboot elsewhere", msg{reqIP: other}, Nak, ip4("255.255.255.255"), func(c *Counters) uint64 { return c.Naks.Load() }, [4]byte{}},
		{"renewing", msg{ciaddr: ip4("10.1.2.3")}, Ack, ip4("10.1.2.3"), func(c *Counters) uint64 { return c.Acks.Load() }, ip4("10.1.2.3")},
		{"renewing a wrong address", msg{ciaddr: ip4("10.1.2.99")}, Nak, ip4("255.255.255.255"), func(c *Counters) uint64 { return c.Naks.Load() }, [4]byte{}},
		{"no address at all", msg{}, 0, [4]byte{}, func(c *Counters) uint64 { return c.Malformed.Load() }, [4]byte{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, testLease())
			tc.m.typ, tc.m.chaddr, tc.m.xid = Request, guestMAC, 77
			r := handle(t, s, clientFrame(tc.m))
			if got := tc.ctr(&s.Counters); got != 1 {
				t.Errorf("counter = %d, want 1", got)
			}
			if tc.want == 0 {
				if len(r) != 0 {
					t.Fatalf("replied %d bytes, want nothing", len(r))
				}
				return
			}
			d := decodeReply(t, r)
			if d.opts[optMessageType][0] != tc.want || d.xid != 77 || d.ipDst != tc.ipDst || d.ciaddr != tc.ciaddr {
				t.Errorf("type %d xid %d ip dst %v ciaddr %v; want type %d to %v", d.opts[optMessageType][0], d.xid, d.ipDst, d.ciaddr, tc.want, tc.ipDst)
			}
			switch tc.want {
			case Ack:
				if d.yiaddr != ip4("10.1.2.3") || d.opts[optLeaseTime] == nil || d.opts[optClasslessRoutes] == nil {
					t.Errorf("ACK yiaddr %v options %v", d.yiaddr, d.opts)
				}
			case Nak:
				if d.yiaddr != [4]byte{} || len(d.opts) != 2 || d.ethDst != [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} {
					t.Errorf("NAK yiaddr %v eth dst %x options %v", d.yiaddr, d.ethDst, d.opts)
				}
			}
		})
	}
}

func TestInformGetsConfigurationWithoutLease(t *testing.T) {
	s := newServer(t, testLease())
	d := decodeReply(t, handle(t, s, clientFrame(msg{typ: Inform, chaddr: guestMAC, ciaddr: ip4("10.1.2.3")})))
	if d.opts[optMessageType][0] != Ack || d.yiaddr != [4]byte{} || d.opts[optLeaseTime] != nil || d.opts[optRouter] == nil {
		t.Errorf("INFORM answer: yiaddr %v options %v", d.yiaddr, d.opts)
	}
}

func TestNoReply(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    msg
		ctr  func(*Counters) uint64
	}{
		{"decline", msg{typ: Decline, chaddr: guestMAC, reqIP: []byte{10, 1, 2, 3}}, func(c *Counters) uint64 { return c.Declines.Load() }},
		{"release", msg{typ: Release, chaddr: guestMAC, ciaddr: ip4("10.1.2.3")}, func(c *Counters) uint64 { return c.Releases.Load() }},
		{"another client", msg{typ: Discover, chaddr: [6]byte{0x52, 0x54, 0, 0, 0, 1}}, func(c *Counters) uint64 { return c.Ignored.Load() }},
		{"an offer from the guest", msg{typ: Offer, chaddr: guestMAC}, func(c *Counters) uint64 { return c.Ignored.Load() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, testLease())
			if r := handle(t, s, clientFrame(tc.m)); len(r) != 0 {
				t.Errorf("replied %d bytes", len(r))
			}
			if tc.ctr(&s.Counters) != 1 {
				t.Error("not counted")
			}
		})
	}
}

func TestAnyClientWithoutLeaseMAC(t *testing.T) {
	l := testLease()
	l.MAC = [6]byte{}
	s := newServer(t, l)
	if r := handle(t, s, clientFrame(msg{typ: Discover, chaddr: [6]byte{0x52, 0x54, 0, 0, 0, 1}})); len(r) == 0 {
		t.Error("no OFFER for a client on a port without a lease MAC")
	}
}

// TestMalformedDropped: every corruption of a good DISCOVER is dropped and
// counted as malformed, never answered.
func TestMalformedDropped(t *testing.T) {
	good := clientFrame(msg{typ: Discover, chaddr: guestMAC})
	const ip, udp, m = ethLen, ethLen + ipLen, ethLen + ipLen + udpLen
	opts := m + fixedLen + magicLen
	fixIP := func(f []byte) {
		binary.BigEndian.PutUint16(f[ip+10:], 0)
		binary.BigEndian.PutUint16(f[ip+10:], checksum(0, f[ip:ip+ipLen]))
	}
	fixUDP := func(f []byte) {
		binary.BigEndian.PutUint16(f[udp+6:], 0)
		n := int(binary.BigEndian.Uint16(f[udp+4:]))
		binary.BigEndian.PutUint16(f[udp+6:], checksum(pseudo(f[ip+12:ip+16], f[ip+16:ip+20], n), f[udp:udp+n]))
	}
	withOptions := func(o ...byte) func([]byte) []byte {
		return func(f []byte) []byte {
			g := append(append([]byte(nil), f[:opts]...), o...)
			for len(g) < len(f) {
				g = append(g, 0)
			}
			fixUDP(g)
			return g
		}
	}
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
	}{
		{"truncated", func(f []byte) []byte { return f[:udp+4] }},
		{"IP total length beyond the frame", func(f []byte) []byte { f[ip+2]++; fixIP(f); return f }},
		{"IP header checksum", func(f []byte) []byte { f[ip+8]--; return f }},
		{"IP fragment", func(f []byte) []byte { f[ip+6] = 0x20; fixIP(f); return f }},
		{"IP version", func(f []byte) []byte { f[ip] = 0x65; fixIP(f); return f }},
		{"UDP checksum", func(f []byte) []byte { f[m+100] ^= 1; return f }},
		{"UDP length", func(f []byte) []byte { f[udp+5]--; fixUDP(f); return f }},
		{"op is a reply", func(f []byte) []byte { f[m] = 2; fixUDP(f); return f }},
		{"hardware type", func(f []byte) []byte { f[m+1] = 6; fixUDP(f); return f }},
		{"hardware length", func(f []byte) []byte { f[m+2] = 16; fixUDP(f); return f }},
		{"relayed", func(f []byte) []byte { f[m+24] = 10; fixUDP(f); return f }},
		{"magic cookie", func(f []byte) []byte { f[m+fixedLen] = 98; fixUDP(f); return f }},
		{"no message type", withOptions(optEnd)},
		{"two message types", withOptions(optMessageType, 1, Discover, optMessageType, 1, Discover, optEnd)},
		{"message type length", withOptions(optMessageType, 2, Discover, 0, optEnd)},
		{"message type value", withOptions(optMessageType, 1, 9, optEnd)},
		{"option beyond the message", func(f []byte) []byte {
			g := append([]byte(nil), f[:opts]...)
			g = append(g, optMessageType, 1, Discover, 12, 200, 'x')
			binary.BigEndian.PutUint16(g[ip+2:], uint16(len(g)-ip))
			binary.BigEndian.PutUint16(g[udp+4:], uint16(len(g)-udp))
			fixIP(g)
			fixUDP(g)
			return g
		}},
		{"no end option", func(f []byte) []byte {
			g := append([]byte(nil), f[:opts]...)
			g = append(g, optMessageType, 1, Discover)
			binary.BigEndian.PutUint16(g[ip+2:], uint16(len(g)-ip))
			binary.BigEndian.PutUint16(g[udp+4:], uint16(len(g)-udp))
			fixIP(g)
			fixUDP(g)
			return g
		}},
		{"junk after end", withOptions(optMessageType, 1, Discover, optEnd, 7)},
		{"requested IP length", withOptions(optMessageType, 1, Discover, optRequestedIP, 3, 1, 2, 3, optEnd)},
		{"server ID length", withOptions(optMessageType, 1, Discover, optServerID, 5, 1, 2, 3, 4, 5, optEnd)},
		{"max size below 576", withOptions(optMessageType, 1, Discover, optMaxSize, 2, 1, 0, optEnd)},
		{"option overload", withOptions(optMessageType, 1, Discover, optOverload, 1, 3, optEnd)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newServer(t, testLease())
			f := tc.mod(append([]byte(nil), good...))
			if r := handle(t, s, f); len(r) != 0 {
				t.Fatalf("answered a malformed frame (%d bytes)", len(r))
			}
			if s.Counters.Malformed.Load() != 1 {
				t.Errorf("malformed = %d, want 1", s.Counters.Malformed.Load())
			}
		})
	}
	// and the unmodified frame is answered (the cases test what they say)
	if r := handle(t, newServer(t, testLease()), good); len(r) == 0 {
		t.Fatal("the good frame is not answered")
	}
}

func TestZeroUDPChecksumAccepted(t *testing.T) {
	f := clientFrame(msg{typ: Discover, chaddr: guestMAC})
	f[ethLen+ipLen+6], f[ethLen+ipLen+7] = 0, 0
	if r := handle(t, newServer(t, testLease()), f); len(r) == 0 {
		t.Error("a DISCOVER without a UDP checksum (optional in IPv4) was not answered")
	}
}

func TestIsClientFrame(t *testing.T) {
	good := clientFrame(msg{typ: Discover, chaddr: guestMAC})
	if !IsClientFrame(good[:ethLen+ipLen+4]) {
		t.Error("a DISCOVER's headers are not recognised")
	}
	srv := ipUDP(guestMAC, serverMAC, [4]byte{}, [4]byte{}, serverUDP, clientUDP, make([]byte, 300))
	other := ipUDP(guestMAC, serverMAC, [4]byte{}, [4]byte{}, clientUDP, 53, make([]byte, 300))
	frag := append([]byte(nil), good...)
	frag[ethLen+7] = 1
	tcp := append([]byte(nil), good...)
	tcp[ethLen+9] = 6
	for name, f := range map[string][]byte{"server to client": srv, "other port": other, "fragment": frag, "TCP": tcp, "short": good[:30]} {
		if IsClientFrame(f) {
			t.Errorf("%s taken for a DHCP client frame", name)
		}
	}
}

func TestLeaseValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		field string
		mod   func(*Lease)
	}{
		{"address", func(l *Lease) { l.Addr = netip.Prefix{} }},
		{"address", func(l *Lease) { l.Addr = netip.MustParsePrefix("fd00::1/64") }},
		{"address", func(l *Lease) { l.Addr = netip.MustParsePrefix("10.1.2.0/24") }},
		{"address", func(l *Lease) { l.Addr = netip.MustParsePrefix("10.1.2.255/24") }},
		{"gateway", func(l *Lease) { l.Gateway = netip.MustParseAddr("10.1.2.3") }},
		{"gateway", func(l *Lease) { l.Gateway = netip.MustParseAddr("224.0.0.1") }},
		{"routes[0].dst", func(l *Lease) { l.Routes[0].Dst = netip.MustParsePrefix("192.168.1.0/16") }},
		{"routes[1].via", func(l *Lease) { l.Gateway = netip.Addr{} }},
		{"dns[0]", func(l *Lease) { l.DNS[0] = netip.MustParseAddr("::1") }},
		{"search[1]", func(l *Lease) { l.Search[1] = "bad domain" }},
		{"leaseTime", func(l *Lease) { l.LeaseTime = time.Second }},
		{"mtu", func(l *Lease) { l.MTU = 20000 }},
		{"mac", func(l *Lease) { l.MAC[0] = 1 }},
		{"routes", func(l *Lease) { l.Routes = make([]Route, MaxRoutes+1) }},
	} {
		l := testLease()
		l.Routes = append([]Route(nil), l.Routes...)
		l.DNS = append([]netip.Addr(nil), l.DNS...)
		l.Search = append([]string(nil), l.Search...)
		tc.mod(&l)
		_, err := NewServer(l, serverMAC)
		if err == nil || !strings.HasPrefix(err.Error(), tc.field+":") {
			t.Errorf("%s: err = %v", tc.field, err)
		}
	}
	// the biggest lease the limits allow still fits a 576-byte message
	l := testLease()
	l.Routes = nil
	for i := range MaxRoutes {
		l.Routes = append(l.Routes, Route{Dst: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16)})
	}
	l.DNS = []netip.Addr{netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("1.0.0.1"), netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("8.8.4.4")}
	l.Search = []string{"a.svc.cluster.local", "svc.cluster.local", "cluster.local", "example.com"}
	s := newServer(t, l)
	decodeReply(t, handle(t, s, clientFrame(msg{typ: Discover, chaddr: guestMAC})))
}

func TestServerIDWithoutGateway(t *testing.T) {
	l := testLease()
	l.Gateway, l.Routes = netip.Addr{}, nil
	if got := newServer(t, l).ServerID(); got != netip.MustParseAddr("10.1.2.1") {
		t.Errorf("server ID %v, want the subnet's first address", got)
	}
	l.Addr = netip.MustParsePrefix("10.1.2.1/24")
	if got := newServer(t, l).ServerID(); got != netip.MustParseAddr("10.1.2.2") {
		t.Errorf("server ID %v, want the subnet's first address that is not the guest's", got)
	}
}

func TestHandleAllocatesNothing(t *testing.T) {
	s := newServer(t, testLease())
	f := clientFrame(msg{typ: Request, chaddr: guestMAC, reqIP: []byte{10, 1, 2, 3}})
	out := make([]byte, FrameSize)
	if a := testing.AllocsPerRun(100, func() { s.Handle(f, out) }); a != 0 {
		t.Errorf("Handle allocated %.1f times", a)
	}
}

// BenchmarkHandle: parse a REQUEST and write the ACK (the cost per DHCP
// frame a guest sends; control traffic, measured rather than bounded).
func BenchmarkHandle(b *testing.B) {
	s := newServer(b, testLease())
	f := clientFrame(msg{typ: Request, chaddr: guestMAC, reqIP: []byte{10, 1, 2, 3}, serverID: []byte{10, 1, 2, 1}})
	out := make([]byte, FrameSize)
	b.ReportAllocs()
	for b.Loop() {
		if s.Handle(f, out) == 0 {
			b.Fatal("no reply")
		}
	}
}
