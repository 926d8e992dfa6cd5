package dataplane

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

func TestBandwidthValidate(t *testing.T) {
	for _, c := range []struct {
		bw   Bandwidth
		want string // "" valid
	}{
		{Bandwidth{}, ""},
		{Bandwidth{Ingress: Rate{BitsPerSecond: 10_000_000}}, ""},
		{Bandwidth{Egress: Rate{BitsPerSecond: 1e9, BurstBits: 1e6}}, ""},
		{Bandwidth{Ingress: Rate{BitsPerSecond: 100}}, "bandwidth.ingress: 100 bits/s is outside"},
		{Bandwidth{Egress: Rate{BitsPerSecond: 2e12}}, "bandwidth.egress: 2000000000000 bits/s is outside"},
		{Bandwidth{Egress: Rate{BurstBits: 5}}, "bandwidth.egress: a burst (5 bits) without a rate"},
	} {
		err := c.bw.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v, want valid", c.bw, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrBadRate)):
			t.Errorf("%+v: %v, want %q", c.bw, err, c.want)
		}
	}
}

// TestBucketRate: over a simulated second of 64-byte and 1500-byte
// frames offered faster than the rate, the policer passes the rate (and
// the burst it started with), the shaper's budget the same.
func TestBucketRate(t *testing.T) {
	const sec = int64(1e9)
	for _, rate := range []uint64{10_000_000, 1_000_000_000, 10_000_000_000} {
		for _, size := range []int{64, 1500} {
			b := newBucket(Rate{BitsPerSecond: rate}, 1500, 0)
			burst := b.depth / nanoBits
			// offered at 4x the rate, one frame at a time
			gap := int64(float64(size*8) / float64(rate) * 1e9 / 4)
			var passed uint64
			for now := int64(0); now < sec; now += max(gap, 1) {
				if b.take(size, now) {
					passed += uint64(size) * 8
				}
			}
			want := rate + burst
			if d := float64(passed)/float64(want) - 1; d < -0.01 || d > 0.01 {
				t.Errorf("policer at %d bits/s, %d B frames: %d bits passed in 1 s, want %d (rate + burst) ±1%%", rate, size, passed, want)
			}
			s := newBucket(Rate{BitsPerSecond: rate}, 1500, 0)
			var sent uint64
			for now := int64(0); now < sec; now += 100_000 { // the worker comes back every 100 µs
				n := s.budget(now)
				for n > 0 {
					s.spend(uint64(size), now)
					sent += uint64(size) * 8
					n -= int64(size)
				}
			}
			if d := float64(sent)/float64(want) - 1; d < -0.01 || d > 0.01 {
				t.Errorf("shaper at %d bits/s, %d B frames: %d bits sent in 1 s, want %d ±1%%", rate, size, sent, want)
			}
		}
	}
}

// TestBucketBigFrame: a frame larger than the bucket (GSO passed whole)
// passes from a full bucket and leaves it in debt, which is paid back
// before another frame passes.
func TestBucketBigFrame(t *testing.T) {
	b := newBucket(Rate{BitsPerSecond: 10_000_000}, 1500, 0) // burst 10 ms = 100 kbit
	big := 65535
	if !b.take(big, 0) {
		t.Fatal("a 64 KiB frame from a full bucket was dropped")
	}
	if b.take(64, 1_000_000) {
		t.Error("a frame passed 1 ms later, while the bucket owes 524 kbit")
	}
	if w := b.wait(64, 1_000_000); w < 40_000_000 {
		t.Errorf("wait %d ns after the debt, want about 52 ms", w)
	}
	if !b.take(64, 60_000_000) {
		t.Error("a frame was dropped after the debt was paid")
	}
}

// rateRig is a -> b with the given limits on a (egress) and b (ingress),
// a sending 1000-byte frames as fast as its ring takes them for window;
// it returns the bytes b's guest received (its own count) and the time.
func rateRig(t *testing.T, aBW, bBW Bandwidth, polling Polling, window time.Duration) (got uint64, elapsed time.Duration, d *Dataplane) {
	t.Helper()
	d = newDataplane(t, 0)
	sa := addPortMAC(t, d, "a", macA, PortOptions{Polling: polling, Bandwidth: aBW})
	sb := addPortMAC(t, d, "b", macB, PortOptions{Polling: polling, Bandwidth: bBW})
	a := dial(t, sa, frontend.Config{RxPoll: true})
	b := dial(t, sb, frontend.Config{RxPoll: true})
	learn(t, a, b, 1)
	portStats(t, d, "b") // learned: measure from here
	frame := udpFrame(macB, macA, 1, 2, make([]byte, 1000-42))
	t0 := time.Now()
	for time.Since(t0) < window {
		a.ReclaimTx(0)
		for a.Send(0, frame) == nil {
		}
		for {
			fr, err := b.Recv(0, 0)
			if err != nil {
				break
			}
			got += uint64(len(fr))
		}
		time.Sleep(200 * time.Microsecond)
	}
	return got, time.Since(t0), d
}

