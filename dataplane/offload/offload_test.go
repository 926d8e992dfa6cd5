package offload

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// refCsum is the RFC 1071 checksum the plain way (16-bit words, carries
// folded at the end), independent of Sum/Fold.
func refCsum(parts ...[]byte) uint16 {
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	var s uint32
	for i := 0; i < len(all); i += 2 {
		s += uint32(all[i])<<8 | uint32(all[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// pseudo builds the TCP/UDP pseudo header of an IP packet.
func pseudo(ip []byte, v6 bool, proto uint8, l4len int) []byte {
	var p []byte
	if v6 {
		p = append(p, ip[8:40]...)
		p = binary.BigEndian.AppendUint32(p, uint32(l4len))
		return append(p, 0, 0, 0, proto)
	}
	p = append(p, ip[12:20]...)
	p = append(p, 0, proto)
	return binary.BigEndian.AppendUint16(p, uint16(l4len))
}

type frameSpec struct {
	v6, udp, vlan bool
	payload       int
	tcpFlags      byte
	tcpOpts       int // bytes of TCP options (multiple of 4)
}

// build makes a GSO frame as a sender with offloads leaves it: the L4
// checksum field holds the pseudo-header sum (not complemented), IP
// lengths cover the whole frame, and a header describing it.
func build(sp frameSpec, gsoSize int) ([]byte, virtio.NetHdr) {
	f := []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1}
	if sp.vlan {
		f = append(f, 0x81, 0x00, 0x00, 10)
	}
	l3 := len(f) + 2
	proto := uint8(protoTCP)
	l4hdr := 20 + sp.tcpOpts
	if sp.udp {
		proto, l4hdr = protoUDP, 8
	}
	l4len := l4hdr + sp.payload
	if sp.v6 {
		f = append(f, 0x86, 0xdd)
		f = append(f, 0x60, 0, 0, 0)
		f = binary.BigEndian.AppendUint16(f, uint16(l4len))
		f = append(f, proto, 64)
		f = append(f, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
		f = append(f, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2)
	} else {
		f = append(f, 0x08, 0x00, 0x45, 0)
		f = binary.BigEndian.AppendUint16(f, uint16(20+l4len))
		f = append(f, 0x12, 0x34, 0x40, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2)
		binary.BigEndian.PutUint16(f[l3+10:], refCsum(f[l3:l3+20]))
	}
	l4 := len(f)
	if sp.udp {
		f = append(f, 0x30, 0x39, 0x14, 0xe9)
		f = binary.BigEndian.AppendUint16(f, uint16(l4len))
		f = append(f, 0, 0)
	} else {
		f = append(f, 0x30, 0x39, 0x14, 0x51, 0xff, 0xff, 0xf0, 0x00, 0, 0, 0, 1)
		f = append(f, byte(l4hdr/4)<<4, sp.tcpFlags, 0xff, 0xff, 0, 0, 0, 0)
		for range sp.tcpOpts {
			f = append(f, 1) // NOP
		}
	}
	for i := range sp.payload {
		f = append(f, byte(i*7+i/251))
	}
	// partial checksum: the pseudo-header sum, folded, not complemented
	csumOff := 16
	if sp.udp {
		csumOff = 6
	}
	ps := ^refCsum(pseudo(f[l3:], sp.v6, proto, l4len))
	binary.BigEndian.PutUint16(f[l4+csumOff:], ps)
	h := virtio.NetHdr{Flags: FNeedsCsum, CsumStart: uint16(l4), CsumOffset: uint16(csumOff), HdrLen: uint16(l4 + l4hdr)}
	if gsoSize > 0 {
		h.GSOSize = uint16(gsoSize)
		switch {
		case sp.udp:
			h.GSOType = GSOUDPL4
		case sp.v6:
			h.GSOType = GSOTCPv6
		default:
			h.GSOType = GSOTCPv4
		}
	}
	return f, h
}

// verifyL4 checks a complete frame's IP and L4 checksums and lengths with
// the reference and returns its L4 payload.
func verifyL4(t *testing.T, f []byte, sp frameSpec) []byte {
	t.Helper()
	l3 := 14
	if sp.vlan {
		l3 = 18
		if f[12] != 0x81 || f[15] != 10 {
			t.Fatalf("VLAN tag lost: % x", f[12:16])
		}
	}
	ip := f[l3:]
	var l4 []byte
	var proto uint8
	if sp.v6 {
		l4, proto = ip[40:], ip[6]
		if got := int(binary.BigEndian.Uint16(ip[4:])); got != len(l4) {
			t.Fatalf("IPv6 payload length %d, want %d", got, len(l4))
		}
	} else {
		l4, proto = ip[20:], ip[9]
		if got := int(binary.BigEndian.Uint16(ip[2:])); got != len(ip) {
			t.Fatalf("IPv4 total length %d, want %d", got, len(ip))
		}
		if refCsum(ip[:20]) != 0 {
			t.Fatalf("IPv4 header checksum wrong: % x", ip[:20])
		}
	}
	if c := refCsum(pseudo(ip, sp.v6, proto, len(l4)), l4); c != 0 {
		t.Fatalf("L4 checksum does not verify (residue %#x)", c)
	}
	if sp.udp {
		if got := int(binary.BigEndian.Uint16(l4[4:])); got != len(l4) {
			t.Fatalf("UDP length %d, want %d", got, len(l4))
		}
		return l4[8:]
	}
	return l4[int(l4[12]>>4)*4:]
}

func TestCheckAccepts(t *testing.T) {
	for _, sp := range []frameSpec{
		{payload: 3000}, {v6: true, payload: 3000}, {vlan: true, payload: 3000}, {vlan: true, v6: true, payload: 3000},
		{udp: true, payload: 3000}, {udp: true, v6: true, payload: 3000}, {tcpOpts: 12, payload: 100},
	} {
		f, h := build(sp, 1000)
		in, err := Check(&h, f, len(f))
		if err != nil {
			t.Errorf("%+v: %v", sp, err)
			continue
		}
		if in.IPv6 != sp.v6 || int(h.CsumStart) != in.L4 || in.L4End != int(h.HdrLen) {
			t.Errorf("%+v: info %+v, header %+v", sp, in, h)
		}
		// the first 78 bytes say the same, or ask for more
		if in2, err := Check(&h, f[:78], MaxFrame); err == nil && (in2.L4 != in.L4 || in2.L4End != in.L4End) {
			t.Errorf("%+v: prefix info %+v, want %+v", sp, in2, in)
		} else if err != nil && !errors.Is(err, ErrNeedLonger) {
			t.Errorf("%+v: prefix check: %v", sp, err)
		}
	}
}

func TestCheckRefuses(t *testing.T) {
	type mut func(f []byte, h *virtio.NetHdr) []byte
	v4 := frameSpec{payload: 3000}
	cases := []struct {
		name string
		sp   frameSpec
		mut  mut
		want error
	}{
		{"unknown flag", v4, func(f []byte, h *virtio.NetHdr) []byte { h.Flags |= 4; return f }, ErrFlags},
		{"UFO", v4, func(f []byte, h *virtio.NetHdr) []byte { h.GSOType = GSOUDP; return f }, ErrGSOType},
		{"unknown gso", v4, func(f []byte, h *virtio.NetHdr) []byte { h.GSOType = 9; return f }, ErrGSOType},
		{"ECN alone", v4, func(f []byte, h *virtio.NetHdr) []byte { h.GSOType = GSOECN; return f }, ErrGSOType},
		{"USO with ECN", frameSpec{udp: true, payload: 3000}, func(f []byte, h *virtio.NetHdr) []byte { h.GSOType |= GSOECN; return f }, ErrGSOType},
		{"csum past the end", v4, func(f []byte, h *virtio.NetHdr) []byte { h.CsumOffset = uint16(len(f)); return f }, ErrCsumRange},
		{"csum start past the end", v4, func(f []byte, h *virtio.NetHdr) []byte { h.CsumStart = 0xffff; h.CsumOffset = 0xffff; return f }, ErrCsumRange},
		{"csum in the MACs", v4, func(f []byte, h *virtio.NetHdr) []byte { h.CsumStart = 2; return f }, ErrCsumRange},
		{"gso without csum", v4, func(f []byte, h *virtio.NetHdr) []byte { h.Flags = 0; return f }, ErrGSONoCsum},
		{"gso size 0", v4, func(f []byte, h *virtio.NetHdr) []byte { h.GSOSize = 0; return f }, ErrGSOSize},
		{"too many segments", v4, func(f []byte, h *virtio.NetHdr) []byte { h.GSOSize = 1; return f }, ErrGSOSize},
		{"TCPv4 on IPv6", frameSpec{v6: true, payload: 3000}, func(f []byte, h *virtio.NetHdr) []byte { h.GSOType = GSOTCPv4; return f }, ErrL3},
		{"TCPv6 on IPv4", v4, func(f []byte, h *virtio.NetHdr) []byte { h.GSOType = GSOTCPv6; return f }, ErrL3},
		{"TCP gso on UDP", frameSpec{udp: true, payload: 3000}, func(f []byte, h *virtio.NetHdr) []byte { h.GSOType = GSOTCPv4; return f }, ErrL4},
		{"USO on TCP", v4, func(f []byte, h *virtio.NetHdr) []byte { h.GSOType = GSOUDPL4; return f }, ErrL4},
		{"ARP", v4, func(f []byte, h *virtio.NetHdr) []byte { f[12], f[13] = 0x08, 0x06; return f }, ErrL3},
		{"fragment", v4, func(f []byte, h *virtio.NetHdr) []byte { f[14+6] |= 0x20; return f }, ErrL3},
		{"IHL 4", v4, func(f []byte, h *virtio.NetHdr) []byte { f[14] = 0x44; return f }, ErrL3},
		{"ICMP", v4, func(f []byte, h *virtio.NetHdr) []byte { f[14+9] = 1; return f }, ErrL4},
		{"csum start not L4", v4, func(f []byte, h *virtio.NetHdr) []byte { h.CsumStart += 4; return f }, ErrCsumL4},
		{"csum offset not TCP's", v4, func(f []byte, h *virtio.NetHdr) []byte { h.CsumOffset = 6; return f }, ErrCsumL4},
		{"TCP data offset 4", v4, func(f []byte, h *virtio.NetHdr) []byte { f[34+12] = 0x10; return f }, ErrL4},
		{"no payload", v4, func(f []byte, h *virtio.NetHdr) []byte { return f[:54] }, ErrShort},
		{"TCP header past the end", v4, func(f []byte, h *virtio.NetHdr) []byte { f[34+12] = 0xf0; return f[:60] }, ErrShort},
	}
	for _, c := range cases {
		f, h := build(c.sp, 1000)
		f = c.mut(f, &h)
		if _, err := Check(&h, f, len(f)); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	f, h := build(v4, 1000)
	if _, err := Check(&h, f, MaxFrame+1); !errors.Is(err, ErrTooLong) {
		t.Errorf("longer than MaxFrame: %v", err)
	}
	if _, err := Check(&h, f[:20], len(f)); !errors.Is(err, ErrNeedLonger) {
		t.Errorf("20-byte prefix: %v", err)
	}
}

func TestSegment(t *testing.T) {
	for _, sp := range []frameSpec{
		{payload: 4000, tcpFlags: 0x80 | 0x08 | 0x01 | 0x10}, // CWR, PSH, FIN, ACK
		{v6: true, payload: 4345, tcpFlags: 0x18},
		{vlan: true, payload: 2896, tcpFlags: 0x10, tcpOpts: 12},
		{vlan: true, v6: true, payload: 1, tcpFlags: 0x19},
		{udp: true, payload: 3001},
		{udp: true, v6: true, vlan: true, payload: 1400},
	} {
		const gso = 1448
		f, h := build(sp, gso)
		in, err := Check(&h, f, len(f))
		if err != nil {
			t.Fatalf("%+v: %v", sp, err)
		}
		orig := bytes.Clone(f)
		var s Segmenter
		s.Start(f, &h, in)
		var payload []byte
		n := 0
		want := (sp.payload + gso - 1) / gso
		for seg := s.Next(); seg != nil; seg = s.Next() {
			p := verifyL4(t, seg, sp)
			if len(p) > gso || (n < want-1 && len(p) != gso) {
				t.Fatalf("%+v: segment %d carries %d bytes", sp, n, len(p))
			}
			if !bytes.Equal(seg[:12], f[:12]) {
				t.Fatalf("%+v: segment %d MACs changed", sp, n)
			}
			l3 := 14
			if sp.vlan {
				l3 = 18
			}
			if !sp.v6 {
				if id := binary.BigEndian.Uint16(seg[l3+4:]); id != 0x1234+uint16(n) {
					t.Errorf("%+v: segment %d IP ID %#x", sp, n, id)
				}
			}
			if !sp.udp {
				tcp := seg[in.L4:]
				if seq := binary.BigEndian.Uint32(tcp[4:]); seq != 0xfffff000+uint32(n*gso) {
					t.Errorf("%+v: segment %d seq %#x", sp, n, seq)
				}
				fl := tcp[13]
				wantFl := sp.tcpFlags
				if n > 0 {
					wantFl &^= 0x80
				}
				if n < want-1 {
					wantFl &^= 0x09
				}
				if fl != wantFl {
					t.Errorf("%+v: segment %d flags %#x, want %#x", sp, n, fl, wantFl)
				}
			}
			payload = append(payload, p...)
			n++
		}
		if n != want {
			t.Errorf("%+v: %d segments, want %d", sp, n, want)
		}
		if !bytes.Equal(payload, orig[in.L4End:]) {
			t.Errorf("%+v: payload changed", sp)
		}
		if !bytes.Equal(f, orig) {
			t.Errorf("%+v: the GSO frame changed", sp)
		}
	}
}

func TestComplete(t *testing.T) {
	for _, sp := range []frameSpec{{payload: 1000}, {v6: true, payload: 999, tcpFlags: 0x10}, {udp: true, vlan: true, payload: 33}, {udp: true, v6: true, payload: 0}} {
		f, h := build(sp, 0)
		if _, err := Check(&h, f, len(f)); err != nil {
			t.Fatalf("%+v: %v", sp, err)
		}
		orig := bytes.Clone(f)
		old := Complete(f, &h)
		verifyL4(t, f, sp)
		Restore(f, &h, old)
		if !bytes.Equal(f, orig) {
			t.Errorf("%+v: Restore did not restore", sp)
		}
	}
}

func TestNeedsAndCaps(t *testing.T) {
	all := CapsFromFeatures(1<<virtio.NetFGuestCsum | 1<<virtio.NetFGuestTSO4 | 1<<virtio.NetFGuestTSO6 |
		1<<virtio.NetFGuestECN | 1<<virtio.NetFGuestUSO4 | 1<<virtio.NetFGuestUSO6)
	if all != CapCsum|CapTSO4|CapTSO6|CapECN|CapUSO4|CapUSO6 {
		t.Errorf("all features: caps %#x", all)
	}
	if c := CapsFromFeatures(1 << virtio.NetFGuestTSO4); c != 0 {
		t.Errorf("TSO4 without GUEST_CSUM: caps %#x, want 0", c)
	}
	for _, c := range []struct {
		h    virtio.NetHdr
		v6   bool
		want Caps
	}{
		{virtio.NetHdr{}, false, 0},
		{virtio.NetHdr{Flags: FDataValid}, false, 0},
		{virtio.NetHdr{Flags: FNeedsCsum}, false, CapCsum},
		{virtio.NetHdr{Flags: FNeedsCsum, GSOType: GSOTCPv4}, false, CapCsum | CapTSO4},
		{virtio.NetHdr{Flags: FNeedsCsum, GSOType: GSOTCPv6 | GSOECN}, true, CapCsum | CapTSO6 | CapECN},
		{virtio.NetHdr{Flags: FNeedsCsum, GSOType: GSOUDPL4}, false, CapCsum | CapUSO4},
		{virtio.NetHdr{Flags: FNeedsCsum, GSOType: GSOUDPL4}, true, CapCsum | CapUSO6},
	} {
		if got := Needs(&c.h, c.v6); got != c.want {
			t.Errorf("%+v v6=%v: needs %#x, want %#x", c.h, c.v6, got, c.want)
		}
	}
}

// The per-frame work allocates nothing.
func TestNoAllocs(t *testing.T) {
	f, h := build(frameSpec{payload: 60000, tcpFlags: 0x10}, 1448)
	c, ch := build(frameSpec{udp: true, payload: 1000}, 0)
	s := new(Segmenter)
	allocs := testing.AllocsPerRun(20, func() {
		in, err := Check(&h, f, len(f))
		if err != nil {
			t.Fatal(err)
		}
		s.Start(f, &h, in)
		for s.Next() != nil {
		}
		if _, err := Check(&ch, c, len(c)); err != nil {
			t.Fatal(err)
		}
		Restore(c, &ch, Complete(c, &ch))
	})
	if allocs != 0 {
		t.Errorf("%v allocations per frame, want 0", allocs)
	}
}

func BenchmarkSegment64K(b *testing.B) {
	f, h := build(frameSpec{payload: 64000, tcpFlags: 0x10}, 1448)
	in, _ := Check(&h, f, len(f))
	s := new(Segmenter)
	b.SetBytes(int64(len(f)))
	for b.Loop() {
		s.Start(f, &h, in)
		for s.Next() != nil {
		}
	}
}
