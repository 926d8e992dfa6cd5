package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Offloads on the per-packet path (offloads.go): a GSO or partial-checksum
// frame goes whole to a guest that negotiated the GUEST_* features, and
// segmented or completed (checked against a reference checksum) to one
// that did not, floods included; hostile headers are dropped and counted.

const (
	hostOffloads = 1<<virtio.NetFCsum | 1<<virtio.NetFHostTSO4 | 1<<virtio.NetFHostTSO6 | 1<<virtio.NetFHostECN
	guestOffload = 1<<virtio.NetFGuestCsum | 1<<virtio.NetFGuestTSO4 | 1<<virtio.NetFGuestTSO6 | 1<<virtio.NetFGuestECN
)

// offloadCfg is a frontend that sends with offloads and, with guest,
// receives them.
func offloadCfg(guest bool) frontend.Config {
	f := uint64(frontend.DefaultFeatures | hostOffloads)
	if guest {
		f |= guestOffload
	}
	return frontend.Config{QueueSize: 256, RxPoll: true, Features: f, TxBufSize: 1 << 17}
}

// tcpGSO is a TCP frame (IPv4, or IPv6 with v6) from src to dst with
// payload bytes as a guest with offloads sends it: the checksum field
// holds the pseudo-header sum, and its header says NEEDS_CSUM and, with
// mss > 0, TCP GSO.
func tcpGSO(dst, src [6]byte, v6 bool, payload, mss int) ([]byte, virtio.NetHdr) {
	l4 := make([]byte, 20+payload)
	binary.BigEndian.PutUint16(l4[0:], 40000)
	binary.BigEndian.PutUint16(l4[2:], 5201)
	binary.BigEndian.PutUint32(l4[4:], 1000)
	l4[12], l4[13] = 5<<4, 0x18 // PSH ACK
	for i := range payload {
		l4[20+i] = byte(i ^ i>>8)
	}
	var f []byte
	var pseudo []byte
	if v6 {
		f = make([]byte, 14+40+len(l4))
		copy(f, dst[:])
		copy(f[6:], src[:])
		binary.BigEndian.PutUint16(f[12:], 0x86dd)
		ip := f[14:]
		ip[0], ip[6], ip[7] = 0x60, 6, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[8], ip[23], ip[24], ip[39] = 0xfd, 1, 0xfd, 2
		copy(ip[40:], l4)
		pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, byte(len(l4)>>8), byte(len(l4)), 0, 0, 0, 6)
	} else {
		f = nettest.IPv4(dst, src, [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 6, l4)
		pseudo = append(append([]byte{}, f[26:34]...), 0, 6, byte(len(l4)>>8), byte(len(l4)))
	}
	l4at := len(f) - len(l4)
	binary.BigEndian.PutUint16(f[l4at+16:], ^nettest.Checksum(pseudo))
	h := virtio.NetHdr{Flags: virtio.NetHdrFNeedsCsum, CsumStart: uint16(l4at), CsumOffset: 16, HdrLen: uint16(l4at + 20)}
	if mss > 0 {
		h.GSOType, h.GSOSize = offload.GSOTCPv4, uint16(mss)
		if v6 {
			h.GSOType = offload.GSOTCPv6
		}
	}
	return f, h
}

// checkWire checks that f is a complete TCP segment (IP and TCP checksums
// verify with nettest.Checksum) and returns its payload.
func checkWire(t *testing.T, f []byte) []byte {
	t.Helper()
	var pseudo, l4 []byte
	if binary.BigEndian.Uint16(f[12:]) == 0x86dd {
		ip := f[14:]
		l4 = ip[40:]
		if int(binary.BigEndian.Uint16(ip[4:])) != len(l4) {
			t.Fatalf("IPv6 payload length %d, frame has %d", binary.BigEndian.Uint16(ip[4:]), len(l4))
		}
		pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, byte(len(l4)>>8), byte(len(l4)), 0, 0, 0, 6)
	} else {
		ip := f[14:]
		if nettest.Checksum(ip[:20]) != 0 || int(binary.BigEndian.Uint16(ip[2:])) != len(ip) {
			t.Fatalf("IPv4 header: checksum or length wrong: % x", ip[:20])
		}
		l4 = ip[20:]
		pseudo = append(append([]byte{}, ip[12:20]...), 0, 6, byte(len(l4)>>8), byte(len(l4)))
	}
	if nettest.Checksum(append(pseudo, l4...)) != 0 {
		t.Fatal("TCP checksum does not verify")
	}
	return l4[20:]
}

