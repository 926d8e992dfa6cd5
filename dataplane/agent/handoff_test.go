package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
)

func numbered(i int) []byte { return binary.BigEndian.AppendUint32(frame(macB, macA), uint32(i)) }

func slotsOf(t *testing.T, c agentv1.AgentClient) map[string][]string {
	t.Helper()
	l, err := c.ListPorts(context.Background(), &agentv1.ListPortsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, p := range l.Ports {
		for _, q := range p.Status.GetQueues() {
			out[p.Spec.Id] = append(out[p.Spec.Id], q.GetSlot())
		}
	}
	return out
}

// waitServed waits for a successor to finish its takeover and answer.
func waitServed(t *testing.T, e *env) {
	t.Helper()
	select {
	case <-e.ag.served:
	case err := <-e.done:
		e.done <- err // for its cleanup
		t.Fatalf("the successor's Serve ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the successor did not finish the takeover")
	}
}

// TestHandoffToSuccessor (#17): while a numbered stream crosses two ports
// (one in each role), a second agent starts on the same state directory,
// as the next version does in an upgrade. It takes both live sessions
// over: every frame arrives once and in order, neither frontend
// reconnects, the ports keep their slots, the successor answers the API
// and the old agent serves nothing more; both say what the handoff did.
func TestHandoffToSuccessor(t *testing.T) {
	t.Setenv(PodEnv, "pod-1") // the old process's pod, as the chart sets it
	dir := shortDir(t)
	e := start(t, dir, nil, 4)
	a, b := e.spec("a", 2), e.spec("b", 2)
	b.Role = agentv1.Role_ROLE_CLIENT
	os.MkdirAll(filepath.Dir(b.SocketPath), 0o750)
	lnB, err := frontend.Listen(b.SocketPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lnB.Close()
	for _, s := range []*agentv1.PortSpec{a, b} {
		if _, err := e.create(s); err != nil {
			t.Fatal(err)
		}
	}
	fa, err := frontend.Dial(a.SocketPath, frontend.Config{QueuePairs: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := lnB.Accept(frontend.Config{QueuePairs: 2}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	exchange(t, fa, fb)
	before := slotsOf(t, e.client)

	const n = 6000
	s := frontend.StartStream(fa, fb, n, numbered)
	for deadline := time.Now().Add(10 * time.Second); s.Sent() < n/3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream did not start")
		}
	}
	dp2, err := dataplane.New(dataplane.Config{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	e2 := startOn(t, dir, dp2, 4)
	waitServed(t, e2)
	if err := s.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		p, ok := dp2.Port(name)
		if !ok || !p.Connected() || p.Connects() != 1 {
			t.Fatalf("port %s on the successor: present %v; want the adopted session, never a reconnect", name, ok)
		}
		if _, ok := e.dp.Port(name); ok {
			t.Errorf("port %s is still in the old dataplane", name)
		}
	}
	if after := slotsOf(t, e2.client); len(after) != 2 || !slices.Equal(after["a"], before["a"]) || !slices.Equal(after["b"], before["b"]) {
		t.Errorf("slots before %v, after %v", before, after)
	}
	old, ok1 := e.ag.LastHandoff()
	succ, ok2 := e2.ag.LastHandoff()
	if !ok1 || !ok2 || old.Role != "handed" || old.Ports != 2 || succ.Role != "adopted" || succ.Adopted != 2 || succ.CreatedAfresh != 0 {
		t.Errorf("last handoff: old %+v (%v), successor %+v (%v)", old, ok1, succ, ok2)
	}
	if h, err := e2.client.GetHandoff(context.Background(), &agentv1.GetHandoffRequest{}); err != nil ||
		!h.GetHappened() || h.GetRole() != "adopted" || h.GetAdopted() != 2 || h.GetPeerBuild() != Build() {
		t.Errorf("GetHandoff from the successor: %v, %v", h, err)
	}
	if e.ag.ready.Load() {
		t.Error("the old agent still says it is ready")
	}
	if _, err := e.ag.Create(e.spec("c", 1)); err == nil {
		t.Error("the old agent still creates ports after handing over")
	}
	t.Logf("handoff: %d ports, paused %v (old side), %v from hello to serving (successor)", old.Ports, old.Pause, succ.Pause)
	exchange(t, fa, fb)

	// The old pod's container restarts before the pod is deleted: the
	// successor gives it nothing back.
	dpBack, err := dataplane.New(dataplane.Config{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{SlotsPerCPU: 4, SocketRoot: e.root, StateDir: e.state, APISocket: filepath.Join(dir, "api-back.sock"), Logger: logger()}, dpBack)
	dpBack.Close()
	if err == nil || !strings.Contains(err.Error(), "pod pod-1 handed its ports to this process") {
		t.Fatalf("the old pod asking again: %v; want a refusal", err)
	}
	exchange(t, fa, fb)

	// The successor hands over in turn (the next upgrade).
	t.Setenv(PodEnv, "pod-3")
	dp3, err := dataplane.New(dataplane.Config{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	e3 := startOn(t, dir, dp3, 4)
	waitServed(t, e3)
	if h, ok := e3.ag.LastHandoff(); !ok || h.Adopted != 2 {
		t.Fatalf("second handoff: %+v", h)
	}
	exchange(t, fa, fb)
}

// fakeOld stands in for an old process that fails half way: it answers
// on handoff.sock with the real agent e's dataplane (live ports, the lock
// taken), and after sending the state acts as told.
func fakeOld(t *testing.T, e *env, after func(c *handoff.Conn) error) chan error {
	t.Helper()
	e.ag.closeHandoffs() // e no longer answers on handoff.sock: the fake does
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(filepath.Join(e.state, handoffName)); os.IsNotExist(err) {
			break // closed (and unlinked)
		}
		if time.Now().After(deadline) {
			t.Fatal("handoff.sock stayed")
		}
	}
	ln, err := listenHandoff(e.state)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := e.ag.lock.try(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		// As a build from before two-phase handoffs: the successor's
		// hello has a field it does not know, so it closes; the successor
		// asks again in one phase.
		var c *handoff.Conn
		for try := 0; c == nil; try++ {
			nc, err := ln.AcceptUnix()
			if err != nil {
				done <- err
				return
			}
			c = handoff.NewConn(nc)
			var legacy struct {
				PID   int    `json:"pid"`
				Build string `json:"build"`
				Pod   string `json:"pod,omitempty"`
			}
			if _, err := c.Recv(handoff.KindHello, &legacy); err != nil {
				c.Close()
				c = nil
				if try > 0 {
					done <- fmt.Errorf("the successor's second hello: %w", err)
					return
				}
			}
		}
		defer c.Close()
		_, err = e.dp.Handover("fake-old", pauseBound, dataplane.Exchange{Send: func(st *handoff.State, fds []int) error {
			st.Deadline = time.Now().Add(handoffWait)
			if err := c.Send(handoff.KindState, st, fds); err != nil {
				return err
			}
			return after(c)
		}}) // one phase, as a predecessor from before two-phase handoffs answers
		done <- err
	}()
	return done
}

// handoffBed is an agent with two server-role ports and a stream between
// their frontends, a third of it sent.
func handoffBed(t *testing.T) (*env, *frontend.Stream) {
	t.Helper()
	e := start(t, shortDir(t), nil, 4)
	var fes []*frontend.Frontend
	for _, id := range []string{"a", "b"} {
		s := e.spec(id, 2)
		if _, err := e.create(s); err != nil {
			t.Fatal(err)
		}
		f, err := frontend.Dial(s.SocketPath, frontend.Config{QueuePairs: 2})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		fes = append(fes, f)
	}
	exchange(t, fes[0], fes[1])
	s := frontend.StartStream(fes[0], fes[1], 6000, numbered)
	for deadline := time.Now().Add(10 * time.Second); s.Sent() < 2000; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream did not start")
		}
	}
	return e, s
}

// TestHandoffOldDiesAfterTaken: the old process reads Taken and dies
// before it can say Released (its lock goes with it): the successor
// serves the ports, the stream loses nothing.
func TestHandoffOldDiesAfterTaken(t *testing.T) {
	e, s := handoffBed(t)
	oldDone := fakeOld(t, e, func(c *handoff.Conn) error {
		if _, err := c.Recv(handoff.KindTaken, &struct{}{}); err != nil {
			return err
		}
		// dies: no Released, its API gone, and the kernel drops its lock
		c.Close()
		e.ag.stopServing()
		e.ag.lock.release()
		return nil // the dataplane commits: it never serves again
	})
	dp2, err := dataplane.New(dataplane.Config{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	e2 := startOn(t, filepath.Dir(e.state), dp2, 4)
	waitServed(t, e2)
	if err := <-oldDone; err != nil {
		t.Fatal("old: ", err)
	}
	if err := s.Wait(); err != nil {
		t.Fatal(err)
	}
	if h, ok := e2.ag.LastHandoff(); !ok || h.Adopted != 2 {
		t.Fatalf("successor's handoff %+v", h)
	}
}

// TestHandoffOldGoesBackToServing: the old process reads Taken but gives
// up (its deadline passed) and serves on, keeping its lock: the successor
// heard no Released, cannot take the lock, lets go of what it adopted
// without touching it and fails to start; the stream loses nothing.
func TestHandoffOldGoesBackToServing(t *testing.T) {
	e, s := handoffBed(t)
	oldDone := fakeOld(t, e, func(c *handoff.Conn) error {
		if _, err := c.Recv(handoff.KindTaken, &struct{}{}); err != nil {
			return err
		}
		return errors.New("deadline passed") // back to serving, lock kept
	})
	dp2, err := dataplane.New(dataplane.Config{Logger: logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer dp2.Close()
	ag2, err := New(Config{SlotsPerCPU: 4, SocketRoot: e.root, StateDir: e.state, APISocket: filepath.Join(filepath.Dir(e.state), "api2.sock"), Logger: logger()}, dp2)
	if err != nil {
		t.Fatal(err)
	}
	err = ag2.Serve(context.Background())
	if err == nil || !strings.Contains(err.Error(), lockName) {
		t.Fatalf("the successor's Serve: %v; want it to refuse to serve beside the old process", err)
	}
	t.Logf("successor: %v", err)
	if err := <-oldDone; err == nil {
		t.Fatal("the old dataplane committed")
	}
	if len(dp2.Stats()) != 0 {
		t.Errorf("the successor kept %d ports", len(dp2.Stats()))
	}
	if err := s.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if p, ok := e.dp.Port(name); !ok || p.Connects() != 1 {
			t.Errorf("port %s: the old dataplane lost it or it reconnected", name)
		}
	}
}
