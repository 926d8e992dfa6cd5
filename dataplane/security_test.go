package dataplane

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
)

// addPortMAC adds a one-pair port given mac, as the CNI gives a VM's.
func addPortMAC(t testing.TB, d *Dataplane, name string, mac [6]byte, opt PortOptions) string {
	t.Helper()
	s := sockPath(t, name)
	cfg := netdev.Config{Name: name, Socket: s, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500, MAC: net.HardwareAddr(mac[:])}
	if err := d.AddPort(cfg, opt); err != nil {
		t.Fatal(err)
	}
	return s
}

var (
	macM     = [6]byte{0x52, 0x54, 0, 0, 0, 0x6d} // mallory, the attacker
	bcast    = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	ipA      = netip.MustParseAddr("10.0.0.1")
	ipB      = netip.MustParseAddr("10.0.0.2")
	ipM      = netip.MustParseAddr("10.0.0.9")
	ip6B     = netip.MustParseAddr("fd00::2")
	ip6M     = netip.MustParseAddr("fd00::9")
	ip6Zero  = netip.IPv6Unspecified()
	ip6AllND = netip.MustParseAddr("ff02::1")
)

func ipv4Frame(dst, src [6]byte, from, to netip.Addr, payload string) []byte {
	fr := udpFrame(dst, src, 5000, 5001, []byte(payload))
	f4, t4 := from.As4(), to.As4()
	copy(fr[26:30], f4[:])
	copy(fr[30:34], t4[:])
	return fr
}

// arpFrame is an ARP message (op 1 request, 2 reply) from Ethernet
// source src claiming sender sha/spa.
func arpFrame(dst, src, sha [6]byte, spa, tpa netip.Addr, op uint16) []byte {
	b := append(append(append([]byte{}, dst[:]...), src[:]...), 0x08, 0x06, 0, 1, 0x08, 0, 6, 4)
	b = binary.BigEndian.AppendUint16(b, op)
	s4, t4 := spa.As4(), tpa.As4()
	b = append(append(b, sha[:]...), s4[:]...)
	b = append(append(b, 0, 0, 0, 0, 0, 0), t4[:]...)
	return append(b, make([]byte, 18)...) // padded to 60 bytes
}

// ipv6Frame is an IPv6 frame with next header nh and payload body.
func ipv6Frame(dst, src [6]byte, from, to netip.Addr, nh byte, body []byte) []byte {
	b := append(append(append([]byte{}, dst[:]...), src[:]...), 0x86, 0xdd, 0x60, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(len(body)))
	b = append(b, nh, 255)
	f, t16 := from.As16(), to.As16()
	b = append(append(b, f[:]...), t16[:]...)
	return append(b, body...)
}

// ndpFrame is a neighbour solicitation (135) or advertisement (136) for
// target with a link-layer address option (source for 135, target for
// 136) carrying lla.
func ndpFrame(src [6]byte, from netip.Addr, typ byte, target netip.Addr, lla [6]byte) []byte {
	tg := target.As16()
	body := append([]byte{typ, 0, 0, 0, 0x60, 0, 0, 0}, tg[:]...)
	opt := byte(1)
	if typ == 136 {
		opt = 2
	}
	body = append(append(body, opt, 1), lla[:]...)
	return ipv6Frame([6]byte{0x33, 0x33, 0, 0, 0, 1}, src, from, ip6AllND, 58, body)
}

func vlanFrame(dst, src [6]byte) []byte {
	fr := udpFrame(dst, src, 1, 2, []byte("tagged"))
	return append(append(append([]byte{}, fr[:12]...), 0x81, 0, 0, 7), fr[12:]...)
}

func linkLocalOf(mac [6]byte) netip.Addr { return netip.AddrFrom16(linkLocal(mac[:])) }

