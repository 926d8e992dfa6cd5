package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
)

// TestMain runs the test binary as the dataplane itself when asked to
// (VHOSTMQ_TEST_AS_DATAPLANE=1): the crash test kills and restarts real
// processes.
func TestMain(m *testing.M) {
	if os.Getenv("VHOSTMQ_TEST_AS_DATAPLANE") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var (
	macA = [6]byte{0x52, 0x54, 0, 0, 0, 0x0a}
	macB = [6]byte{0x52, 0x54, 0, 0, 0, 0x0b}
)

func frame(dst, src [6]byte, n uint32) []byte {
	b := append(append(append([]byte{}, dst[:]...), src[:]...), 0x88, 0xb5) // local experimental ethertype
	return binary.BigEndian.AppendUint32(append(b, make([]byte, 46)...), n)
}

// TestKilledMidBurstLosesNoDescriptor (#17, crash restart): the dataplane
// process is SIGKILLed 100 times while a stream of frames crosses it, at
// random moments inside its bursts, and started again each time; the two
// frontends (which listen, as QEMU does for KubeVirt) reattach from the
// used indexes in their own memory, as QEMU does. Every descriptor a
// frontend made available comes back exactly once (the frontend fails on a
// used id it does not have outstanding), none is left outstanding at the
// end, and every frame reaches the other side at least once or is
// counted as dropped by the restarted process while it set its rings up
// (a TX chain taken and not completed at the kill is taken again: a frame
// may arrive twice, never vanish uncounted). This is why the dataplane needs no
// INFLIGHT_SHMFD: it completes chains in order and publishes a used index
// only after the elements before it.
func TestKilledMidBurstLosesNoDescriptor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the dataplane 101 times")
	}
	dir, err := os.MkdirTemp("", "vmqcrash")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("logs kept in %s", dir)
		}
	})
	sock := func(n string) string { return filepath.Join(dir, n+".sock") }
	cfg := filepath.Join(dir, "dataplane.yaml")
	yaml := fmt.Sprintf(`cpus: [0]
apiSocket: %s
stateDir: %s
logLevel: info
ports:
  - {name: a, socket: %s, role: client, queuePairs: 2, mtu: 1500}
  - {name: b, socket: %s, role: client, queuePairs: 2, mtu: 1500}
`, filepath.Join(dir, "api.sock"), filepath.Join(dir, "state"), sock("a"), sock("b"))
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	la, err := frontend.Listen(sock("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	lb, err := frontend.Listen(sock("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	logf, err := os.Create(filepath.Join(dir, "dataplane.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	start := func() *exec.Cmd {
		t.Helper()
		cmd := exec.Command(os.Args[0], "--config", cfg)
		cmd.Env = append(os.Environ(), "VHOSTMQ_TEST_AS_DATAPLANE=1")
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	fcfg := frontend.Config{QueuePairs: 2}
	cmd := start()
	fa, err := la.Accept(fcfg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := lb.Accept(fcfg, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()

	var next uint32         // the next frame number
	got := map[uint32]int{} // frame number -> arrivals
	receive := func(d time.Duration) error {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			for p := range 2 {
				fr, err := fb.Recv(p, time.Millisecond)
				if errors.Is(err, frontend.ErrTimeout) {
					continue
				}
				if err != nil {
					return err
				}
				got[binary.BigEndian.Uint32(fr[len(fr)-4:])]++
			}
			if len(got) == int(next) {
				return nil
			}
		}
		return nil
	}
	inFlightAtKill, discarded := 0, 0
	// The kill comes a random moment after a burst is sent, within
	// maxDelay, which follows what the kills find: shorter after a kill
	// that came when the burst was done, longer after one inside it. How
	// long a burst takes depends on the machine.
	maxDelay := 300 * time.Microsecond
	api := filepath.Join(dir, "api.sock")
	const kills = 100
	for k := 0; k <= kills; k++ {
		// A burst of 24 frames on each pair, published at once; the
		// kill lands at a random moment while the worker moves them.
		killed := make(chan int, 1)
		for p := range 2 {
			var burst [][]byte
			for range 24 {
				burst = append(burst, frame(macB, macA, next))
				next++
			}
			if n, err := fa.SendBurst(p, burst); err != nil || n != len(burst) {
				t.Fatalf("kill %d: send on pair %d: %d of %d frames, %v", k, p, n, len(burst), err)
			}
		}
		if k < kills {
			delay := time.Duration(rand.Int64N(int64(maxDelay)))
			go func(c *exec.Cmd) {
				time.Sleep(delay)
				out := 0
				for p := range 2 {
					n, _ := fa.ReclaimTx(p)
					out += n
				}
				c.Process.Kill()
				c.Wait()
				killed <- out
			}(cmd)
		}
		if k == kills {
			break
		}
		if <-killed > 0 {
			inFlightAtKill++
			maxDelay = min(maxDelay*5/4, 300*time.Microsecond)
		} else {
			maxDelay = max(maxDelay*3/4, 5*time.Microsecond)
		}
		// What the guest had received before the kill it keeps (its
		// rings are its own); the rest crosses after the restart.
		if err := receive(time.Millisecond); err != nil {
			t.Fatalf("kill %d: receive: %v", k, err)
		}
		cmd = start()
		for _, x := range []struct {
			l *frontend.Listener
			f *frontend.Frontend
		}{{la, fa}, {lb, fb}} {
			c, err := x.l.AcceptConn(10 * time.Second)
			if err != nil {
				t.Fatalf("kill %d: the restarted dataplane did not dial: %v", k, err)
			}
			if err := x.f.Reattach(c); err != nil {
				t.Fatalf("kill %d: reattach: %v", k, err)
			}
		}
		// Every frame sent so far crosses before the next burst (the
		// receiver's ring never overflows), but those the new process
		// dropped while it set its rings up, which it counts: the
		// guest's backlog sent into a ring started and not yet enabled
		// (the spec has the backend discard it, "Ring states"), or
		// forwarded to a port not set up yet.
		var want int
		for deadline := time.Now().Add(2 * time.Second); ; {
			if err := receive(50 * time.Millisecond); err != nil {
				t.Fatalf("kill %d: receive: %v", k, err)
			}
			d, err := drops(api)
			if err != nil {
				t.Fatalf("kill %d: stats: %v", k, err)
			}
			want = int(next) - discarded - int(d)
			if len(got) >= want || time.Now().After(deadline) {
				discarded += int(d)
				break
			}
		}
		if len(got) < want {
			t.Errorf("kill %d: %d of %d frames arrived within 2 s of the restart (%d dropped while rings were set up)", k, len(got), next, discarded)
			break
		}
	}
	// The last process runs on: everything still in the rings crosses.
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < int(next) && time.Now().Before(deadline) {
		if err := receive(100 * time.Millisecond); err != nil {
			t.Fatal("receive: ", err)
		}
	}
	outstanding := 0
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		outstanding = 0
		for p := range 2 {
			n, err := fa.ReclaimTx(p)
			if err != nil {
				t.Fatalf("pair %d: %v", p, err)
			}
			outstanding += n
		}
		if outstanding == 0 || time.Now().After(deadline) {
			break
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	twice := 0
	for _, n := range got {
		if n > 1 {
			twice++
		}
	}
	t.Logf("%d kills (%d with TX chains in flight; kills at most %v after a burst at the end), %d frames sent, %d arrived (%d of them more than once), %d dropped (and counted) while a restarted process set its rings up",
		kills, inFlightAtKill, maxDelay, next, len(got), twice, discarded)
	if outstanding != 0 {
		t.Errorf("%d TX chains never came back", outstanding)
	}
	if len(got) < int(next)-discarded {
		var lost []uint32
		for i := range next {
			if got[i] == 0 && len(lost) < 10 {
				lost = append(lost, i)
			}
		}
		t.Errorf("%d of %d frames never arrived, %d of them dropped while rings were set up (first: %v)", int(next)-len(got), next, discarded, lost)
	}
	if inFlightAtKill < kills/4 {
		t.Errorf("only %d of %d kills found TX chains in flight: the kills did not land inside bursts", inFlightAtKill, kills)
	}
}

// drops asks the running dataplane how many frames it dropped, for any
// reason: while a restarted process sets its rings up, what the guest
// sent into a started but not yet enabled ring is discarded (as the spec
// says), and a destination not set up yet takes nothing.
func drops(api string) (uint64, error) {
	conn, err := grpc.NewClient("unix://"+api, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := agentv1.NewAgentClient(conn).GetStats(ctx, &agentv1.GetStatsRequest{})
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, p := range st.GetPorts() {
		for _, q := range p.GetQueues() {
			d := q.GetDrops()
			// RxHoldExpired is also counted in RxNoBuffer
			n += d.GetRxNoBuffer() + d.GetRxDisabled() + d.GetTxDisabled() + d.GetBadChain() + d.GetMtu() +
				d.GetRunt() + d.GetNoDestination() + d.GetBadOffload()
		}
	}
	return n, nil
}
