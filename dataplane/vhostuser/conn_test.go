package vhostuser

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMain fails the package if any test leaves file descriptors open.
func TestMain(m *testing.M) {
	// The first net.FileConn creates the runtime's epoll and wake-up fds;
	// create them before taking the baseline.
	c, peer, err := newPair()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	c.Close()
	unix.Close(peer)
	before := countFDs()
	code := m.Run()
	if after := countFDs(); code == 0 && after != before {
		fmt.Fprintf(os.Stderr, "fd leak: %d open file descriptors before the tests, %d after\n", before, after)
		code = 1
	}
	os.Exit(code)
}

// countFDs returns how many file descriptors this process has open.
func countFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		panic(err)
	}
	return len(ents)
}

// newPair returns the backend end of a unix stream socketpair as a Conn and
// the frontend end as a raw fd.
func newPair() (*Conn, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, -1, err
	}
	f := os.NewFile(uintptr(fds[0]), "backend")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, -1, err
	}
	return NewConn(nc.(*net.UnixConn)), fds[1], nil
}

// pair is newPair for tests; both ends close when the test ends.
func pair(t *testing.T) (*Conn, int) {
	t.Helper()
	c, peer, err := newPair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		unix.Close(peer)
	})
	return c, peer
}

// connPair returns both ends as Conns.
func connPair(t *testing.T) (backend, frontend *Conn) {
	t.Helper()
	b, peer := pair(t)
	dup, err := unix.Dup(peer)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(dup), "frontend")
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	fc := NewConn(nc.(*net.UnixConn))
	t.Cleanup(func() { fc.Close() })
	return b, fc
}

// eventfds returns n fresh eventfds, closed when the test ends.
func eventfds(t testing.TB, n int) []int {
	t.Helper()
	fds := make([]int, n)
	for i := range fds {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		fds[i] = fd
	}
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	return fds
}

// rawMessage frames a message by hand, with any flags and size field.
func rawMessage(req Request, flags, size uint32, payload []byte) []byte {
	b := le.AppendUint32(nil, uint32(req))
	b = le.AppendUint32(b, flags)
	b = le.AppendUint32(b, size)
	return append(b, payload...)
}

// send writes b on the raw fd with fds attached to its first byte.
func send(t testing.TB, fd int, b []byte, fds []int) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(fd, b, oob, nil, 0); err != nil {
		t.Fatalf("sendmsg: %v", err)
	}
}

func u64(v uint64) []byte { return EncodeU64(nil, v) }