// TestPortSecurityDropsSpoofedFrames: a guest sending from another VM's
// MAC, from a random MAC, with a forged ARP reply, a forged IPv4 or IPv6
// source, a forged neighbour advertisement or a VLAN tag reaches nobody
// and each frame is counted (drops.spoofed); the victim keeps its
// address and its traffic; the attacker's own frames go through. Both
// the direct path and the walker (indirect chains) are checked.
func TestPortSecurityDropsSpoofedFrames(t *testing.T) {
	for _, indirect := range []bool{false, true} {
		t.Run(fmt.Sprintf("indirect=%v", indirect), func(t *testing.T) {
			d := newDataplane(t)
			sec := func(ips ...netip.Addr) PortOptions {
				return PortOptions{Security: PortSecurity{IPs: ips}}
			}
			a := dial(t, addPortMAC(t, d, "a", macA, sec(ipA)), frontend.Config{})
			b := dial(t, addPortMAC(t, d, "b", macB, sec(ipB, ip6B)), frontend.Config{})
			m := dial(t, addPortMAC(t, d, "m", macM, sec(ipM, ip6M)), frontend.Config{TxIndirect: indirect})
			// a and b greet each other from their own addresses
			for _, g := range []struct {
				from, to *frontend.Frontend
				fr       []byte
			}{{a, b, ipv4Frame(bcast, macA, ipA, ipB, "hello")}, {b, a, ipv4Frame(bcast, macB, ipB, ipA, "hello")}} {
				if err := g.from.Send(0, g.fr); err != nil {
					t.Fatal(err)
				}
				if got, err := g.to.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, g.fr) {
					t.Fatalf("greeting: got %x, %v", got, err)
				}
			}
			// m gets both greetings too (broadcasts): taken out of its
			// ring, whenever they arrive, before the attacks
			for i := range 2 {
				if _, err := m.Recv(0, 2*time.Second); err != nil {
					t.Fatalf("m: greeting broadcast %d of 2: %v", i+1, err)
				}
			}

			attacks := []struct {
				name  string
				frame []byte
			}{
				{"the victim's MAC, unicast", udpFrame(macA, macB, 1, 2, []byte("from b's mac"))},
				{"the victim's MAC, broadcast", broadcastFrom(macB)},
				{"a random MAC", udpFrame(macA, [6]byte{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}, 1, 2, []byte("random"))},
				{"a forged ARP reply (the victim's IP)", arpFrame(bcast, macM, macM, ipB, ipA, 2)},
				{"an ARP sender MAC that is not its own", arpFrame(bcast, macM, macB, ipM, ipA, 1)},
				{"a forged IPv4 source", ipv4Frame(macA, macM, ipB, ipA, "forged v4")},
				{"a forged IPv6 source", ipv6Frame(macA, macM, ip6B, ipA.Prev(), 17, make([]byte, 16))},
				{"the victim's link-local source", ipv6Frame(macA, macM, linkLocalOf(macB), ip6B, 17, make([]byte, 16))},
				{"a neighbour advertisement for the victim's address", ndpFrame(macM, ip6M, 136, ip6B, macM)},
				{"a neighbour advertisement with another's MAC", ndpFrame(macM, ip6M, 136, ip6M, macB)},
				{"a neighbour solicitation with another's MAC", ndpFrame(macM, ip6M, 135, ip6B, macB)},
				{"a VLAN-tagged frame", vlanFrame(macA, macM)},
			}
			for i, at := range attacks {
				if err := m.Send(0, at.frame); err != nil {
					t.Fatal(err)
				}
				want := uint64(i + 1)
				waitFor(t, fmt.Sprintf("%q counted as spoofed (%d)", at.name, want), func() bool {
					return portStats(t, d, "m").Queues[0].Drops.Spoofed == want
				})
				for who, f := range map[string]*frontend.Frontend{"a": a, "b": b} {
					if got, err := f.Recv(0, 20*time.Millisecond); err == nil {
						t.Errorf("%s: %s received it: % x", at.name, who, got[:min(len(got), 42)])
					}
				}
			}
			// the victim still owns its address: a's frame to it arrives
			// at b, and b's stream to a arrives whole
			for i := range 50 {
				if err := a.Send(0, udpFrame(macB, macA, uint16(i), 9, []byte("to b"))); err != nil {
					t.Fatal(err)
				}
				if got, err := b.Recv(0, 2*time.Second); err != nil || string(got[42:]) != "to b" {
					t.Fatalf("frame %d to the victim: %q, %v", i, got, err)
				}
				if err := b.Send(0, ipv4Frame(macA, macB, ipB, ipA, "from b")); err != nil {
					t.Fatal(err)
				}
				if got, err := a.Recv(0, 2*time.Second); err != nil || string(got[42:]) != "from b" {
					t.Fatalf("frame %d from the victim: %q, %v", i, got, err)
				}
			}
			if got, err := m.Recv(0, 20*time.Millisecond); err == nil {
				t.Errorf("the attacker received the victim's traffic: % x", got[:min(len(got), 42)])
			}
			// the attacker's own addresses go through
			for _, ok := range []struct {
				name  string
				frame []byte
			}{
				{"its own IPv4", ipv4Frame(macA, macM, ipM, ipA, "own v4")},
				{"an ARP request from its own", arpFrame(bcast, macM, macM, ipM, ipA, 1)},
				{"an ARP probe (0.0.0.0)", arpFrame(bcast, macM, macM, netip.IPv4Unspecified(), ipM, 1)},
				{"a DHCP discover (0.0.0.0)", ipv4Frame(bcast, macM, netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), "dhcp")},
				{"its own link-local IPv6", ipv6Frame(macA, macM, linkLocalOf(macM), ip6B, 17, make([]byte, 16))},
				{"duplicate address detection (::)", ndpFrame(macM, ip6Zero, 135, ip6M, macM)[:86-8]},
				{"a neighbour advertisement for its own address", ndpFrame(macM, ip6M, 136, ip6M, macM)},
			} {
				if err := m.Send(0, ok.frame); err != nil {
					t.Fatal(err)
				}
				if got, err := a.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, ok.frame) {
					t.Errorf("%s: a got % x, %v", ok.name, got[:min(len(got), 42)], err)
				}
				b.RecvAll(0, 20*time.Millisecond) // broadcasts reach b too
			}
			if n := portStats(t, d, "m").Queues[0].Drops.Spoofed; n != uint64(len(attacks)) {
				t.Errorf("spoofed %d, want %d: a legitimate frame was refused", n, len(attacks))
			}
		})
	}
}

