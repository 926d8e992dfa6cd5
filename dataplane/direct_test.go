package dataplane

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// TestDirectAndWalkedFramesArriveAlike: the same frames sent as direct
// chains (header, then frame) and as indirect chains (only the walker
// serves those) arrive byte for byte alike in every RX layout, one frame
// per buffer, without MRG_RXBUF and spanning 512-byte buffers; a frame
// over the MTU is dropped on both paths.
func TestDirectAndWalkedFramesArriveAlike(t *testing.T) {
	var sizes = []int{14, 60, 64, 511, 512, 513, 1000, 1514}
	for _, v := range rxVariants {
		for _, tx := range []struct {
			name string
			cfg  frontend.Config
		}{{"direct", frontend.Config{}}, {"walked", frontend.Config{TxIndirect: true}}} {
			t.Run(v.name+"/"+tx.name, func(t *testing.T) {
				d := newDataplane(t)
				a := dial(t, addPort(t, d, "a", netdev.RoleServer, 1), tx.cfg)
				b := dial(t, addPort(t, d, "b", netdev.RoleServer, 1), v.cfg)
				learn(t, a, b, 1)
				var sent [][]byte
				for i, n := range sizes {
					f := udpFrame(macB, macA, uint16(i), 9, bytes.Repeat([]byte{byte(i + 1)}, max(n-42, 0)))[:n]
					sent = append(sent, f)
				}
				long := udpFrame(macB, macA, 99, 9, make([]byte, 1519-42)) // 1 byte over MTU + Ethernet header + a VLAN tag
				if n, err := a.SendBurst(0, append(append([][]byte{}, sent[:4]...), append([][]byte{long}, sent[4:]...)...)); err != nil || n != len(sent)+1 {
					t.Fatalf("sent %d: %v", n, err)
				}
				for i, want := range sent {
					got, err := b.Recv(0, 2*time.Second)
					if err != nil {
						t.Fatalf("frame %d (%d bytes): %v", i, len(want), err)
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("frame %d: got %d bytes %x..., want %d bytes %x...", i, len(got), got[:min(len(got), 20)], len(want), want[:20])
					}
				}
				if got, err := b.Recv(0, 100*time.Millisecond); err == nil {
					t.Fatalf("an extra frame of %d bytes arrived (the one over the MTU?)", len(got))
				}
				if st := portStats(t, d, "a").Queues[0]; st.Drops.MTU != 1 {
					t.Fatalf("a's MTU drops %d, want 1", st.Drops.MTU)
				}
			})
		}
	}
}

// TestDestinationMovesBetweenBursts: when a MAC address moves to another
// port (its guest migrated, or was replaced), the next burst after the
// move goes to the new port: the per-pair MAC cache and the per-burst
// destination must not keep the old one.
func TestDestinationMovesBetweenBursts(t *testing.T) {
	d := newDataplane(t)
	// guests that bridge (port security off): an address may move
	off := PortOptions{Security: PortSecurity{Off: true}}
	a := dial(t, addPortOpt(t, d, "a", off), frontend.Config{})
	b := dial(t, addPortOpt(t, d, "b", off), frontend.Config{})
	c := dial(t, addPortOpt(t, d, "c", off), frontend.Config{})
	learn(t, a, b, 1)
	// c gets both broadcasts learn sent (waiting for exactly these: on a
	// loaded machine the second one can come late)
	for _, src := range [][6]byte{macA, macB} {
		if got, err := c.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got[6:12], src[:]) {
			t.Fatalf("c: learn's broadcast from %x: %x, %v", src, got, err)
		}
	}
	send := func(tag string) {
		t.Helper()
		var burst [][]byte
		for i := range 8 {
			burst = append(burst, udpFrame(macB, macA, uint16(i), 9, []byte(fmt.Sprintf("%s %d", tag, i))))
		}
		if n, err := a.SendBurst(0, burst); err != nil || n != len(burst) {
			t.Fatalf("sent %d: %v", n, err)
		}
	}
	expect := func(f *frontend.Frontend, who, tag string) {
		t.Helper()
		for i := range 8 {
			got, err := f.Recv(0, 2*time.Second)
			if err != nil || string(got[42:]) != fmt.Sprintf("%s %d", tag, i) {
				t.Fatalf("%s: frame %d: %q, %v", who, i, got, err)
			}
		}
	}
	send("before")
	expect(b, "b", "before")
	// macB moves to c: c's guest sends from it.
	if err := c.Send(0, broadcastFrom(macB)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Recv(0, 2*time.Second); err != nil {
		t.Fatalf("a did not see c's broadcast: %v", err)
	}
	if got, err := b.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got[6:12], macB[:]) {
		t.Fatalf("b: c's broadcast: %x, %v", got, err)
	}
	send("after")
	expect(c, "c", "after")
	if got, err := b.Recv(0, 100*time.Millisecond); err == nil {
		t.Fatalf("b still got %q after its address moved", got)
	}
	// and back, which forgets nothing stale either
	if err := b.Send(0, broadcastFrom(macB)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Recv(0, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Recv(0, 2*time.Second); err != nil || !bytes.Equal(got[6:12], macB[:]) {
		t.Fatalf("c: b's broadcast: %x, %v", got, err)
	}
	send("back")
	expect(b, "b", "back")
}
