package dhcp

import (
	"bytes"
	"testing"
)

// FuzzHandle feeds guest frames to the server: it must never panic, never
// write beyond FrameSize, and whatever it answers must be a well-formed
// reply to the same transaction and client.
func FuzzHandle(f *testing.F) {
	f.Add(clientFrame(msg{typ: Discover, xid: 1, chaddr: guestMAC}))
	f.Add(clientFrame(msg{typ: Discover, flags: 0x8000, chaddr: guestMAC}))
	f.Add(clientFrame(msg{typ: Request, chaddr: guestMAC, reqIP: []byte{10, 1, 2, 3}, serverID: []byte{10, 1, 2, 1}}))
	f.Add(clientFrame(msg{typ: Request, chaddr: guestMAC, reqIP: []byte{10, 1, 2, 9}}))
	f.Add(clientFrame(msg{typ: Request, chaddr: guestMAC, ciaddr: [4]byte{10, 1, 2, 3}}))
	f.Add(clientFrame(msg{typ: Inform, chaddr: guestMAC, ciaddr: [4]byte{10, 1, 2, 3}}))
	f.Add(clientFrame(msg{typ: Release, chaddr: guestMAC}))
	f.Add(clientFrame(msg{typ: Discover, chaddr: guestMAC, extra: []byte{optMaxSize, 2, 5, 0xdc, 61, 7, 1, 0x52, 0x54, 0, 0x12, 0x34, 0x56}}))
	f.Add([]byte{})
	s := newServer(f, testLease())
	f.Fuzz(func(t *testing.T, frame []byte) {
		out := make([]byte, FrameSize+64)
		for i := FrameSize; i < len(out); i++ {
			out[i] = 0xa5
		}
		n := s.Handle(frame, out[:FrameSize])
		if !bytes.Equal(out[FrameSize:], bytes.Repeat([]byte{0xa5}, 64)) {
			t.Fatal("wrote beyond FrameSize")
		}
		if n == 0 {
			return
		}
		r, err := parse(frame)
		if err != nil {
			t.Fatalf("answered a frame that does not parse: %v", err)
		}
		d := decodeReply(t, out[:n])
		if d.xid != uint32(r.xid[0])<<24|uint32(r.xid[1])<<16|uint32(r.xid[2])<<8|uint32(r.xid[3]) || d.chaddr != r.chaddr || d.op != 2 {
			t.Fatalf("reply xid %#x chaddr %x op %d for request xid % x chaddr %x", d.xid, d.chaddr, d.op, r.xid, r.chaddr)
		}
		if t := d.opts[optMessageType]; len(t) != 1 || t[0] != Offer && t[0] != Ack && t[0] != Nak {
			panic("reply of a client type")
		}
	})
}