func sameFile(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		t.Fatalf("fstat %d: %v", a, err)
	}
	if err := unix.Fstat(b, &sb); err != nil {
		t.Fatalf("fstat %d: %v", b, err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func TestRoundTrip(t *testing.T) {
	b, f := connPair(t)
	base := countFDs()
	mem := eventfds(t, 2)
	regions := []MemRegion{
		{GuestPhysAddr: 0, Size: 0xa0000, UserAddr: 0x7f0000000000, MmapOffset: 0},
		{GuestPhysAddr: 0x100000, Size: 0x7ff00000, UserAddr: 0x7f0000100000, MmapOffset: 0x100000},
	}
	payload := EncodeMemTable(nil, regions)
	if err := f.WriteMessage(ReqSetMemTable, FlagNeedReply, payload, mem); err != nil {
		t.Fatal(err)
	}
	m, err := b.ReadMessage()
	if err != nil {
		t.Fatal(err)
	}
	if m.Request != ReqSetMemTable || m.Flags != Version|FlagNeedReply || !m.NeedReply() {
		t.Errorf("header: request %v flags %#x", m.Request, m.Flags)
	}
	if !bytes.Equal(m.Payload, payload) {
		t.Errorf("payload differs")
	}
	if len(m.FDs) != 2 || !sameFile(t, m.FDs[0], mem[0]) || !sameFile(t, m.FDs[1], mem[1]) {
		t.Fatalf("fds %v do not match what was sent", m.FDs)
	}
	got, err := DecodeMemTable(m.Payload)
	if err != nil || len(got) != 2 || got[0] != regions[0] || got[1] != regions[1] {
		t.Errorf("DecodeMemTable = %v, %v", got, err)
	}
	fd := m.TakeFD(1)
	if fd < 0 || m.FDs[1] != -1 || m.TakeFD(1) != -1 || m.TakeFD(2) != -1 {
		t.Errorf("TakeFD: got %d, FDs %v", fd, m.FDs)
	}
	m.CloseFDs()
	if m.FDs[0] != -1 {
		t.Errorf("CloseFDs left %v", m.FDs)
	}
	if n := countFDs(); n != base+2+1 { // the 2 eventfds and the taken fd
		t.Errorf("%d fds open, want %d", n, base+3)
	}
	unix.Close(fd)

	// A reply goes the other way with REPLY set.
	if err := b.ReplyU64(m, 0); err != nil {
		t.Fatal(err)
	}
	r, err := f.ReadReply()
	if err != nil {
		t.Fatal(err)
	}
	if r.Request != ReqSetMemTable || r.Flags != Version|FlagReply || len(r.FDs) != 0 {
		t.Errorf("reply header: %v %#x %v", r.Request, r.Flags, r.FDs)
	}
	if v, err := DecodeU64(r.Payload); v != 0 || err != nil {
		t.Errorf("reply payload %v %v", v, err)
	}
}

func TestRoundTripKinds(t *testing.T) {
	b, f := connPair(t)
	for _, c := range []struct {
		req     Request
		payload []byte
		fds     int
	}{
		{ReqGetFeatures, nil, 0},
		{ReqSetFeatures, u64(1<<32 | 1<<30), 0},
		{ReqSetOwner, nil, 0},
		{ReqSetVringNum, VringState{Index: 1, Num: 256}.Encode(nil), 0},
		{ReqSetVringAddr, VringAddr{Index: 3, Desc: 0x7f0000001000, Used: 0x7f0000003000, Avail: 0x7f0000002000}.Encode(nil), 0},
		{ReqSetVringBase, VringState{Index: 1, Num: 0}.Encode(nil), 0},
		{ReqSetVringKick, u64(5), 1},
		{ReqSetVringKick, u64(5 | VringNoFD), 0},
		{ReqSetVringCall, u64(255), 1},
		{ReqSetVringErr, u64(0), 1},
		{ReqSetLogBase, append(u64(0x1000), u64(0)...), 1},
		{ReqSetLogFD, nil, 1},
		{ReqSetBackendReqFD, nil, 1},
		{ReqSetInflightFD, make([]byte, 20), 1},
		{ReqAddMemReg, EncodeSingleRegion(nil, MemRegion{Size: 0x1000, UserAddr: 0x1000}), 1},
		{ReqRemMemReg, EncodeSingleRegion(nil, MemRegion{Size: 0x1000, UserAddr: 0x1000}), 0},
		{ReqRemMemReg, EncodeSingleRegion(nil, MemRegion{Size: 0x1000, UserAddr: 0x1000}), 1},
		{ReqSetMemTable, EncodeMemTable(nil, make([]MemRegion, 8)), 8},
		{ReqGetConfig, make([]byte, MaxPayload), 0},
	} {
		t.Run(fmt.Sprintf("%v/%d", c.req, c.fds), func(t *testing.T) {
			sent := eventfds(t, c.fds)
			if err := f.WriteMessage(c.req, 0, c.payload, sent); err != nil {
				t.Fatal(err)
			}
			m, err := b.ReadMessage()
			if err != nil {
				t.Fatal(err)
			}
			defer m.CloseFDs()
			if m.Request != c.req || !bytes.Equal(m.Payload, c.payload) || len(m.FDs) != c.fds {
				t.Fatalf("got %v, %d bytes, %d fds", m.Request, len(m.Payload), len(m.FDs))
			}
			for i := range sent {
				if !sameFile(t, m.FDs[i], sent[i]) {
					t.Errorf("fd %d is another file", i)
				}
			}
		})
	}
}

// Extra fds are closed and dropped; the message is still delivered.
func TestExtraFDsClosed(t *testing.T) {
	b, peer := pair(t)
	for _, c := range []struct {
		req     Request
		payload []byte
		send    int
		keep    int
	}{
		{ReqSetVringNum, VringState{Index: 0, Num: 256}.Encode(nil), 3, 0},
		{ReqGetFeatures, nil, 1, 0},
		{ReqSetVringKick, u64(1 | VringNoFD), 1, 0},
		{ReqSetVringKick, u64(1), 4, 1},
		{ReqSetVringCall, u64(1), 2, 1},
		{ReqRemMemReg, EncodeSingleRegion(nil, MemRegion{Size: 1}), 2, 1},
		{ReqSetMemTable, EncodeMemTable(nil, make([]MemRegion, 1)), 3, 1},
		{ReqSetMemTable, EncodeMemTable(nil, make([]MemRegion, 2)), recvFDCap, 2},
		{ReqSetVringKick, u64(1)[:7], 1, 0}, // malformed payload: fd dropped, decode fails later
	} {
		base := countFDs()
		sent := eventfds(t, c.send)
		send(t, peer, rawMessage(c.req, Version, uint32(len(c.payload)), c.payload), sent)
		m, err := b.ReadMessage()
		if err != nil {
			t.Fatalf("%v with %d fds: %v", c.req, c.send, err)
		}
		if len(m.FDs) != c.keep {
			t.Errorf("%v with %d fds: kept %d, want %d", c.req, c.send, len(m.FDs), c.keep)
		}
		for i, fd := range m.FDs {
			if !sameFile(t, fd, sent[i]) {
				t.Errorf("%v: kept fd %d is not the %d-th sent", c.req, fd, i)
			}
		}
		if n := countFDs(); n != base+c.send+c.keep {
			t.Errorf("%v with %d fds: %d fds open, want %d (extras not closed)", c.req, c.send, n, base+c.send+c.keep)
		}
		m.CloseFDs()
	}
}

func TestMissingFDs(t *testing.T) {
	b, peer := pair(t)
	for _, c := range []struct {
		req     Request
		payload []byte
		send    int
	}{
		{ReqSetMemTable, EncodeMemTable(nil, make([]MemRegion, 2)), 1},
		{ReqSetMemTable, EncodeMemTable(nil, make([]MemRegion, 8)), 0},
		{ReqSetMemTable, append(le.AppendUint32(nil, 1<<31), make([]byte, 4+8*MemRegionSize)...), 7},
		{ReqSetVringKick, u64(0), 0},
		{ReqSetVringCall, u64(0x2ff &^ VringNoFD), 0},
		{ReqSetVringErr, u64(7), 0},
		{ReqAddMemReg, EncodeSingleRegion(nil, MemRegion{Size: 1}), 0},
		{ReqSetLogBase, make([]byte, 16), 0},
		{ReqSetLogFD, nil, 0},
		{ReqSetBackendReqFD, nil, 0},
		{ReqSetInflightFD, make([]byte, 20), 0},
	} {
		base := countFDs()
		sent := eventfds(t, c.send)
		send(t, peer, rawMessage(c.req, Version, uint32(len(c.payload)), c.payload), sent)
		m, err := b.ReadMessage()
		var pe *ProtocolError
		if !errors.As(err, &pe) || pe.Request != c.req || m != nil {
			t.Errorf("%v with %d fds: %v, %v; want a ProtocolError", c.req, c.send, m, err)
			continue
		}
		if !strings.Contains(err.Error(), c.req.String()) {
			t.Errorf("error %q does not name %v", err, c.req)
		}
		if n := countFDs(); n != base+c.send {
			t.Errorf("%v: %d fds open, want %d", c.req, n, base+c.send)
		}
	}
}

func TestTooManyFDs(t *testing.T) {
	b, peer := pair(t)
	base := countFDs()
	sent := eventfds(t, recvFDCap+1)
	p := EncodeMemTable(nil, make([]MemRegion, 1))
	send(t, peer, rawMessage(ReqSetMemTable, Version, uint32(len(p)), p), sent)
	if _, err := b.ReadMessage(); !errors.Is(err, ErrTooManyFDs) {
		t.Errorf("err = %v, want ErrTooManyFDs", err)
	}
	if n := countFDs(); n != base+len(sent) {
		t.Errorf("%d fds open, want %d", n, base+len(sent))
	}
}

func TestPayloadLimit(t *testing.T) {
	b, peer := pair(t)
	base := countFDs()
	sent := eventfds(t, 1)
	send(t, peer, rawMessage(ReqSetConfig, Version, MaxPayload+1, make([]byte, 64)), sent)
	_, err := b.ReadMessage()
	var pe *ProtocolError
	if !errors.As(err, &pe) || pe.Request != ReqSetConfig {
		t.Errorf("size %d: err %v, want a ProtocolError", MaxPayload+1, err)
	}
	if n := countFDs(); n != base+1 {
		t.Errorf("%d fds open, want %d", n, base+1)
	}
	for _, size := range []uint32{1 << 31, 0xffffffff} {
		b, peer := pair(t)
		send(t, peer, rawMessage(ReqSetConfig, Version, size, nil), nil)
		if _, err := b.ReadMessage(); !errors.As(err, &pe) {
			t.Errorf("size %#x: err %v, want a ProtocolError", size, err)
		}
	}
	// The limit itself is fine, in both directions.
	b2, f2 := connPair(t)
	if err := f2.WriteMessage(ReqSetConfig, 0, make([]byte, MaxPayload), nil); err != nil {
		t.Fatal(err)
	}
	if m, err := b2.ReadMessage(); err != nil || len(m.Payload) != MaxPayload {
		t.Errorf("MaxPayload message: %v", err)
	}
	if err := f2.WriteMessage(ReqSetConfig, 0, make([]byte, MaxPayload+1), nil); err == nil {
		t.Errorf("WriteMessage sent %d bytes", MaxPayload+1)
	}
}

func TestBadVersion(t *testing.T) {
	for _, flags := range []uint32{0, 2, 3, FlagNeedReply, 0xfffffffc} {
		b, peer := pair(t)
		base := countFDs()
		sent := eventfds(t, 1)
		send(t, peer, rawMessage(ReqSetVringKick, flags, 8, u64(0)), sent)
		_, err := b.ReadMessage()
		var pe *ProtocolError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), "version") {
			t.Errorf("flags %#x: err %v, want a version ProtocolError", flags, err)
		}
		if n := countFDs(); n != base+1 {
			t.Errorf("flags %#x: %d fds open, want %d", flags, n, base+1)
		}
	}
	// Other flag bits do not matter.
	b, peer := pair(t)
	send(t, peer, rawMessage(ReqGetFeatures, Version|0xfff0, 0, nil), nil)
	if m, err := b.ReadMessage(); err != nil || m.Flags != Version|0xfff0 {
		t.Errorf("unknown flag bits: %v, %v", m, err)
	}
}

