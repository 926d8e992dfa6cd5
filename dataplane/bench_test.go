package dataplane

import (
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// BenchmarkForward measures the dataplane's side of a port→port burst:
// one worker pass that takes 32 frames from guest A's TX ring, switches
// them and copies each into guest B's RX ring. The frontends' own work
// (filling and draining rings) is outside the timed region. Reported per
// frame.
func BenchmarkForward(b *testing.B) {
	for _, size := range []int{64, 1500} {
		b.Run(sizeName(size), func(b *testing.B) {
			d := newDataplane(b)
			cfg := frontend.Config{QueueSize: 1024, RxPoll: true, TxBufSize: 2048}
			a := dial(b, addPort(b, d, "a", netdev.RoleServer, 1), cfg)
			rx := dial(b, addPort(b, d, "b", netdev.RoleServer, 1), cfg)
			learn(b, a, rx, 1)
			w := d.workers[0]
			w.halt()
			frames := make([][]byte, burstSize)
			for i := range frames {
				frames[i] = udpFrame(macB, macA, uint16(i), 9, make([]byte, size-42))
			}
			// The testing timer's Stop/Start read memory statistics (a
			// stop-the-world); time the passes alone with the clock instead.
			var passNs int64
			b.ResetTimer()
			for done := 0; done < b.N; done += burstSize {
				if _, err := a.SendBurst(0, frames); err != nil {
					a.ReclaimTx(0)
					a.SendBurst(0, frames)
				}
				t0 := nanotime()
				w.pass()
				passNs += nanotime() - t0
				rx.RecvAll(0, 0)
				a.ReclaimTx(0)
			}
			// Allocation-freedom is asserted by TestForwardingAllocatesNothing.
			b.ReportMetric(float64(passNs)/float64(b.N), "dataplane-ns/frame")
		})
	}
}

func sizeName(n int) string {
	if n == 64 {
		return "64B"
	}
	return "1500B"
}