// TestPortSecurityOff: a port whose guest bridges (security off) sends
// from any address, and every address is learned behind it.
func TestPortSecurityOff(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPortMAC(t, d, "a", macA, PortOptions{}), frontend.Config{})
	br := dial(t, addPortMAC(t, d, "br", macM, PortOptions{Security: PortSecurity{Off: true}}), frontend.Config{})
	hosts := [][6]byte{{0x02, 0, 0, 0, 0, 1}, {0x02, 0, 0, 0, 0, 2}, {0x02, 0, 0, 0, 0, 3}}
	for _, h := range hosts {
		fr := udpFrame(macA, h, 1, 2, []byte("bridged"))
		if err := br.Send(0, fr); err != nil {
			t.Fatal(err)
		}
		if got, err := a.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, fr) {
			t.Fatalf("a got %x, %v; want the bridged frame from %x", got, err, h)
		}
	}
	for _, h := range hosts {
		if err := a.Send(0, udpFrame(h, macA, 1, 2, []byte("to a bridged host"))); err != nil {
			t.Fatal(err)
		}
		if got, err := br.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got[0:6], h[:]) {
			t.Fatalf("to %x: the bridge got %x, %v", h, got, err)
		}
	}
	if n := portStats(t, d, "br").Queues[0].Drops.Spoofed; n != 0 {
		t.Errorf("spoofed %d on a port with security off", n)
	}
}

// TestPortSecurityStickyMAC: a port given no MAC takes its guest's first
// source address; it cannot take an address another port owns, and its
// next session (a new guest) may take another.
func TestPortSecurityStickyMAC(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPortMAC(t, d, "a", macA, PortOptions{}), frontend.Config{})
	sm := addPort(t, d, "s", netdev.RoleServer, 1)
	s := dial(t, sm, frontend.Config{})
	// a's address is a's: not taken
	if err := s.Send(0, broadcastFrom(macA)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the frame from a's MAC refused", func() bool { return portStats(t, d, "s").Queues[0].Drops.Spoofed == 1 })
	first := [6]byte{0x02, 0, 0, 0, 0, 0x51}
	for i, src := range [][6]byte{first, {0x02, 0, 0, 0, 0, 0x52}, first} {
		if err := s.Send(0, udpFrame(macA, src, 1, 2, []byte("sticky"))); err != nil {
			t.Fatal(err)
		}
		got, err := a.Recv(0, 500*time.Millisecond)
		if delivered := err == nil; delivered != (src == first) {
			t.Errorf("frame %d from %x: delivered %v (%x), want %v", i, src, delivered, got, src == first)
		}
	}
	if n := portStats(t, d, "s").Queues[0].Drops.Spoofed; n != 2 {
		t.Errorf("spoofed %d, want 2", n)
	}
	// a new session: a new guest with another address
	s.Close()
	waitFor(t, "s disconnected", func() bool { return !portStats(t, d, "s").Connected })
	s = dial(t, sm, frontend.Config{})
	second := [6]byte{0x02, 0, 0, 0, 0, 0x52}
	if err := s.Send(0, udpFrame(macA, second, 1, 2, []byte("new guest"))); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got[6:12], second[:]) {
		t.Fatalf("the new session's first address: a got %x, %v", got, err)
	}
	if err := a.Send(0, udpFrame(second, macA, 1, 2, []byte("back"))); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got[0:6], second[:]) {
		t.Fatalf("to the new address: %x, %v", got, err)
	}
}