func recvAllHdr(t *testing.T, f *frontend.Frontend) (hdrs []virtio.NetHdr, frames [][]byte) {
	t.Helper()
	for {
		h, b, err := f.RecvHdr(0, 0)
		if errors.Is(err, frontend.ErrTimeout) {
			return hdrs, frames
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs, frames = append(hdrs, h), append(frames, b)
	}
}

func rxCounters(r *burstRig, name string) *netdev.Counters {
	return &r.d.byName[name].dev.Vrings()[0].Counters
}

// A GSO frame to a guest that takes GSO arrives whole with its metadata
// (one frame, spanning mergeable buffers); to one that does not, as
// wire-sized segments with complete checksums; a flood does both.
func TestOffloadGSOWholeOrSegmented(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		r := newBurstRig(t, [][6]byte{macA, macB, macC}, []frontend.Config{offloadCfg(false), offloadCfg(true), offloadCfg(false)})
		a, b, c := r.fes[0], r.fes[1], r.fes[2]
		const payload = 30000
		mss := 1448 // the most a 1500 MTU allows
		if v6 {
			mss = 1440
		}
		want := (payload + mss - 1) / mss
		for _, dst := range [][6]byte{macB, macC, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff}} {
			f, h := tcpGSO(dst, macA, v6, payload, mss)
			if err := a.SendHdr(0, &h, f); err != nil {
				t.Fatal(err)
			}
			r.w.pass()
			a.ReclaimTx(0)
			toB, toC := dst != macC, dst != macB
			hs, fs := recvAllHdr(t, b)
			if toB {
				if len(fs) != 1 || !bytes.Equal(fs[0], f) {
					t.Fatalf("v6=%v to %x: b got %d frames, want the GSO frame whole", v6, dst, len(fs))
				}
				got := hs[0]
				got.NumBuffers, h.NumBuffers = 0, 0
				if got != h {
					t.Errorf("v6=%v: b's header %+v, sent %+v", v6, got, h)
				}
			} else if len(fs) != 0 {
				t.Errorf("b got %d frames addressed to c", len(fs))
			}
			hs, fs = recvAllHdr(t, c)
			if toC {
				if len(fs) != want {
					t.Fatalf("v6=%v to %x: c got %d frames, want %d segments", v6, dst, len(fs), want)
				}
				var all []byte
				for i, s := range fs {
					if hs[i].Flags != 0 || hs[i].GSOType != 0 {
						t.Errorf("segment %d header %+v, want no metadata", i, hs[i])
					}
					all = append(all, checkWire(t, s)...)
				}
				if !bytes.Equal(all, f[len(f)-payload:]) {
					t.Error("the segments' payload differs from the GSO frame's")
				}
			} else if len(fs) != 0 {
				t.Errorf("c got %d frames addressed to b", len(fs))
			}
		}
		if n := rxCounters(r, "b").GSOWhole.Load(); n != 2 {
			t.Errorf("b: %d GSO frames counted whole, want 2", n)
		}
		if n := rxCounters(r, "c").GSOSegmented.Load(); n != 2 {
			t.Errorf("c: %d GSO frames counted segmented, want 2", n)
		}
	}
}

// A partial checksum goes through as is to a guest with GUEST_CSUM and is
// completed for one without.
func TestOffloadChecksum(t *testing.T) {
	r := newBurstRig(t, [][6]byte{macA, macB, macC}, []frontend.Config{offloadCfg(false), offloadCfg(true), offloadCfg(false)})
	a, b, c := r.fes[0], r.fes[1], r.fes[2]
	for _, dst := range [][6]byte{macB, macC} {
		f, h := tcpGSO(dst, macA, false, 1000, 0)
		if err := a.SendHdr(0, &h, f); err != nil {
			t.Fatal(err)
		}
	}
	r.w.pass()
	hs, fs := recvAllHdr(t, b)
	if len(fs) != 1 || hs[0].Flags != virtio.NetHdrFNeedsCsum || hs[0].CsumStart != 34 || hs[0].CsumOffset != 16 {
		t.Fatalf("b: %d frames, header %+v; want one with NEEDS_CSUM at 34+16", len(fs), hs)
	}
	if nettest.Checksum(fs[0][14:34]) != 0 {
		t.Error("b: IPv4 header damaged")
	}
	hs, fs = recvAllHdr(t, c)
	if len(fs) != 1 || hs[0].Flags != 0 {
		t.Fatalf("c: %d frames, headers %+v; want one without metadata", len(fs), hs)
	}
	checkWire(t, fs[0])
	if n := rxCounters(r, "c").CsumSoftware.Load(); n != 1 {
		t.Errorf("c: %d checksums completed, want 1", n)
	}
}

