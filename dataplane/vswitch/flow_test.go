package vswitch

import (
	"encoding/binary"
	"testing"
)

// flowSpec describes a frame for the flow hash tests.
type flowSpec struct {
	dst, src         MAC
	vlans            []uint16 // outer TPIDs, e.g. EtherTypeQinQ, EtherTypeVLAN
	etherType        uint16   // after the tags
	ipv6             bool
	srcIP, dstIP     []byte // 4 or 16 bytes
	proto            byte
	sport, dport     uint16
	ihl              int    // IPv4 header length in bytes (20 if 0)
	fragOff          uint16 // IPv4 fragment offset field (13 bits)
	noL4, shortPorts bool
}

// frame lays out the spec as bytes on the wire.
func (s flowSpec) frame() []byte {
	b := append(append([]byte(nil), s.dst[:]...), s.src[:]...)
	for i, tpid := range s.vlans {
		b = binary.BigEndian.AppendUint16(b, tpid)
		b = binary.BigEndian.AppendUint16(b, uint16(100+i)) // TCI
	}
	et := s.etherType
	if et == 0 {
		et = EtherTypeIPv4
		if s.ipv6 {
			et = EtherTypeIPv6
		}
	}
	b = binary.BigEndian.AppendUint16(b, et)
	switch {
	case s.ipv6:
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], 8)
		ip[6], ip[7] = s.proto, 64
		copy(ip[8:], s.srcIP)
		copy(ip[24:], s.dstIP)
		b = append(b, ip...)
	case et == EtherTypeIPv4:
		ihl := s.ihl
		if ihl == 0 {
			ihl = 20
		}
		ip := make([]byte, ihl)
		ip[0] = 0x40 | byte(ihl/4)
		binary.BigEndian.PutUint16(ip[6:], s.fragOff)
		ip[8], ip[9] = 64, s.proto
		copy(ip[12:], s.srcIP)
		copy(ip[16:], s.dstIP)
		for i := 20; i < ihl; i++ {
			ip[i] = 1 // NOP options
		}
		b = append(b, ip...)
	default:
		return append(b, make([]byte, 46)...)
	}
	if s.noL4 {
		return b
	}
	b = binary.BigEndian.AppendUint16(b, s.sport)
	if s.shortPorts {
		return b
	}
	b = binary.BigEndian.AppendUint16(b, s.dport)
	return append(b, make([]byte, 16)...) // the rest of the L4 header
}

// reverse is the same conversation in the other direction.
func (s flowSpec) reverse() flowSpec {
	r := s
	r.dst, r.src = s.src, s.dst
	r.srcIP, r.dstIP = s.dstIP, s.srcIP
	r.sport, r.dport = s.dport, s.sport
	return r
}

var (
	macA = MAC{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	macB = MAC{0x52, 0x54, 0x00, 0xab, 0xcd, 0xef}
	ip4A = []byte{10, 0, 0, 1}
	ip4B = []byte{192, 168, 7, 200}
	ip6A = []byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
	ip6B = []byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56}
)

