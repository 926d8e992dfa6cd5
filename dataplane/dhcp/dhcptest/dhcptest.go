// Package dhcptest builds DHCP client frames and reads replies, for tests
// of the parts that carry DHCP (the dataplane, the agent), as a stock
// client would send and read them.
package dhcptest

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// Client message types.
const (
	Discover = 1
	Request  = 3
)

// Frame builds a broadcast client message of type typ from chaddr, with
// extra raw options (code, length, value...) before the end option, in
// Ethernet/IPv4/UDP 68→67 with valid checksums.
func Frame(typ byte, xid uint32, chaddr [6]byte, extra ...byte) []byte {
	m := make([]byte, 240, 300)
	m[0], m[1], m[2] = 1, 1, 6
	binary.BigEndian.PutUint32(m[4:], xid)
	copy(m[28:], chaddr[:])
	copy(m[236:], []byte{99, 130, 83, 99})
	m = append(m, 53, 1, typ)
	m = append(m, extra...)
	m = append(m, 255)
	for len(m) < 300 {
		m = append(m, 0)
	}
	f := make([]byte, 42+len(m))
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:], chaddr[:])
	f[12] = 0x08
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[16:], []byte{255, 255, 255, 255})
	binary.BigEndian.PutUint16(ip[10:], sum(0, ip[:20]))
	u := ip[20:]
	binary.BigEndian.PutUint16(u[0:], 68)
	binary.BigEndian.PutUint16(u[2:], 67)
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], m)
	binary.BigEndian.PutUint16(u[6:], sum(0x11+uint32(len(u))+0xffff+0xffff, u))
	return f
}

// Reply is a server reply, taken apart.
type Reply struct {
	Type    byte
	XID     uint32
	YIAddr  netip.Addr
	Options map[byte][]byte
}

// ParseReply reads a reply frame (UDP 67→68).
func ParseReply(f []byte) (Reply, error) {
	var r Reply
	if len(f) < 42+240 || f[12] != 0x08 || f[23] != 17 || binary.BigEndian.Uint16(f[34:]) != 67 || binary.BigEndian.Uint16(f[36:]) != 68 {
		return r, errors.New("not a DHCP reply")
	}
	m := f[42:]
	r.XID = binary.BigEndian.Uint32(m[4:])
	r.YIAddr = netip.AddrFrom4([4]byte(m[16:20]))
	r.Options = map[byte][]byte{}
	o := m[240:]
	for i := 0; i < len(o) && o[i] != 255; {
		if o[i] == 0 {
			i++
			continue
		}
		if i+2 > len(o) || i+2+int(o[i+1]) > len(o) {
			return r, errors.New("option beyond the message")
		}
		r.Options[o[i]] = o[i+2 : i+2+int(o[i+1])]
		i += 2 + int(o[i+1])
	}
	if t := r.Options[53]; len(t) == 1 {
		r.Type = t[0]
	}
	return r, nil
}

func sum(s uint32, b []byte) uint16 {
	for ; len(b) >= 2; b = b[2:] {
		s += uint32(binary.BigEndian.Uint16(b))
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