// Headers that do not describe their frame are dropped and counted; the
// ring goes on and nothing reaches the destination.
func TestOffloadHostileHeaders(t *testing.T) {
	r := newBurstRig(t, [][6]byte{macA, macB}, []frontend.Config{offloadCfg(false), offloadCfg(true)})
	a, b := r.fes[0], r.fes[1]
	good, gh := tcpGSO(macB, macA, false, 3000, 1448)
	arp := nettest.ARPRequest(macA, [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2})
	copy(arp, macB[:])
	bad := []struct {
		name  string
		frame []byte
		h     virtio.NetHdr
	}{
		{"csum past the end", good[:100], virtio.NetHdr{Flags: 1, CsumStart: 98, CsumOffset: 16}},
		{"csum_start 0xffff", good, virtio.NetHdr{Flags: 1, CsumStart: 0xffff, CsumOffset: 0xffff}},
		{"gso on ARP", arp, virtio.NetHdr{Flags: 1, GSOType: offload.GSOTCPv4, GSOSize: 100, CsumStart: 14, CsumOffset: 16}},
		{"gso without csum", good, virtio.NetHdr{GSOType: offload.GSOTCPv4, GSOSize: 1448}},
		{"gso_size 0", good, virtio.NetHdr{Flags: 1, GSOType: offload.GSOTCPv4, CsumStart: 34, CsumOffset: 16}},
		{"UFO", good, virtio.NetHdr{Flags: 1, GSOType: offload.GSOUDP, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}},
		{"unknown flags", good, virtio.NetHdr{Flags: 0x84}},
		{"TCPv6 on IPv4", good, virtio.NetHdr{Flags: 1, GSOType: offload.GSOTCPv6, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}},
		{"segments over the MTU", good, virtio.NetHdr{Flags: 1, GSOType: offload.GSOTCPv4, GSOSize: 9000, CsumStart: 34, CsumOffset: 16}},
	}
	for _, x := range bad {
		if err := a.SendHdr(0, &x.h, x.frame); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.SendHdr(0, &gh, good); err != nil {
		t.Fatal(err)
	}
	r.w.pass()
	_, fs := recvAllHdr(t, b)
	if len(fs) != 1 || !bytes.Equal(fs[0], good) {
		t.Fatalf("b got %d frames, want only the good one", len(fs))
	}
	st := portStats(t, r.d, "a").Queues[0]
	tx := &r.d.byName["a"].dev.Vrings()[1].Counters
	if n := tx.DropOffload.Load(); n != uint64(len(bad)-1) || st.Drops.MTU != 1 || st.Drops.BadChain != 0 {
		t.Errorf("a: %d bad offload drops, %d MTU drops, %d bad chains; want %d, 1, 0", n, st.Drops.MTU, st.Drops.BadChain, len(bad)-1)
	}
}

// Moving frames with offload metadata allocates nothing either.
func TestOffloadPathAllocatesNothing(t *testing.T) {
	r := newBurstRig(t, [][6]byte{macA, macB, macC}, []frontend.Config{offloadCfg(false), offloadCfg(true), offloadCfg(false)})
	a := r.fes[0]
	fb, hb := tcpGSO(macB, macA, false, 20000, 1448)
	fc, hc := tcpGSO(macC, macA, true, 20000, 1440)
	fs, hs := tcpGSO(macC, macA, false, 500, 0)
	// The first pass may allocate; the next ones are measured around the
	// pass alone (the frontend's sends and receives allocate). The
	// process-wide count also sees other goroutines now and then, so the
	// least of five passes counts: an allocation per frame shows in all.
	allocs := uint64(1 << 62)
	for i := range 6 {
		a.ReclaimTx(0)
		for _, x := range []struct {
			f []byte
			h virtio.NetHdr
		}{{fb, hb}, {fc, hc}, {fs, hs}} {
			if err := a.SendHdr(0, &x.h, x.f); err != nil {
				t.Fatal(err)
			}
		}
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		if !r.w.pass() {
			t.Fatal("the pass found no work")
		}
		runtime.ReadMemStats(&m1)
		if i > 0 {
			allocs = min(allocs, m1.Mallocs-m0.Mallocs)
		}
		recvAllHdr(t, r.fes[1])
		if _, got := recvAllHdr(t, r.fes[2]); len(got) != 14+1 {
			t.Errorf("c received %d frames, want %d", len(got), 14+1)
		}
	}
	if allocs != 0 {
		t.Errorf("a pass with offload frames allocated %d times", allocs)
	}
}

// vnetSocket is an AF_PACKET socket on the peer node's end of the veth
// with PACKET_VNET_HDR: it sends and receives GSO frames behind a 10-byte
// virtio_net_hdr, as a NIC with TSO would.
func vnetSocket(t *testing.T, b *uplinkBed) int {
	t.Helper()
	var fd int
	nettest.In(t, b.peer, func() {
		var err error
		proto := int(htons(unix.ETH_P_ALL))
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			t.Fatal(err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			t.Fatal(err)
		}
		tv := unix.Timeval{Usec: 200_000}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			t.Fatal(err)
		}
		ifi, err := net.InterfaceByName("vB")
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Protocol: uint16(proto)}); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestTapUplinkOffloads: GSO frames cross the tap whole both ways. From
// the peer node (a TSO "NIC"), a 30000-byte TCP frame reaches a guest
// with GUEST_TSO4 as one GSO frame and a guest without as checked
// segments; a guest's GSO frame goes into the tap whole and its payload
// reaches the peer.
func TestTapUplinkOffloads(t *testing.T) {
	b := quietBed(t)
	d := uplinkDataplane(t, b.node)
	a := dial(t, addPortOpt(t, d, "a", PortOptions{Network: "red", Uplink: true}), offloadCfg(true))
	c := dial(t, addPortOpt(t, d, "c", PortOptions{Network: "red", Uplink: true}), offloadCfg(false))
	for _, g := range []struct {
		f   *frontend.Frontend
		mac [6]byte
	}{{a, macA}, {c, macC}} {
		if err := g.f.Send(0, ipFrame([6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, g.mac)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both guests' broadcasts on the tap", func() bool { s, _ := d.UplinkStats(); return s.TxPackets >= 2 })
	fd := vnetSocket(t, b)
	const payload = 30000
	send := func(dst [6]byte) []byte {
		f, h := tcpGSO(dst, peerMAC2, false, payload, 1448)
		var hb [virtio.NetHdrSize]byte
		h.Encode(hb[:])
		if _, err := unix.Write(fd, append(hb[:virtio.NetHdrLegacySize:virtio.NetHdrLegacySize], f...)); err != nil {
			t.Fatal(err)
		}
		return f
	}
	// to a: one GSO frame, whole
	f := send(macA)
	var got virtio.NetHdr
	var frame []byte
	waitFor(t, "the GSO frame at a", func() bool {
		h, fr, err := a.RecvHdr(0, 0)
		if err == nil && bytes.Equal(fr[6:12], peerMAC2[:]) {
			got, frame = h, fr
			return true
		}
		return false
	})
	if got.GSOType != offload.GSOTCPv4 || got.GSOSize != 1448 || got.Flags&virtio.NetHdrFNeedsCsum == 0 ||
		!bytes.Equal(frame[54:], f[54:]) {
		t.Errorf("a got header %+v and %d bytes, want the %d-byte GSO frame whole", got, len(frame), len(f))
	}
	// to c: segments with complete checksums
	f = send(macC)
	var all []byte
	waitFor(t, "the segments at c", func() bool {
		for {
			_, fr, err := c.RecvHdr(0, 0)
			if err != nil {
				return len(all) == payload
			}
			if bytes.Equal(fr[6:12], peerMAC2[:]) {
				all = append(all, checkWire(t, fr)...)
			}
		}
	})
	if !bytes.Equal(all, f[54:]) {
		t.Error("c's segments do not carry the frame's payload")
	}
	if n := rxCounters(&burstRig{d: d}, "c").GSOSegmented.Load(); n != 1 {
		t.Errorf("c: %d frames segmented, want 1", n)
	}
	// from a: into the tap whole; the peer sees the payload (as one GSO
	// frame or as segments, the kernel's choice)
	fa, ha := tcpGSO(b.peerMAC, macA, false, payload, 1448)
	if err := a.SendHdr(0, &ha, fa); err != nil {
		t.Fatal(err)
	}
	seen := 0
	buf := make([]byte, 1<<17)
	deadline := time.Now().Add(5 * time.Second)
	for seen < payload && time.Now().Before(deadline) {
		n, err := unix.Read(fd, buf)
		if err != nil || n < virtio.NetHdrLegacySize+54 {
			continue
		}
		fr := buf[virtio.NetHdrLegacySize:n]
		if bytes.Equal(fr[6:12], macA[:]) && binary.BigEndian.Uint16(fr[12:]) == 0x0800 && fr[23] == 6 {
			seen += len(fr) - 54
		}
	}
	if seen != payload {
		t.Errorf("the peer saw %d bytes of a's %d-byte GSO frame", seen, payload)
	}
	// counted right after the write the peer may already have seen
	waitFor(t, "the GSO frame counted whole at the uplink", func() bool { s, _ := d.UplinkStats(); return s.TxGSOWhole == 1 })
	if s, _ := d.UplinkStats(); s.TxGSOSegmented != 0 || s.RxBadOffload != 0 {
		t.Errorf("uplink: %d GSO frames segmented, %d bad headers; want 0, 0", s.TxGSOSegmented, s.RxBadOffload)
	}
}