// TestPortSecurityRARP: a frontend announcing (SEND_RARP) an address that
// is not its port's moves nothing and is counted.
func TestPortSecurityRARP(t *testing.T) {
	d := newDataplane(t)
	proto := frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoRARP
	a := dial(t, addPortMAC(t, d, "a", macA, PortOptions{}), frontend.Config{})
	b := dial(t, addPortMAC(t, d, "b", macB, PortOptions{}), frontend.Config{})
	m := dial(t, addPortMAC(t, d, "m", macM, PortOptions{}), frontend.Config{ProtocolFeatures: proto})
	learn(t, a, b, 1)
	m.RecvAll(0, 50*time.Millisecond) // learn's broadcasts
	if err := m.Ctrl(vhostuser.ReqSendRARP, append(append([]byte{}, macB[:]...), 0, 0), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the RARP counted as spoofed", func() bool { return portStats(t, d, "m").Queues[0].Drops.Spoofed == 1 })
	if err := a.Send(0, udpFrame(macB, macA, 1, 2, []byte("still b's"))); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Recv(0, 2*time.Second); err != nil || string(got[42:]) != "still b's" {
		t.Fatalf("b after m's announce: %q, %v", got, err)
	}
	if got, err := m.Recv(0, 50*time.Millisecond); err == nil {
		t.Fatalf("m got b's frame: %x", got)
	}
}

// TestAddPortRefusesBadMAC: a multicast or zero MAC is refused, naming
// the field.
func TestAddPortRefusesBadMAC(t *testing.T) {
	d := newDataplane(t)
	for _, mac := range []string{"01:00:5e:00:00:01", "00:00:00:00:00:00"} {
		hw, _ := net.ParseMAC(mac)
		err := d.AddPort(netdev.Config{Name: "x", Socket: sockPath(t, "x"), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500, MAC: hw}, PortOptions{})
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte("mac: "+mac)) {
			t.Errorf("mac %s: %v, want an error naming mac", mac, err)
		}
	}
}

// FuzzGuardCheck: the port security parser reads what a guest wrote. It
// never reads past the head it is given, says how much it read, and
// whatever it lets through carries the port's addresses where it looked.
func FuzzGuardCheck(f *testing.F) {
	for _, fr := range [][]byte{
		arpFrame(bcast, macM, macM, ipM, ipA, 1), arpFrame(bcast, macM, macB, ipB, ipA, 2),
		ipv4Frame(macA, macM, ipM, ipA, "x"), ipv6Frame(macA, macM, ip6M, ip6B, 17, make([]byte, 8)),
		ndpFrame(macM, ip6M, 136, ip6M, macM), ndpFrame(macM, ip6Zero, 135, ip6B, macB), vlanFrame(macA, macM),
	} {
		f.Add(fr, true)
	}
	g := newGuard(PortSecurity{IPs: []netip.Addr{ipM, ip6M}}, net.HardwareAddr(macM[:]))
	gMAC := newGuard(PortSecurity{}, net.HardwareAddr(macM[:]))
	mac := g.mac
	f.Fuzz(func(t *testing.T, fr []byte, ipMode bool) {
		if len(fr) < 14 {
			return
		}
		gd := gMAC
		if ipMode {
			gd = g
		}
		head := fr[:min(len(fr), snapMax)]
		ok, n := gd.check(head, mac)
		if n > len(head) || (!ok && n != 0) || (ok && n < 14) {
			t.Fatalf("check = %v, %d for a %d-byte head", ok, n, len(head))
		}
		if !ok {
			return
		}
		switch binary.BigEndian.Uint16(head[12:14]) {
		case etherARP:
			spa := netip.AddrFrom4([4]byte(head[28:32]))
			if !bytes.Equal(head[22:28], macM[:]) || (ipMode && spa != ipM && !spa.IsUnspecified()) {
				t.Fatalf("ARP from sha %x spa %v let through", head[22:28], spa)
			}
		case etherIPv4:
			if src := netip.AddrFrom4([4]byte(head[26:30])); ipMode && src != ipM && !src.IsUnspecified() {
				t.Fatalf("IPv4 from %v let through", src)
			}
		case etherIPv6:
			if len(head) >= 54 {
				src := netip.AddrFrom16([16]byte(head[22:38]))
				if ipMode && src != ip6M && src != linkLocalOf(macM) && !src.IsUnspecified() {
					t.Fatalf("IPv6 from %v let through", src)
				}
			}
		case etherVLAN, etherQinQ:
			t.Fatal("a tagged frame let through")
		}
	})
}

