package dataplane

import (
	"errors"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
)

// logRig: port a sends to port b, whose frontend acts as a migrating
// QEMU: it hands over a dirty log and turns LOG_ALL on.
type logRig struct {
	a, b   *frontend.Frontend
	logFD  int
	log    []byte // the log, as the frontend sees it
	logLen uint64
}

func newLogRig(t *testing.T, bcfg frontend.Config) *logRig {
	d := newDataplane(t)
	bcfg.ProtocolFeatures = frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoLogSHMFD
	bcfg.RxPoll = true
	r := &logRig{
		a: dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{}),
		b: dial(t, addPort(t, d, "b", netdev.RoleServer, 1), bcfg),
	}
	learn(t, r.a, r.b, 1)
	r.logFD, r.log, r.logLen = newDirtyLog(t, r.b)
	return r
}

// newDirtyLog makes a dirty log for fe's guest memory, as QEMU does when a
// migration starts: one bit per 4 KiB page, in whole 64-bit words, in a
// memfd (closed and unmapped when the test ends).
func newDirtyLog(tb testing.TB, fe *frontend.Frontend) (fd int, log []byte, size uint64) {
	pages := (fe.GPA(len(fe.Mem())) + 4095) / 4096
	size = (pages + 63) / 64 * 8
	fd, err := unix.MemfdCreate("dirty-log", unix.MFD_CLOEXEC)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		tb.Fatal(err)
	}
	log, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Munmap(log) })
	return fd, log, size
}

// startDirtyLog turns dirty-page logging on for fe's port as a migrating
// QEMU does: SET_LOG_BASE, SET_FEATURES with LOG_ALL, the RX ring's used
// ring logged (VHOST_VRING_F_LOG).
func startDirtyLog(tb testing.TB, fe *frontend.Frontend) {
	fd, _, size := newDirtyLog(tb, fe)
	if err := fe.SetLogBase(fd, size, 0); err != nil {
		tb.Fatalf("SET_LOG_BASE: %v", err)
	}
	r := &logRig{b: fe}
	r.setFeatures(tb, true)
	r.setLogUsed(tb, true)
}

// setFeatures sends SET_FEATURES with b's negotiated features, LOG_ALL on
// or off.
func (r *logRig) setFeatures(t testing.TB, logAll bool) {
	t.Helper()
	f := r.b.Info().Features
	if logAll {
		f |= 1 << vhostuser.FeatureLogAll
	}
	if err := r.b.Ctrl(vhostuser.ReqSetFeatures, vhostuser.EncodeU64(nil, f), nil); err != nil {
		t.Fatal(err)
	}
}

// setLogUsed re-sends b's RX ring address with or without VHOST_VRING_F_LOG.
func (r *logRig) setLogUsed(t testing.TB, on bool) {
	t.Helper()
	vi, err := r.b.Vring(0)
	if err != nil {
		t.Fatal(err)
	}
	a := vhostuser.VringAddr{Index: 0, Desc: vi.DescUA, Used: vi.UsedUA, Avail: vi.AvailUA, Log: vi.UsedGPA}
	if on {
		a.Flags = vhostuser.VringAddrFlagLog
	}
	if err := r.b.Ctrl(vhostuser.ReqSetVringAddr, a.Encode(nil), nil); err != nil {
		t.Fatal(err)
	}
}

// marked returns the pages set in the log and clears it (as QEMU does).
func (r *logRig) marked() []uint64 {
	var out []uint64
	for i, b := range r.log {
		for bit := range 8 {
			if b&(1<<bit) != 0 {
				out = append(out, uint64(i)*8+uint64(bit))
			}
		}
		r.log[i] = 0
	}
	return out
}

