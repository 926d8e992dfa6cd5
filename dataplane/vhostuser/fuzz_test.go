package vhostuser

import (
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzReadMessage writes arbitrary bytes, with nfds%13 real fds attached to
// the first write, into a socketpair and reads one message from the other
// end. Invariants: no panic; a message has a payload within MaxPayload that
// matches its header, an fd count within ExpectedFDs (unless it is a
// reply), only open fds, and
// whatever decodes for its request agrees with its fd count; no fd leaks,
// whether or not a message came out.
func FuzzReadMessage(f *testing.F) {
	for _, s := range readMessageSeeds() {
		f.Add(s.nfds, s.split, s.data)
	}
	f.Fuzz(fuzzReadMessage)
}

type readSeed struct {
	nfds, split uint8
	data        []byte
}

func readMessageSeeds() []readSeed {
	msg := func(req Request, p []byte) []byte { return rawMessage(req, Version, uint32(len(p)), p) }
	table := func(n uint32, slots int) []byte {
		b := le.AppendUint32(nil, n)
		b = append(b, 0, 0, 0, 0)
		for range slots {
			b = MemRegion{GuestPhysAddr: 0x1000, Size: 0x1000, UserAddr: 0x7f0000000000}.Encode(b)
		}
		return b
	}
	region := EncodeSingleRegion(nil, MemRegion{GuestPhysAddr: 0x100000, Size: 0x1000, UserAddr: 0x7f0000100000})
	return []readSeed{
		{0, 0, msg(ReqGetFeatures, nil)},
		{0, 0, msg(ReqSetFeatures, u64(1<<32|1<<30))},
		{0, 0, msg(ReqSetOwner, nil)},
		{0, 0, msg(ReqGetProtocolFeatures, nil)},
		{0, 0, msg(ReqSetProtocolFeatures, u64(1<<ProtoMQ|1<<ProtoReplyAck))},
		{0, 0, msg(ReqGetQueueNum, nil)},
		{2, 0, msg(ReqSetMemTable, table(2, 2))},
		{1, 0, msg(ReqSetMemTable, table(1, 8))},
		{0, 0, msg(ReqSetVringNum, VringState{0, 256}.Encode(nil))},
		{0, 0, msg(ReqSetVringAddr, VringAddr{Index: 1, Desc: 0x7f0000001000, Used: 0x7f0000003000, Avail: 0x7f0000002000}.Encode(nil))},
		{0, 0, msg(ReqSetVringBase, VringState{1, 0}.Encode(nil))},
		{0, 0, msg(ReqGetVringBase, VringState{1, 0}.Encode(nil))},
		{1, 0, msg(ReqSetVringKick, u64(1))},
		{1, 0, msg(ReqSetVringCall, u64(0))},
		{1, 0, msg(ReqSetVringErr, u64(0))},
		{0, 0, msg(ReqSetVringEnable, VringState{1, 1}.Encode(nil))},
		{0, 0, msg(ReqSendRARP, u64(0x5254001234))},
		{0, 0, msg(ReqNetSetMTU, u64(9000))},
		{1, 0, msg(ReqSetBackendReqFD, nil)},
		{1, 0, msg(ReqSetLogBase, append(u64(0x10000), u64(0)...))},
		{1, 0, msg(ReqSetLogFD, nil)},
		{0, 0, msg(ReqGetMaxMemSlots, nil)},
		{1, 0, msg(ReqAddMemReg, region)},
		{0, 0, msg(ReqRemMemReg, region)},
		{1, 0, msg(ReqRemMemReg, region)},
		{0, 0, msg(ReqSetStatus, u64(15))},
		{0, 0, msg(ReqGetStatus, nil)},
		{0, 0, msg(ReqVringKick, VringState{1, 0}.Encode(nil))},
		// KICK with NOFD, with and without an fd
		{0, 0, msg(ReqSetVringKick, u64(1|VringNoFD))},
		{1, 0, msg(ReqSetVringKick, u64(1|VringNoFD))},
		// oversized size field, bad versions
		{1, 0, rawMessage(ReqSetConfig, Version, MaxPayload+1, make([]byte, 16))},
		{0, 0, rawMessage(ReqSetConfig, Version, 0xffffffff, nil)},
		{1, 0, rawMessage(ReqSetVringKick, 0, 8, u64(0))},
		{0, 0, rawMessage(ReqGetFeatures, 2, 0, nil)},
		{0, 0, rawMessage(ReqGetFeatures, 3|FlagReply, 0, nil)},
		// SET_MEM_TABLE with nregions 0, 9, huge
		{0, 0, msg(ReqSetMemTable, table(0, 0))},
		{9, 0, msg(ReqSetMemTable, table(9, 9))},
		{8, 0, msg(ReqSetMemTable, table(0xffffffff, 8))},
		// missing and extra fds
		{1, 0, msg(ReqSetMemTable, table(3, 3))},
		{0, 0, msg(ReqSetVringCall, u64(2))},
		{0, 0, msg(ReqAddMemReg, region)},
		{12, 0, msg(ReqSetMemTable, table(1, 1))},
		{3, 0, msg(ReqSetVringNum, VringState{0, 256}.Encode(nil))},
		{5, 0, msg(ReqRemMemReg, region)},
		// truncated header and payload, header split across writes
		{1, 0, msg(ReqSetVringKick, u64(1))[:7]},
		{0, 0, msg(ReqSetVringAddr, make([]byte, VringAddrSize))[:30]},
		{1, 5, msg(ReqSetVringKick, u64(1))},
		{1, 14, msg(ReqSetVringKick, u64(1))},
		// two messages back to back
		{1, 0, append(msg(ReqSetVringCall, u64(0)), msg(ReqGetFeatures, nil)...)},
		{0, 0, nil},
	}
}

func fuzzReadMessage(t *testing.T, nfds, split uint8, data []byte) {
	if len(data) > HeaderSize+MaxPayload+64 {
		data = data[:HeaderSize+MaxPayload+64]
	}
	before := countFDs()
	c, peer, err := newPair()
	if err != nil {
		t.Fatal(err)
	}
	sent := make([]int, int(nfds)%13)
	for i := range sent {
		if sent[i], err = unix.Eventfd(0, unix.EFD_CLOEXEC); err != nil {
			t.Fatal(err)
		}
	}
	first := data
	if s := int(split); s > 0 && s < len(data) {
		first = data[:s]
	}
	if len(first) > 0 {
		var oob []byte
		if len(sent) > 0 {
			oob = unix.UnixRights(sent...)
		}
		if err := unix.Sendmsg(peer, first, oob, nil, 0); err != nil {
			t.Fatalf("sendmsg: %v", err)
		}
		if rest := data[len(first):]; len(rest) > 0 {
			if _, err := unix.Write(peer, rest); err != nil {
				t.Fatalf("write: %v", err)
			}
		}
	}
	for _, fd := range sent {
		unix.Close(fd)
	}
	unix.Shutdown(peer, unix.SHUT_WR)

	m, err := c.ReadMessage()
	if err == nil {
		checkMessage(t, m, data, len(sent))
		m.CloseFDs()
	} else if m != nil {
		t.Fatalf("ReadMessage returned a message and %v", err)
	}
	c.Close()
	unix.Close(peer)
	if after := countFDs(); after != before {
		t.Fatalf("fd leak: %d fds before, %d after (err %v)", before, after, err)
	}
}

func checkMessage(t *testing.T, m *Message, data []byte, nsent int) {
	t.Helper()
	if len(data) < HeaderSize {
		t.Fatalf("message from %d bytes", len(data))
	}
	size := le.Uint32(data[8:])
	if len(m.Payload) > MaxPayload || uint32(len(m.Payload)) != size || len(data) < HeaderSize+int(size) {
		t.Fatalf("payload of %d bytes, header says %d, input has %d", len(m.Payload), size, len(data))
	}
	if m.Request != Request(le.Uint32(data)) || m.Flags != le.Uint32(data[4:]) || m.Flags&FlagVersionMask != Version {
		t.Fatalf("header %v %#x does not match the input", m.Request, m.Flags)
	}
	if string(m.Payload) != string(data[HeaderSize:HeaderSize+int(size)]) {
		t.Fatalf("payload differs from the input")
	}
	if len(m.FDs) > nsent {
		t.Fatalf("%v: %d fds, %d sent", m.Request, len(m.FDs), nsent)
	}
	seen := map[int]bool{}
	for _, fd := range m.FDs {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || seen[fd] {
			t.Fatalf("%v: fd %d is closed or repeated (%v)", m.Request, fd, err)
		}
		seen[fd] = true
	}
	p := m.Payload
	if m.Flags&FlagReply != 0 {
		// Replies are not held to the request's fd rules (conn.go); only
		// decode what they carry.
		DecodeMemTable(p)
		DecodeSingleRegion(p)
		DecodeVringAddr(p)
		DecodeVringState(p)
		DecodeU64(p)
		return
	}
	mn, mx := ExpectedFDs(m.Request, m.Payload)
	if len(m.FDs) < mn || len(m.FDs) > mx {
		t.Fatalf("%v: %d fds, expected %d..%d", m.Request, len(m.FDs), mn, mx)
	}
	switch m.Request {
	case ReqSetMemTable:
		if rs, err := DecodeMemTable(p); err == nil && len(rs) != len(m.FDs) {
			t.Fatalf("SET_MEM_TABLE: %d regions, %d fds", len(rs), len(m.FDs))
		}
	case ReqSetVringKick, ReqSetVringCall, ReqSetVringErr:
		if v, err := DecodeU64(p); err == nil {
			want := 1
			if v&VringNoFD != 0 {
				want = 0
			}
			if len(m.FDs) != want {
				t.Fatalf("%v %#x: %d fds", m.Request, v, len(m.FDs))
			}
		} else if len(m.FDs) != 0 {
			t.Fatalf("%v with a bad payload kept %d fds", m.Request, len(m.FDs))
		}
	case ReqAddMemReg:
		if _, err := DecodeSingleRegion(p); err == nil && len(m.FDs) != 1 {
			t.Fatalf("ADD_MEM_REG: %d fds", len(m.FDs))
		}
	case ReqRemMemReg:
		DecodeSingleRegion(p)
	case ReqSetVringAddr:
		if a, err := DecodeVringAddr(p); err == nil && string(a.Encode(nil)) != string(p) {
			t.Fatalf("SET_VRING_ADDR round trip differs")
		}
	case ReqSetVringNum, ReqSetVringBase, ReqGetVringBase, ReqSetVringEnable, ReqVringKick, ReqSetVringEndian:
		if s, err := DecodeVringState(p); err == nil && string(s.Encode(nil)) != string(p) {
			t.Fatalf("%v round trip differs", m.Request)
		}
	case ReqSetFeatures, ReqSetProtocolFeatures, ReqSendRARP, ReqNetSetMTU, ReqSetStatus:
		DecodeU64(p)
	}
	if mn == 0 && mx == 0 && len(m.FDs) != 0 {
		t.Fatalf("%v carries no fds but kept %d", m.Request, len(m.FDs))
	}
}