// TestPortSecurityChecksOnlyTheFamiliesGiven: a port whose IPAM gave only
// IPv4 addresses checks IPv4 sources and leaves its guest's IPv6 alone
// (its own MAC still required).
func TestPortSecurityChecksOnlyTheFamiliesGiven(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPortMAC(t, d, "a", macA, PortOptions{}), frontend.Config{})
	m := dial(t, addPortMAC(t, d, "m", macM, PortOptions{Security: PortSecurity{IPs: []netip.Addr{ipM}}}), frontend.Config{})
	v6 := ipv6Frame(macA, macM, netip.MustParseAddr("fd00::77"), ip6B, 17, make([]byte, 16))
	for _, fr := range [][]byte{v6, ndpFrame(macM, netip.MustParseAddr("fe80::1234"), 136, netip.MustParseAddr("fe80::1234"), macM)} {
		if err := m.Send(0, fr); err != nil {
			t.Fatal(err)
		}
		if got, err := a.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got, fr) {
			t.Fatalf("IPv6 from an IPv4-only port: a got %x, %v", got, err)
		}
	}
	if err := m.Send(0, ipv4Frame(macA, macM, ipB, ipA, "forged")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the forged IPv4 source counted", func() bool { return portStats(t, d, "m").Queues[0].Drops.Spoofed == 1 })
}

// TestPortSecurityDeliversWhatItChecked: a guest that rewrites its frames
// between the check and the copy (another vCPU of it, racing the worker)
// gets them delivered as they were checked: the rewrite of the source MAC
// and IP, done here between classify and the switching, reaches nobody,
// on the flood path (put) and the unicast run alike.
func TestPortSecurityDeliversWhatItChecked(t *testing.T) {
	d, err := New(Config{CPUs: []int{0}, Logger: testLogger(t), Watchdog: WatchdogConfig{Bound: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	w := d.workers[0] // stopped: the test runs its passes
	w.halt()
	cfg := frontend.Config{RxPoll: true}
	sec := func(ip netip.Addr) PortOptions { return PortOptions{Security: PortSecurity{IPs: []netip.Addr{ip}}} }
	m := dial(t, addPortMAC(t, d, "m", macM, sec(ipM)), cfg)
	b := dial(t, addPortMAC(t, d, "b", macB, sec(ipB)), cfg)
	// b speaks first, so that m's unicast frames to it are switched, not flooded
	if err := b.Send(0, ipv4Frame(bcast, macB, ipB, ipM, "hello")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		w.pass()
		if _, err := m.Recv(0, time.Millisecond); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's greeting did not reach m")
		}
	}
	frames := [][]byte{ipv4Frame(bcast, macM, ipM, ipB, "race-0"), ipv4Frame(macB, macM, ipM, ipB, "race-1"), ipv4Frame(macB, macM, ipM, ipB, "race-2")}
	if n, err := m.SendBurst(0, frames); err != nil || n != len(frames) {
		t.Fatalf("sent %d: %v", n, err)
	}
	rewritten := 0
	w.classified = func() {
		mem := m.Mem()
		for i := range frames {
			at := bytes.Index(mem, []byte(fmt.Sprintf("race-%d", i))) - 42
			if at < 0 {
				continue
			}
			copy(mem[at+6:at+12], macB[:])
			b4 := ipB.As4()
			copy(mem[at+26:at+30], b4[:])
			rewritten++
		}
	}
	w.pass()
	w.classified = nil
	if rewritten != len(frames) {
		t.Fatalf("the test rewrote %d of %d frames in m's memory", rewritten, len(frames))
	}
	got, err := b.RecvAll(0, 100*time.Millisecond)
	if err != nil || len(got) != len(frames) {
		t.Fatalf("b got %d frames, %v; want %d", len(got), err, len(frames))
	}
	for i, fr := range got {
		if !bytes.Equal(fr[6:12], macM[:]) || netip.AddrFrom4([4]byte(fr[26:30])) != ipM {
			t.Errorf("frame %d reached b from %x, %v: the rewrite after the check went through", i, fr[6:12], netip.AddrFrom4([4]byte(fr[26:30])))
		}
	}
}
