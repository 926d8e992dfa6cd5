// Package agenttest runs a real dataplane and node agent on temporary
// sockets, for the tests of the agent's clients (the device plugin, the
// CNI plugin). Layout under Dir: s/ (socket root), state/, api.sock.
package agenttest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/agent"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// Node is one running agent with its dataplane.
type Node struct {
	Dir        string
	SocketRoot string
	StateDir   string
	APISocket  string
	Client     agentv1.AgentClient // valid while the agent runs

	t           testing.TB
	slotsPerCPU int
	conn        *grpc.ClientConn
	cancel      context.CancelFunc
	done        chan error
	dp          *dataplane.Dataplane
}

// Logger logs at debug level with -v, else discards.
func Logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Start runs an agent (one unpinned worker, slotsPerCPU slots) in dir; an
// empty dir makes a short temporary one (unix socket paths must stay under
// 108 bytes, which t.TempDir does not promise). The agent stops at cleanup.
func Start(t testing.TB, dir string, slotsPerCPU int) *Node {
	t.Helper()
	if dir == "" {
		d, err := os.MkdirTemp("", "ag")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	n := &Node{Dir: dir, SocketRoot: filepath.Join(dir, "s"), StateDir: filepath.Join(dir, "state"),
		APISocket: filepath.Join(dir, "api.sock"), t: t, slotsPerCPU: slotsPerCPU}
	if err := os.MkdirAll(n.SocketRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	n.Restart()
	return n
}

// Restart starts the agent again on the same state (after Stop).
func (n *Node) Restart() {
	t := n.t
	t.Helper()
	dp, err := dataplane.New(dataplane.Config{Logger: Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ag, err := agent.New(agent.Config{SlotsPerCPU: n.slotsPerCPU, SocketRoot: n.SocketRoot, StateDir: n.StateDir,
		APISocket: n.APISocket, Logger: Logger()}, dp)
	if err != nil {
		dp.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.dp, n.done = cancel, dp, make(chan error, 1)
	go func() { n.done <- ag.Serve(ctx) }()
	// Dial once the socket exists: a refused first dial costs gRPC's 1 s backoff.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(n.APISocket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent's API socket did not appear")
		}
	}
	if n.conn, err = grpc.NewClient("unix://"+n.APISocket, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	n.Client = agentv1.NewAgentClient(n.conn)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := n.Client.ListPorts(context.Background(), &agentv1.ListPortsRequest{}); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent's API did not come up")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Stop stops the agent and its dataplane; the state stays.
func (n *Node) Stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	<-n.done
	n.conn.Close()
	n.dp.Close()
	n.cancel = nil
}
