package dataplane

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

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
	// the first pass may allocate; the second is measured, around the
	// pass alone (the frontend's sends and receives allocate)
	for _, x := range []struct {
		f []byte
		h virtio.NetHdr
	}{{fb, hb}, {fc, hc}, {fs, hs}} {
		if err := a.SendHdr(0, &x.h, x.f); err != nil {
			t.Fatal(err)
		}
	}
	r.w.pass()
	for _, f := range r.fes[1:] {
		recvAllHdr(t, f)
	}
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
	allocs := m1.Mallocs - m0.Mallocs
	if _, got := recvAllHdr(t, r.fes[2]); len(got) != 14+1 {
		t.Errorf("c received %d frames, want %d", len(got), 14+1)
	}
	if allocs != 0 {
		t.Errorf("a pass with offload frames allocated %d times", allocs)
	}
}