func TestEOF(t *testing.T) {
	hdr := rawMessage(ReqSetVringNum, Version, 8, nil)
	for _, c := range []struct {
		name string
		send []byte
		fds  int
		want error
	}{
		{"clean close", nil, 0, io.EOF},
		{"1 header byte", hdr[:1], 0, io.ErrUnexpectedEOF},
		{"11 header bytes", hdr[:11], 0, io.ErrUnexpectedEOF},
		{"header bytes with fds", hdr[:5], 2, io.ErrUnexpectedEOF},
		{"partial payload", append(hdr, 1, 2, 3), 0, io.ErrUnexpectedEOF},
		{"partial payload with fds", append(hdr, 1, 2, 3), 1, io.ErrUnexpectedEOF},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, peer := pair(t)
			base := countFDs()
			sent := eventfds(t, c.fds)
			if len(c.send) > 0 {
				send(t, peer, c.send, sent)
			}
			unix.Shutdown(peer, unix.SHUT_WR)
			m, err := b.ReadMessage()
			if m != nil || !errors.Is(err, c.want) {
				t.Errorf("ReadMessage = %v, %v; want %v", m, err, c.want)
			}
			if c.want == io.ErrUnexpectedEOF && errors.Is(err, io.EOF) {
				t.Errorf("a truncated message reads as a clean close: %v", err)
			}
			if n := countFDs(); n != base+c.fds {
				t.Errorf("%d fds open, want %d", n, base+c.fds)
			}
		})
	}
}

