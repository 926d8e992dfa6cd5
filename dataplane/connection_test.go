package dataplane

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
)

// logBuffer collects a dataplane's log for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// connPort is a server-role port with the given handshake timeout.
func connPort(t *testing.T, handshake time.Duration) (*Dataplane, string, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	d, err := New(Config{CPUs: []int{0}, Logger: slogTo(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	s := sockPath(t, "p")
	if err := d.AddPort(netdev.Config{Name: "p", Socket: s, Role: netdev.RoleServer, QueuePairs: 2, MTU: 1500,
		HandshakeTimeout: handshake}, PortOptions{}); err != nil {
		t.Fatal(err)
	}
	return d, s, logs
}

func rawConn(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByPeer reports whether the backend closed c within d.
func closedByPeer(c *net.UnixConn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	_, err := c.Read(b[:])
	return errors.Is(err, io.EOF)
}

// TestSilentConnectionTimesOut: a connection that never sends SET_OWNER is
// closed after the handshake timeout, and said so; a frontend that comes
// afterwards is served.
func TestSilentConnectionTimesOut(t *testing.T) {
	_, s, logs := connPort(t, 200*time.Millisecond)
	c := rawConn(t, s)
	t0 := time.Now()
	if !closedByPeer(c, 3*time.Second) {
		t.Fatal("a silent connection was not closed within 3 s")
	}
	if el := time.Since(t0); el < 150*time.Millisecond {
		t.Errorf("closed after %v, before the 200 ms timeout", el)
	}
	waitFor(t, "the log line", func() bool { return strings.Contains(logs.String(), "no SET_OWNER within the handshake timeout") })
	f := dial(t, s, frontend.Config{QueuePairs: 2})
	if f.Info().QueueNum != 2 {
		t.Errorf("GET_QUEUE_NUM = %d, want 2", f.Info().QueueNum)
	}
}

// TestNewerConnectionReplacesSilentOne: a connection that said nothing
// does not make a real frontend wait: the newer replaces it at once.
func TestNewerConnectionReplacesSilentOne(t *testing.T) {
	d, s, logs := connPort(t, time.Minute)
	silent := rawConn(t, s)
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	f, err := frontend.Dial(s, frontend.Config{QueuePairs: 2})
	if err != nil {
		t.Fatalf("the real frontend was not served: %v", err)
	}
	defer f.Close()
	if el := time.Since(t0); el > 2*time.Second {
		t.Errorf("setup took %v", el)
	}
	if !closedByPeer(silent, 2*time.Second) {
		t.Error("the silent connection is still open")
	}
	if !strings.Contains(logs.String(), "replaces one that has not finished its handshake") {
		t.Error("the replacement was not logged")
	}
	if ps := portStats(t, d, "p"); !ps.Connected || ps.EnabledPairs != 2 {
		t.Errorf("port after the replacement: connected %v, enabled pairs %d", ps.Connected, ps.EnabledPairs)
	}
}

// TestSecondConnectionRefusedWhileEstablished: while a frontend is
// established, another connection is closed at once (not left waiting),
// logged, and the first carries on.
func TestSecondConnectionRefusedWhileEstablished(t *testing.T) {
	d, s, logs := connPort(t, time.Minute)
	f := dial(t, s, frontend.Config{QueuePairs: 2})
	second := rawConn(t, s)
	if !closedByPeer(second, 2*time.Second) {
		t.Fatal("a second connection was left waiting")
	}
	waitFor(t, "the refusal in the log", func() bool { return strings.Contains(logs.String(), "refused a second frontend connection") })
	p, _ := d.Port("p")
	if p.Refused() != 1 {
		t.Errorf("refused = %d, want 1", p.Refused())
	}
	if !portStats(t, d, "p").Connected {
		t.Fatal("the first frontend lost its session")
	}
	// the first frontend's session still answers
	if _, err := f.CtrlGet(vhostuser.ReqGetQueueNum, nil); err != nil {
		t.Fatalf("first frontend after the refusal: %v", err)
	}
	// and a successor right after it exits is served, not refused
	f.Close()
	g := dial(t, s, frontend.Config{QueuePairs: 2})
	if _, err := g.CtrlGet(vhostuser.ReqGetQueueNum, nil); err != nil {
		t.Fatalf("successor: %v", err)
	}
	if p.Refused() != 1 {
		t.Errorf("the successor was refused (refused = %d)", p.Refused())
	}
}

// TestQueueNumBeforeProtocolFeatures: GET_QUEUE_NUM is answered once MQ is
// in the queried features, before SET_PROTOCOL_FEATURES (as DPDK does).
func TestQueueNumBeforeProtocolFeatures(t *testing.T) {
	_, s, _ := connPort(t, time.Minute)
	c := vhostuser.NewConn(rawConn(t, s))
	for _, req := range []vhostuser.Request{vhostuser.ReqGetFeatures, vhostuser.ReqGetProtocolFeatures, vhostuser.ReqGetQueueNum} {
		if err := c.WriteMessage(req, 0, nil, nil); err != nil {
			t.Fatal(err)
		}
		m, err := c.ReadReply()
		if err != nil {
			t.Fatalf("%s: %v", req, err)
		}
		if req == vhostuser.ReqGetQueueNum {
			if n, _ := vhostuser.DecodeU64(m.Payload); n != 2 {
				t.Errorf("GET_QUEUE_NUM = %d, want 2", n)
			}
		}
	}
}

// TestTooManyQueuesNamed: a frontend that sets up a vring beyond the
// port's pairs is refused with a message naming the port's queue pairs.
func TestTooManyQueuesNamed(t *testing.T) {
	_, s, logs := connPort(t, time.Minute)
	if _, err := frontend.Dial(s, frontend.Config{QueuePairs: 4}); err == nil || !strings.Contains(err.Error(), "backend supports 2") {
		t.Fatalf("a frontend asking for 4 pairs of a 2-pair port: %v", err)
	}
	f := dial(t, s, frontend.Config{QueuePairs: 2})
	f.Conn().WriteMessage(vhostuser.ReqSetVringNum, 0, vhostuser.VringState{Index: 5, Num: 256}.Encode(nil), nil)
	waitFor(t, "the error in the log", func() bool {
		return strings.Contains(logs.String(), `vring 5 (queue pair 2) is beyond port \"p\"'s 2 queue pairs`)
	})
}

func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
