package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// tcpPartial is an IPv4 TCP frame with payload bytes as a guest with
// checksum offload sends it: the checksum field holds the pseudo-header
// sum and the header says NEEDS_CSUM (and TCP GSO with mss > 0).
func tcpPartial(dst, src [6]byte, payload, mss int) ([]byte, virtio.NetHdr) {
	l4 := make([]byte, 20+payload)
	binary.BigEndian.PutUint16(l4[0:], 40000)
	binary.BigEndian.PutUint16(l4[2:], 5201)
	l4[12], l4[13] = 5<<4, 0x18 // PSH ACK
	f := nettest.IPv4(dst, src, [4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 6, l4)
	pseudo := append(append([]byte{}, f[26:34]...), 0, 6, byte(len(l4)>>8), byte(len(l4)))
	binary.BigEndian.PutUint16(f[34+16:], ^nettest.Checksum(pseudo))
	h := virtio.NetHdr{Flags: virtio.NetHdrFNeedsCsum, CsumStart: 34, CsumOffset: 16, HdrLen: 54}
	if mss > 0 {
		h.GSOType, h.GSOSize = offload.GSOTCPv4, uint16(mss)
	}
	return f, h
}

// GetStats reports what offloads did for each pair's guest and the frames
// dropped for offload metadata that does not fit them.
func TestStatsReportOffloads(t *testing.T) {
	e := start(t, shortDir(t), nil, 4)
	defer e.stop()
	a, b := e.spec("a", 1), e.spec("b", 1)
	for _, s := range []*agentv1.PortSpec{a, b} {
		if _, err := e.create(s); err != nil {
			t.Fatal(err)
		}
	}
	// a sends with checksum and TSO offloads; b takes neither.
	hostOffloads := uint64(frontend.DefaultFeatures | 1<<virtio.NetFCsum | 1<<virtio.NetFHostTSO4)
	fa, err := frontend.Dial(a.SocketPath, frontend.Config{QueueSize: 256, Features: hostOffloads, TxBufSize: 1 << 17})
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := frontend.Dial(b.SocketPath, frontend.Config{QueueSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	exchange(t, fa, fb) // the switch learns b's MAC

	gso, gh := tcpPartial(macB, macA, 3000, 1448)                         // 3 segments for b
	csum, ch := tcpPartial(macB, macA, 1000, 0)                           // completed for b
	bad := virtio.NetHdr{Flags: 1, CsumStart: 0xffff, CsumOffset: 0xffff} // past the frame: dropped
	for _, x := range []struct {
		h *virtio.NetHdr
		f []byte
	}{{&gh, gso}, {&ch, csum}, {&bad, csum}} {
		if err := fa.SendHdr(0, x.h, x.f); err != nil {
			t.Fatal(err)
		}
	}
	got := 0
	for deadline := time.Now().Add(3 * time.Second); got < 4 && time.Now().Before(deadline); {
		_, err := fb.Recv(0, 10*time.Millisecond)
		if err == nil {
			got++
		} else if !errors.Is(err, frontend.ErrTimeout) {
			t.Fatal(err)
		}
	}
	if got != 4 {
		t.Fatalf("b received %d frames, want 4 (3 segments, 1 checksummed)", got)
	}

	// The bad frame follows the good ones in a's ring, and b can take
	// the good ones before a's burst has counted the drop: read the
	// stats until the drop shows or a deadline passes.
	byID := map[string]*agentv1.QueueStats{}
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, err := e.client.GetStats(context.Background(), &agentv1.GetStatsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.GetPorts() {
			byID[p.GetId()] = p.GetQueues()[0]
		}
		if byID["a"].GetDrops().GetBadOffload() != 0 || time.Now().After(deadline) {
			break
		}
	}
	if o := byID["b"].GetOffload(); o.GetGsoWhole() != 0 || o.GetGsoSegmented() != 1 || o.GetCsumSoftware() != 1 {
		t.Errorf("b's offloads %v; want 0 whole, 1 segmented, 1 checksum completed", o)
	}
	if d := byID["a"].GetDrops(); d.GetBadOffload() != 1 {
		t.Errorf("a's drops %v; want 1 bad offload", d)
	}
	if o := byID["a"].GetOffload(); o == nil || o.GetGsoSegmented()+o.GetGsoWhole()+o.GetCsumSoftware() != 0 {
		t.Errorf("a's offloads %v; want present and 0 (a received no offloaded frame)", o)
	}
}