// A complete header followed by EOF is a truncated message, like EOF inside
// the header or inside the payload.
func TestEOFAfterHeader(t *testing.T) {
	b, peer := pair(t)
	send(t, peer, rawMessage(ReqSetVringNum, Version, 8, nil), nil)
	unix.Shutdown(peer, unix.SHUT_WR)
	if _, err := b.ReadMessage(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("err = %v, want io.ErrUnexpectedEOF", err)
	}
}

// A frontend does not send replies: a request that sets the REPLY bit must
// still be held to its fd rules when a backend reads it. Since the change
// that exempts replies (conn.go: "Replies follow other rules"), a hostile
// frontend can skip the fd-count check of any request by setting bit 2.
func TestReplyBitDoesNotBypassFDChecks(t *testing.T) {
	b, peer := pair(t)
	send(t, peer, rawMessage(ReqSetVringKick, Version|FlagReply, 8, u64(0)), nil)
	var pe *ProtocolError
	if m, err := b.ReadMessage(); !errors.As(err, &pe) {
		t.Errorf("KICK without its fd, REPLY bit set: %v, %v; want a ProtocolError", m, err)
	}
	base := countFDs()
	sent := eventfds(t, 5)
	send(t, peer, rawMessage(ReqGetFeatures, Version|FlagReply, 0, nil), sent)
	m, err := b.ReadMessage()
	if err == nil {
		if len(m.FDs) != 0 {
			t.Errorf("GET_FEATURES with the REPLY bit kept %d fds", len(m.FDs))
		}
		m.CloseFDs()
	}
	if n := countFDs(); n != base+5 {
		t.Errorf("%d fds open, want %d", n, base+5)
	}
}