func flowSpecs() map[string]flowSpec {
	return map[string]flowSpec{
		"tcp4":            {dst: macA, src: macB, srcIP: ip4A, dstIP: ip4B, proto: 6, sport: 43210, dport: 80},
		"udp4":            {dst: macA, src: macB, srcIP: ip4A, dstIP: ip4B, proto: 17, sport: 5353, dport: 53},
		"sctp4":           {dst: macA, src: macB, srcIP: ip4A, dstIP: ip4B, proto: 132, sport: 1, dport: 2},
		"icmp4":           {dst: macA, src: macB, srcIP: ip4A, dstIP: ip4B, proto: 1, sport: 0x0800, dport: 7},
		"tcp4 options":    {dst: macA, src: macB, srcIP: ip4A, dstIP: ip4B, proto: 6, sport: 1000, dport: 2000, ihl: 40},
		"tcp4 fragment":   {dst: macA, src: macB, srcIP: ip4A, dstIP: ip4B, proto: 6, sport: 1000, dport: 2000, fragOff: 185},
		"tcp4 first frag": {dst: macA, src: macB, srcIP: ip4A, dstIP: ip4B, proto: 6, sport: 1000, dport: 2000, fragOff: 0x2000},
		"tcp4 vlan":       {dst: macA, src: macB, vlans: []uint16{EtherTypeVLAN}, srcIP: ip4A, dstIP: ip4B, proto: 6, sport: 1, dport: 65535},
		"udp4 qinq":       {dst: macA, src: macB, vlans: []uint16{EtherTypeQinQ, EtherTypeVLAN}, srcIP: ip4A, dstIP: ip4B, proto: 17, sport: 9, dport: 10},
		"tcp6":            {dst: macA, src: macB, ipv6: true, srcIP: ip6A, dstIP: ip6B, proto: 6, sport: 443, dport: 50000},
		"udp6 vlan":       {dst: macA, src: macB, vlans: []uint16{EtherTypeVLAN}, ipv6: true, srcIP: ip6A, dstIP: ip6B, proto: 17, sport: 546, dport: 547},
		"icmp6":           {dst: macA, src: macB, ipv6: true, srcIP: ip6A, dstIP: ip6B, proto: 58, sport: 0x8000, dport: 1},
		"tcp6 qinq":       {dst: macA, src: macB, vlans: []uint16{EtherTypeQinQ, EtherTypeVLAN}, ipv6: true, srcIP: ip6A, dstIP: ip6B, proto: 6, sport: 22, dport: 2222},
		"udp4 no ports":   {dst: macA, src: macB, srcIP: ip4A, dstIP: ip4B, proto: 17, noL4: true},
		"arp":             {dst: macA, src: macB, etherType: EtherTypeARP},
		"three vlans":     {dst: macA, src: macB, vlans: []uint16{EtherTypeVLAN, EtherTypeVLAN, EtherTypeVLAN}, srcIP: ip4A, dstIP: ip4B, proto: 6, sport: 1, dport: 2},
		"broadcast arp":   {dst: MAC{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, src: macB, etherType: EtherTypeARP},
	}
}

func TestFlowHashSymmetric(t *testing.T) {
	for name, s := range flowSpecs() {
		f, r := s.frame(), s.reverse().frame()
		if hf, hr := FlowHash(f), FlowHash(r); hf != hr {
			t.Errorf("%s: %#x one way, %#x the other", name, hf, hr)
		}
		if len(f) > HeaderPeek {
			if FlowHash(f[:HeaderPeek]) != FlowHash(f) {
				t.Errorf("%s: hash depends on bytes past HeaderPeek", name)
			}
		}
	}
}

// The hash separates what it should: ports for TCP/UDP/SCTP, the protocol,
// the addresses; and ignores what it should: ports of non-first fragments
// and of other protocols, VLAN tags and MACs of IP traffic.
func TestFlowHashInputs(t *testing.T) {
	specs := flowSpecs()
	h := func(s flowSpec) uint32 { return FlowHash(s.frame()) }
	with := func(name string, f func(*flowSpec)) flowSpec {
		s := specs[name]
		f(&s)
		return s
	}
	differ := []struct {
		name string
		a, b flowSpec
	}{
		{"tcp4 sport", specs["tcp4"], with("tcp4", func(s *flowSpec) { s.sport++ })},
		{"tcp4 dport", specs["tcp4"], with("tcp4", func(s *flowSpec) { s.dport = 443 })},
		{"udp4 vs tcp4", specs["tcp4"], with("tcp4", func(s *flowSpec) { s.proto = 17 })},
		{"tcp4 src ip", specs["tcp4"], with("tcp4", func(s *flowSpec) { s.srcIP = []byte{10, 0, 0, 2} })},
		{"tcp6 sport", specs["tcp6"], with("tcp6", func(s *flowSpec) { s.sport++ })},
		{"tcp6 dst ip", specs["tcp6"], with("tcp6", func(s *flowSpec) { s.dstIP = append(ip6A[:15:15], 9) })},
		{"sctp4 ports", specs["sctp4"], with("sctp4", func(s *flowSpec) { s.sport = 7 })},
		{"options tcp4 ports", specs["tcp4 options"], with("tcp4 options", func(s *flowSpec) { s.sport = 7 })},
		{"first fragment ports", specs["tcp4 first frag"], with("tcp4 first frag", func(s *flowSpec) { s.sport = 7 })},
		{"arp macs", specs["arp"], with("arp", func(s *flowSpec) { s.src[5]++ })},
		{"ipv4 vs ipv6", specs["tcp4"], specs["tcp6"]},
	}
	for _, c := range differ {
		if h(c.a) == h(c.b) {
			t.Errorf("%s: same hash %#x", c.name, h(c.a))
		}
	}
	same := []struct {
		name string
		a, b flowSpec
	}{
		{"fragment ports", specs["tcp4 fragment"], with("tcp4 fragment", func(s *flowSpec) { s.sport, s.dport = 1, 2 })},
		{"icmp4 bytes", specs["icmp4"], with("icmp4", func(s *flowSpec) { s.sport = 0 })},
		{"icmp6 bytes", specs["icmp6"], with("icmp6", func(s *flowSpec) { s.dport = 99 })},
		{"vlan tag", specs["tcp4 vlan"], with("tcp4 vlan", func(s *flowSpec) { s.vlans = nil })},
		{"qinq tags", specs["tcp6 qinq"], with("tcp6 qinq", func(s *flowSpec) { s.vlans = nil })},
		{"ip macs", specs["tcp4"], with("tcp4", func(s *flowSpec) { s.src = MAC{2, 0, 0, 0, 0, 1} })},
		{"truncated ports", specs["udp4 no ports"], with("udp4 no ports", func(s *flowSpec) { s.noL4, s.shortPorts, s.sport = false, true, 77 })},
	}
	for _, c := range same {
		if h(c.a) != h(c.b) {
			t.Errorf("%s: %#x vs %#x", c.name, h(c.a), h(c.b))
		}
	}
}

func TestFlowHashShortAndMalformed(t *testing.T) {
	for _, n := range []int{0, 1, 13} {
		if FlowHash(make([]byte, n)) != 0 {
			t.Errorf("%d-byte frame hashed to non-zero", n)
		}
	}
	for _, s := range flowSpecs() {
		f := s.frame()
		for n := range len(f) + 1 {
			FlowHash(f[:n]) // must not panic on any truncation
		}
	}
	// A truncated or non-v4 IPv4 header falls back to the MAC hash.
	arp := flowSpecs()["arp"].frame()
	tcp := flowSpecs()["tcp4"].frame()
	macOnly := FlowHash(append(append([]byte(nil), tcp[:12]...), arp[12:14]...))
	if FlowHash(tcp[:14+19]) != macOnly {
		t.Errorf("19-byte IPv4 header not hashed by MACs")
	}
	bad := append([]byte(nil), tcp...)
	bad[14] = 0x65 // version 6 in an IPv4 ethertype
	if FlowHash(bad) != macOnly {
		t.Errorf("IPv4 ethertype with version 6 not hashed by MACs")
	}
}

func TestFlowTable(t *testing.T) {
	var ft FlowTable
	if q := ft.Lookup(12345); q != -1 {
		t.Errorf("empty table: Lookup = %d", q)
	}
	ft.Record(12345, 3, 0)
	if q := ft.Lookup(12345); q != 3 {
		t.Errorf("Lookup = %d, want 3", q)
	}
	if q := ft.Lookup(12345 + flowBuckets); q != 3 {
		t.Errorf("same bucket: Lookup = %d, want 3", q)
	}
	if q := ft.Lookup(12346); q != -1 {
		t.Errorf("other bucket: Lookup = %d, want -1", q)
	}
	ft.Record(0xffffffff, 127, 0)
	if q := ft.Lookup(0xffffffff); q != 127 {
		t.Errorf("hash 2^32-1: Lookup = %d", q)
	}
	allocs := testing.AllocsPerRun(100, func() {
		ft.Record(FlowHash(flowFrame), 1, 0)
		if ft.Lookup(FlowHash(flowFrame)) != 1 {
			panic("lookup")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per hash+record+lookup", allocs)
	}
}

// TestFlowTableMovesAfterQuietEpoch: a flow sent on two queues keeps the
// first until that one has not sent it for a whole epoch, across the
// epoch counter's wrap too.
func TestFlowTableMovesAfterQuietEpoch(t *testing.T) {
	const e = int64(1) << flowEpochShift
	for _, tc := range []struct {
		name  string
		start int64
	}{{"from zero", 0}, {"across the wrap", 0xfffe * e}} {
		t.Run(tc.name, func(t *testing.T) {
			var ft FlowTable
			at := func(epochs int64) int64 { return tc.start + epochs*e + e/2 }
			steps := []struct {
				q      int
				epochs int64
				want   int
			}{
				{3, 0, 3},
				{0, 0, 3}, // queue 3 sent it in this epoch
				{0, 1, 3}, // and in the one before
				{0, 2, 0}, // silent for a whole epoch: the flow moves
				{3, 2, 0},
				{0, 3, 0}, // queue 0 keeps it fresh
				{3, 4, 0},
				{3, 5, 3},
			}
			for i, s := range steps {
				ft.Record(777, s.q, at(s.epochs))
				if q := ft.Lookup(777); q != s.want {
					t.Fatalf("step %d: sent on %d in epoch %d: Lookup = %d, want %d", i, s.q, s.epochs, q, s.want)
				}
			}
		})
	}
}

var flowFrame = flowSpecs()["tcp6"].frame()

// FuzzFlowHash checks, on arbitrary bytes, that FlowHash never panics,
// that its fixed-offset path for plain IPv4 gives what the general one
// (flowHash) gives, and that swapping the MACs, the IP addresses and the
// L4 ports (wherever the frame's headers put them) never changes the hash.
func FuzzFlowHash(f *testing.F) {
	for _, s := range flowSpecs() {
		f.Add(s.frame())
	}
	f.Add([]byte{})
	f.Add(make([]byte, 14))
	f.Fuzz(func(t *testing.T, b []byte) {
		h := FlowHash(b)
		if g := flowHash(b); g != h {
			t.Fatalf("FlowHash %#x, the general path %#x\n%x", h, g, b)
		}
		if len(b) < 14 && h != 0 {
			t.Fatalf("short frame hashed to %#x", h)
		}
		for _, n := range []int{14, 18, 22, 34, 54, HeaderPeek} {
			if n < len(b) {
				FlowHash(b[:n])
			}
		}
		r := swapFlow(b)
		if hr := FlowHash(r); hr != h {
			t.Fatalf("hash %#x, %#x with addresses and ports swapped\n%x\n%x", h, hr, b, r)
		}
	})
}

// swapFlow returns a copy of b with source and destination swapped at the
// places the Ethernet, 802.1Q, IPv4/IPv6 and TCP/UDP/SCTP headers define.
func swapFlow(b []byte) []byte {
	r := append([]byte(nil), b...)
	if len(r) < 14 {
		return r
	}
	swap := func(x, y, n int) {
		for i := range n {
			r[x+i], r[y+i] = r[y+i], r[x+i]
		}
	}
	swap(0, 6, 6)
	et := binary.BigEndian.Uint16(r[12:])
	off := 14
	for i := 0; i < 2 && (et == EtherTypeVLAN || et == EtherTypeQinQ) && len(r) >= off+4; i++ {
		et = binary.BigEndian.Uint16(r[off+2:])
		off += 4
	}
	l4 := -1
	var proto byte
	switch {
	case et == EtherTypeIPv4 && len(r) >= off+20 && r[off]>>4 == 4:
		swap(off+12, off+16, 4)
		proto = r[off+9]
		if ihl := int(r[off]&0xf) * 4; ihl >= 20 {
			l4 = off + ihl
		}
	case et == EtherTypeIPv6 && len(r) >= off+40 && r[off]>>4 == 6:
		swap(off+8, off+24, 16)
		proto, l4 = r[off+6], off+40
	}
	if l4 >= 0 && (proto == 6 || proto == 17 || proto == 132) && len(r) >= l4+4 {
		swap(l4, l4+2, 2)
	}
	return r
}
