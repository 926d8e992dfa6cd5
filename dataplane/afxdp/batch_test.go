package afxdp

import (
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
)

// TestBatchesAllocateNothing: sending and receiving a batch allocates
// nothing, with the send side shared and not.
func TestBatchesAllocateNothing(t *testing.T) {
	b := newBed(t, 1)
	raw := b.rawSocket(t)
	for _, workers := range []int{1, 2} {
		d := b.open(t, Config{}, workers)
		if err := d.AddMAC(guestMAC); err != nil {
			t.Fatal(err)
		}
		q := d.Queue(workers - 1)
		frame := udpFrame(b.peerMAC, guestMAC, "alloc")
		tx := testing.AllocsPerRun(50, func() {
			for range 32 {
				buf := q.TxFrame()
				if buf == nil {
					break
				}
				copy(buf[64:], frame)
				q.Send(64, len(frame))
			}
			q.Flush()
		})
		for range 40 {
			peerSend(t, raw, udpFrame(guestMAC, b.peerMAC, "rx"))
			peerSend(t, raw, udpFrame(bcast, b.peerMAC, "rx-group"))
		}
		time.Sleep(50 * time.Millisecond)
		q0 := d.Queue(0)
		frames := make([][]byte, 32)
		got := 0
		rx := testing.AllocsPerRun(4, func() {
			got += q0.Receive(frames)
			q0.Release()
		})
		if tx != 0 || rx != 0 || got == 0 {
			t.Errorf("%d workers: %.1f allocations per TX batch, %.1f per RX batch (%d frames received)", workers, tx, rx, got)
		}
		d.Close()
	}
}

// BenchmarkVethXSKToXSK measures frames/s from one device's socket to
// another's across a veth pair (native XDP, copy mode), 64-byte frames in
// batches of 32, sender and receiver in one goroutine.
func BenchmarkVethXSKToXSK(b *testing.B) {
	bd := newBed(b, 1)
	tx := bd.open(b, Config{Dedicated: true}, 1)
	var rx *Device
	nettest.In(b, bd.peer, func() {
		var err error
		if rx, err = Open(Config{Interface: "vy", Dedicated: true}, 1); err != nil {
			b.Fatal(err)
		}
	})
	b.Cleanup(rx.Close)
	dst := [6]byte{0x52, 0x54, 0, 0x78, 0, 0x0b}
	if err := rx.AddMAC(dst); err != nil {
		b.Fatal(err)
	}
	frame := udpFrame(dst, guestMAC, "0123456789012345678901")[:64]
	q, r := tx.Queue(0), rx.Queue(0)
	frames := make([][]byte, 64)
	received, sent := 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for received < b.N && time.Now().Before(deadline) {
		for range 32 {
			buf := q.TxFrame()
			if buf == nil {
				break
			}
			copy(buf[64:], frame)
			q.Send(64, len(frame))
			sent++
		}
		q.Flush()
		for n := r.Receive(frames); n > 0; n = r.Receive(frames) {
			for _, f := range frames[:n] {
				if [6]byte(f[0:6]) == dst { // not the kernels' IPv6 chatter
					received++
				}
			}
			r.Release()
		}
	}
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(received)/el.Seconds(), "frames/s")
	b.ReportMetric(float64(sent-received)/float64(max(sent, 1))*100, "%lost")
}