// Replies keep whatever fds they carry for the frontend to take.
func TestReplyKeepsFDs(t *testing.T) {
	b, f := connPair(t)
	sent := eventfds(t, 1)
	if err := b.WriteMessage(ReqGetInflightFD, FlagReply, make([]byte, 20), sent); err != nil {
		t.Fatal(err)
	}
	m, err := f.ReadReply()
	if err != nil || len(m.FDs) != 1 || !sameFile(t, m.FDs[0], sent[0]) {
		t.Fatalf("reply with an fd: %v, %v", m, err)
	}
	m.CloseFDs()
}

// A header that arrives one byte per write, with fds on any of the header
// writes, is put back together; fds sent with the payload bytes are lost
// (the kernel drops them on a plain read), which makes a KICK short of its
// fd, without leaking it.
func TestFragmentedHeader(t *testing.T) {
	msg := rawMessage(ReqSetVringCall, Version, 8, u64(3))
	for _, at := range []int{0, 1, 6, 11, 12, 19} {
		t.Run(fmt.Sprint(at), func(t *testing.T) {
			b, peer := pair(t)
			base := countFDs()
			sent := eventfds(t, 1)
			for i := range msg {
				var fds []int
				if i == at {
					fds = sent
				}
				send(t, peer, msg[i:i+1], fds)
			}
			m, err := b.ReadMessage()
			if at < HeaderSize {
				if err != nil || len(m.FDs) != 1 || !sameFile(t, m.FDs[0], sent[0]) {
					t.Fatalf("ReadMessage = %v, %v", m, err)
				}
				if v, _ := DecodeU64(m.Payload); v != 3 {
					t.Errorf("payload %x", m.Payload)
				}
				m.CloseFDs()
			} else {
				var pe *ProtocolError
				if !errors.As(err, &pe) {
					t.Fatalf("fd sent with the payload: %v, %v; want a ProtocolError", m, err)
				}
			}
			if n := countFDs(); n != base+1 {
				t.Errorf("%d fds open, want %d", n, base+1)
			}
		})
	}
}