// exchange sends n frames a -> b in one burst and returns the pages the dataplane wrote
// into b's memory: the RX buffers (as long as each used element says) and,
// with usedRing, b's used ring elements and its flags/idx word.
func (r *logRig) exchange(t *testing.T, n int, usedRing bool) []uint64 {
	t.Helper()
	vi, _ := r.b.Vring(0)
	start := r.b.UsedIdx(0)
	var frames [][]byte
	for i := range n {
		frames = append(frames, udpFrame(macB, macA, uint16(i), 9, make([]byte, 100+i*150)))
	}
	if sent, err := r.a.SendBurst(0, frames); err != nil || sent != n {
		t.Fatalf("sent %d of %d: %v", sent, n, err)
	}
	// A frame takes one used element per buffer (several when it spans
	// small ones): wait until the index stops moving.
	deadline := time.Now().Add(2 * time.Second)
	for r.b.UsedIdx(0)-start < uint16(n) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	for last := start; last != r.b.UsedIdx(0); {
		last = r.b.UsedIdx(0)
		time.Sleep(20 * time.Millisecond)
	}
	want := map[uint64]bool{}
	mark := func(gpa, len uint64) {
		for p := gpa / 4096; p <= (gpa+len-1)/4096; p++ {
			want[p] = true
		}
	}
	for i := start; i != r.b.UsedIdx(0); i++ {
		e := r.b.UsedElemAt(0, i)
		desc, err := r.b.ReadDesc(0, int(e.ID))
		if err != nil {
			t.Fatal(err)
		}
		mark(desc.Addr, uint64(e.Len))
		if usedRing {
			mark(vi.UsedGPA+4+8*uint64(i%uint16(vi.Size)), 8)
		}
	}
	if usedRing {
		mark(vi.UsedGPA, 4)
	}
	if got, err := r.b.RecvAll(0, 0); err != nil || len(got) != n {
		t.Fatalf("b received %d frames, want %d: %v", len(got), n, err)
	}
	var out []uint64
	for p := range want {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func samePages(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDirtyLogMarksWhatTheDataplaneWrote: with LOG_ALL the log holds
// exactly the pages of the RX buffers the dataplane wrote and, once
// SET_VRING_ADDR asks for VHOST_VRING_F_LOG, those of the used ring's
// elements and index; without LOG_ALL nothing.
func TestDirtyLogMarksWhatTheDataplaneWrote(t *testing.T) {
	for _, v := range rxVariants {
		t.Run(v.name, func(t *testing.T) { testDirtyLog(t, v.cfg) })
	}
}

func testDirtyLog(t *testing.T, bcfg frontend.Config) {
	r := newLogRig(t, bcfg)
	if got := r.exchange(t, 4, false); len(got) == 0 {
		t.Fatal("no pages written: the rig tests nothing")
	}
	if err := r.b.SetLogBase(r.logFD, r.logLen, 0); err != nil {
		t.Fatalf("SET_LOG_BASE: %v", err)
	}
	if got := r.marked(); len(got) != 0 {
		t.Fatalf("pages marked before LOG_ALL: %v", got)
	}
	r.setFeatures(t, true)
	r.marked() // the rings restarting may publish; not what is measured
	want := r.exchange(t, 8, false)
	if got := r.marked(); !samePages(got, want) {
		t.Fatalf("LOG_ALL, used ring not logged: marked %v, want the RX buffers' %v", got, want)
	}
	r.setLogUsed(t, true)
	r.marked()
	want = r.exchange(t, 8, true)
	if got := r.marked(); !samePages(got, want) {
		t.Fatalf("LOG_ALL and VRING_F_LOG: marked %v, want %v", got, want)
	}
	r.setFeatures(t, false)
	r.marked()
	r.exchange(t, 4, true)
	if got := r.marked(); len(got) != 0 {
		t.Fatalf("pages marked after LOG_ALL was cleared: %v", got)
	}
}

// TestDirtyLogRefused: a log the frontend's fd cannot hold is refused with
// a NACK naming nothing else; the port goes on forwarding.
func TestDirtyLogRefused(t *testing.T) {
	r := newLogRig(t, frontend.Config{})
	err := r.b.SetLogBase(r.logFD, r.logLen*2, 0)
	var nack *frontend.NackError
	if !errors.As(err, &nack) {
		t.Fatalf("SET_LOG_BASE past the file's end: %v, want a NACK", err)
	}
	if err := r.b.SetLogBase(r.logFD, 12, 0); !errors.As(err, &nack) {
		t.Fatalf("SET_LOG_BASE of a partial word: %v, want a NACK", err)
	}
	r.exchange(t, 4, false) // still forwarding
}

// TestMigrationTwoPortsOneMAC: during a migration the source port and the
// target port carry the same MAC. Frames go to the source until the
// target announces (QEMU's SEND_RARP when the guest cannot announce
// itself), then only to the target; removing the source port afterwards
// leaves the target's entry alone.
func TestMigrationTwoPortsOneMAC(t *testing.T) {
	d := newDataplane(t)
	proto := frontend.DefaultProtocolFeatures | 1<<vhostuser.ProtoRARP
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 1), frontend.Config{})
	// both ports of the migrating VM are given its MAC, as the CNI does
	src := dial(t, addPortMAC(t, d, "src", macB, PortOptions{}), frontend.Config{})
	learn(t, a, src, 1)
	dst := dial(t, addPortMAC(t, d, "dst", macB, PortOptions{}), frontend.Config{ProtocolFeatures: proto})
	dst.RecvAll(0, 100*time.Millisecond)
	send := func(tag string) {
		t.Helper()
		if err := a.Send(0, udpFrame(macB, macA, 1, 9, []byte(tag))); err != nil {
			t.Fatal(err)
		}
	}
	recvOnly := func(to, not *frontend.Frontend, tag string) {
		t.Helper()
		got, err := to.Recv(0, 2*time.Second)
		if err != nil || string(got[42:]) != tag {
			t.Fatalf("%s: got %q, %v", tag, got, err)
		}
		if got, err := not.Recv(0, 50*time.Millisecond); err == nil {
			t.Fatalf("%s: the other port got %q too", tag, got)
		}
	}
	send("before the announce")
	recvOnly(src, dst, "before the announce")
	// the target announces macB (8 bytes: the MAC, then padding)
	rarp := append(append([]byte{}, macB[:]...), 0, 0)
	if err := dst.Ctrl(vhostuser.ReqSendRARP, rarp, nil); err != nil {
		t.Fatal(err)
	}
	// the announcement reaches the network's other guests as a RARP
	// broadcast from macB (the guest could not announce itself)
	got, err := a.Recv(0, 2*time.Second)
	if err != nil || len(got) != 60 || [6]byte(got[0:6]) != [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} || [6]byte(got[6:12]) != macB ||
		got[12] != 0x80 || got[13] != 0x35 || got[21] != 3 || [6]byte(got[22:28]) != macB {
		t.Fatalf("after SEND_RARP the other guest got % x, %v; want a 60-byte RARP reverse request from %x", got, err, macB)
	}
	if got, err := src.Recv(0, 50*time.Millisecond); err == nil && !(got[12] == 0x80 && got[13] == 0x35) {
		t.Fatalf("the source port got % x", got)
	}
	src.RecvAll(0, 50*time.Millisecond)
	send("after the announce")
	recvOnly(dst, src, "after the announce")
	if err := d.RemovePort("src"); err != nil {
		t.Fatal(err)
	}
	send("after the source left")
	got, err = dst.Recv(0, 2*time.Second)
	if err != nil || string(got[42:]) != "after the source left" {
		t.Fatalf("after the source port was removed: %q, %v", got, err)
	}
}