// TestEgressShaped: a guest sending faster than its port's egress limit
// gets no more than the limit (+5 %, plus the burst), its frames wait in its ring
// (nothing dropped), and the bursts cut short are counted.
func TestEgressShaped(t *testing.T) {
	const rate = 20_000_000
	bw := Bandwidth{Egress: Rate{BitsPerSecond: rate}}
	for _, polling := range []Polling{PollInterrupt, PollAdaptive} {
		t.Run(polling.String(), func(t *testing.T) {
			got, el, d := rateRig(t, bw, Bandwidth{}, polling, 2*time.Second)
			burst := float64(rate) * DefaultBurst / 8
			want := float64(rate)/8*el.Seconds() + burst
			t.Logf("%s: %d bytes in %v: %.2f Mbit/s (limit %d Mbit/s)", polling, got, el.Round(time.Millisecond), float64(got)*8/el.Seconds()/1e6, rate/1_000_000)
			// Above the limit is the limiter's fault; below it may be the
			// generator's on a busy machine (the Go frontend under -race
			// beside other tests offers a few Mbit/s): reported, and
			// measured by hack/bench/limiter in make bench.
			if r := float64(got) / want; r > 1.05 || got == 0 {
				t.Errorf("received %d bytes in %v, want %.0f (the limit and its burst): ratio %.3f", got, el, want, r)
			}
			q := portStats(t, d, "a").Queues[0]
			if q.Shaped == 0 {
				t.Error("no burst counted as shaped")
			}
			if drops := portStats(t, d, "b").Queues[0].Drops; drops != (QueueDrops{}) {
				t.Errorf("drops at b: %+v, want none (shaping leaves frames in the sender's ring)", drops)
			}
		})
	}
}

// TestIngressPoliced: frames to a port above its ingress limit are
// dropped and counted as rateLimited; what arrives is no more than the
// limit (+5 %).
func TestIngressPoliced(t *testing.T) {
	const rate = 20_000_000
	bw := Bandwidth{Ingress: Rate{BitsPerSecond: rate}}
	got, el, d := rateRig(t, Bandwidth{}, bw, PollAdaptive, 2*time.Second)
	burst := float64(rate) * DefaultBurst / 8
	want := float64(rate)/8*el.Seconds() + burst
	t.Logf("%d bytes in %v: %.2f Mbit/s (limit %d Mbit/s)", got, el.Round(time.Millisecond), float64(got)*8/el.Seconds()/1e6, rate/1_000_000)
	if r := float64(got) / want; r > 1.05 || got == 0 { // as in TestEgressShaped
		t.Errorf("received %d bytes in %v, want %.0f (the limit and its burst): ratio %.3f", got, el, want, r)
	}
	q := portStats(t, d, "b").Queues[0]
	sent := portStats(t, d, "a").Queues[0].TxPackets
	if q.Drops.RateLimited == 0 || q.Drops.RateLimited+q.RxPackets > sent {
		t.Errorf("b: %d frames received, %d rate-limited, of %d sent", q.RxPackets, q.Drops.RateLimited, sent)
	}
}

// TestFairShare: a guest sending jumbo frames and one sending small
// frames share a worker: in one pass the jumbo ring moves about a quantum
// (not 32 frames of 9000 bytes), the small ring all of its 32, and over
// later passes the jumbo ring gets its bytes' share, not more.
func TestFairShare(t *testing.T) {
	d := newDataplane(t, 0)
	add := func(name string, mac [6]byte) string {
		s := sockPath(t, name)
		if err := d.AddPort(netdev.Config{Name: name, Socket: s, Role: netdev.RoleServer, QueuePairs: 1, MTU: 9000, MAC: mac[:]},
			PortOptions{Polling: PollAdaptive}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	macJ, macS := [6]byte{0x52, 0x54, 0, 0, 2, 1}, [6]byte{0x52, 0x54, 0, 0, 2, 2}
	cfg := frontend.Config{QueueSize: 256, TxBufSize: 9100, RxBufSize: 9100, RxPoll: true}
	jf, sf, bf := dial(t, add("j", macJ), cfg), dial(t, add("s", macS), cfg), dial(t, add("b", macB), cfg)
	for _, g := range []struct {
		f   *frontend.Frontend
		mac [6]byte
	}{{jf, macJ}, {sf, macS}, {bf, macB}} {
		if err := g.f.Send(0, broadcastFrom(g.mac)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the three greetings switched", func() bool { return portStats(t, d, "b").Queues[0].RxPackets == 2 })
	time.Sleep(20 * time.Millisecond)
	for _, f := range []*frontend.Frontend{jf, sf, bf} {
		f.RecvAll(0, 0)
		f.ReclaimTx(0)
	}
	w := d.workers[0]
	w.halt()
	jumbo := udpFrame(macB, macJ, 1, 2, make([]byte, 9000-42))
	small := udpFrame(macB, macS, 3, 4, make([]byte, 64-42))
	for range 32 {
		if err := jf.Send(0, jumbo); err != nil {
			t.Fatal(err)
		}
		if err := sf.Send(0, small); err != nil {
			t.Fatal(err)
		}
	}
	j0, s0 := portStats(t, d, "j").Queues[0].TxBytes, portStats(t, d, "s").Queues[0].TxPackets
	w.pass()
	jb := portStats(t, d, "j").Queues[0].TxBytes - j0
	sp := portStats(t, d, "s").Queues[0].TxPackets - s0
	t.Logf("one pass: the jumbo ring moved %d bytes (%d frames), the small ring %d frames", jb, jb/9000, sp)
	if jb > fairQuantum+9000 || jb < fairQuantum-9000 {
		t.Errorf("the jumbo ring moved %d bytes in one pass, want its quantum %d (± one frame)", jb, fairQuantum)
	}
	if sp != 32 {
		t.Errorf("the small ring moved %d of its 32 frames in the pass", sp)
	}
	for range 10 {
		w.pass()
		bf.RecvAll(0, 0)
	}
	if got := portStats(t, d, "j").Queues[0].TxPackets; got < 32 {
		t.Errorf("the jumbo ring moved %d of its 32 frames over 11 passes: its turn did not come back", got)
	}
}