// Messages back to back in one write are framed one by one, each with its
// own fds.
func TestBackToBack(t *testing.T) {
	b, peer := pair(t)
	sent := eventfds(t, 3)
	m1 := rawMessage(ReqSetVringKick, Version, 8, u64(0))
	m2 := rawMessage(ReqGetFeatures, Version, 0, nil)
	m3 := rawMessage(ReqSetVringCall, Version, 8, u64(1))
	send(t, peer, m1, sent[:1])
	send(t, peer, m2, nil)
	send(t, peer, m3, sent[1:3])
	want := []struct {
		req Request
		fds int
	}{{ReqSetVringKick, 1}, {ReqGetFeatures, 0}, {ReqSetVringCall, 1}}
	for i, w := range want {
		m, err := b.ReadMessage()
		if err != nil || m.Request != w.req || len(m.FDs) != w.fds {
			t.Fatalf("message %d: %v, %v", i, m, err)
		}
		m.CloseFDs()
	}
}

func TestExpectedFDs(t *testing.T) {
	table := func(n uint32) []byte { return append(le.AppendUint32(nil, n), make([]byte, 4)...) }
	for _, c := range []struct {
		req      Request
		payload  []byte
		min, max int
	}{
		{ReqSetMemTable, table(0), 0, 0},
		{ReqSetMemTable, table(1), 1, 1},
		{ReqSetMemTable, table(8), 8, 8},
		{ReqSetMemTable, table(9), MaxMemTableRegion, MaxMemTableRegion},
		{ReqSetMemTable, table(0xffffffff), MaxMemTableRegion, MaxMemTableRegion},
		{ReqSetMemTable, []byte{1, 0, 0}, 0, 0},
		{ReqSetVringKick, u64(0), 1, 1},
		{ReqSetVringKick, u64(VringNoFD), 0, 0},
		{ReqSetVringCall, u64(0xff), 1, 1},
		{ReqSetVringCall, u64(0xff | VringNoFD), 0, 0},
		{ReqSetVringErr, u64(1 << 40), 1, 1},
		{ReqSetVringErr, nil, 0, 0},
		{ReqSetVringKick, make([]byte, 16), 0, 0},
		{ReqSetLogBase, nil, 1, 1},
		{ReqSetLogFD, nil, 1, 1},
		{ReqAddMemReg, nil, 1, 1},
		{ReqSetBackendReqFD, nil, 1, 1},
		{ReqSetInflightFD, nil, 1, 1},
		{ReqRemMemReg, nil, 0, 1},
		{ReqGetFeatures, nil, 0, 0},
		{ReqSetVringAddr, make([]byte, VringAddrSize), 0, 0},
		{ReqGetInflightFD, nil, 0, 0},
		{Request(99), nil, 0, 0},
	} {
		mn, mx := ExpectedFDs(c.req, c.payload)
		if mn != c.min || mx != c.max {
			t.Errorf("ExpectedFDs(%v, %x) = %d..%d, want %d..%d", c.req, c.payload, mn, mx, c.min, c.max)
		}
	}
}

func TestRequestString(t *testing.T) {
	for r, want := range map[Request]string{
		ReqSetMemTable: "SET_MEM_TABLE", ReqGetStatus: "GET_STATUS", ReqVringKick: "VRING_KICK",
		Request(0): "REQUEST_0", Request(41): "REQUEST_41", Request(0xffffffff): "REQUEST_4294967295",
	} {
		if got := r.String(); got != want {
			t.Errorf("Request(%d) = %q, want %q", uint32(r), got, want)
		}
	}
	for r := Request(1); r <= ReqGetStatus; r++ {
		if _, ok := requestNames[r]; !ok && (r < 26 || r > 30) && r != 33 {
			t.Errorf("request %d has no name", r)
		}
	}
	e := &ProtocolError{ReqAddMemReg, "carries 0 file descriptors, needs 1"}
	if e.Error() != "vhost-user ADD_MEM_REG: carries 0 file descriptors, needs 1" {
		t.Errorf("ProtocolError = %q", e.Error())
	}
}
