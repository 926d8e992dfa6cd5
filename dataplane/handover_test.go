package dataplane

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
)

// attach adds a port in role and attaches an in-repo frontend to it.
func attach(t *testing.T, d *Dataplane, name string, role netdev.Role, pairs int, cfgs map[string]netdev.Config) *frontend.Frontend {
	t.Helper()
	cfg := netdev.Config{Name: name, Socket: sockPath(t, name), Role: role, QueuePairs: pairs, MTU: 1500}
	cfgs[name] = cfg
	fcfg := frontend.Config{QueuePairs: pairs}
	if role == netdev.RoleServer {
		if err := d.AddPort(cfg, PortOptions{}); err != nil {
			t.Fatal(err)
		}
		return dial(t, cfg.Socket, fcfg)
	}
	l, err := frontend.Listen(cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := d.AddPort(cfg, PortOptions{}); err != nil {
		t.Fatal(err)
	}
	f, err := l.Accept(fcfg, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func handoffPair(t *testing.T) (old, succ *handoff.Conn) {
	t.Helper()
	a, b := nettest.SocketPair(t)
	old, succ = handoff.NewConn(a), handoff.NewConn(b)
	t.Cleanup(func() { old.Close(); succ.Close() })
	return old, succ
}

// oldSide runs the old process's half of the exchange: Hello in, State
// out, Taken in, Released out; in two phases (the hello asks) Ready in,
// Final out between State and Taken.
func oldSide(d *Dataplane, c *handoff.Conn, during func()) (chan error, *HandoverReport) {
	return oldSideFinal(d, c, during, nil)
}

// oldSideFinal is oldSide with beforeFinal run, in two phases, before the
// old process freezes its rings for Final (the successor has mapped
// everything by then).
func oldSideFinal(d *Dataplane, c *handoff.Conn, during, beforeFinal func()) (chan error, *HandoverReport) {
	done := make(chan error, 1)
	rep := new(HandoverReport)
	go func() {
		var h handoff.Hello
		if _, err := c.Recv(handoff.KindHello, &h); err != nil {
			done <- err
			return
		}
		var commit func(*handoff.Final) error
		if h.TwoPhase {
			commit = func(fin *handoff.Final) error {
				if err := c.Send(handoff.KindFinal, fin, nil); err != nil {
					return err
				}
				_, err := c.Recv(handoff.KindTaken, &struct{}{})
				return err
			}
		}
		send := func(st *handoff.State, fds []int) error {
			if st.Running != h.TwoPhase {
				return fmt.Errorf("state running %v in a handoff asked with twoPhase %v", st.Running, h.TwoPhase)
			}
			if during != nil {
				during()
			}
			if err := c.Send(handoff.KindState, st, fds); err != nil {
				return err
			}
			want := handoff.KindTaken
			if h.TwoPhase {
				want = handoff.KindReady
			}
			_, err := c.Recv(want, &struct{}{})
			if err == nil && h.TwoPhase && beforeFinal != nil {
				beforeFinal()
			}
			return err
		}
		var released error
		r, err := d.Handover("old", 5*time.Second, Exchange{Send: send, Commit: commit,
			Committed: func() { released = c.Send(handoff.KindReleased, struct{}{}, nil) }})
		*rep = r
		if err == nil {
			err = released
		}
		done <- err
	}()
	return done, rep
}

// phases are the two ways a successor asks: one phase (a predecessor's
// rings stop for the whole exchange) and two (they stop for Final only).
var phases = []struct {
	name     string
	twoPhase bool
}{{"one-phase", false}, {"two-phase", true}}

// newSide runs the successor's half: it adopts every handed port with
// the config cfgs gives it, or refuses the whole handoff.
func newSide(t *testing.T, d *Dataplane, c *handoff.Conn, cfgs map[string]netdev.Config, twoPhase bool) error {
	t.Helper()
	_, err := newSideBuilt(t, c, cfgs, nil, twoPhase, func(*handoff.State, []int) (*Dataplane, error) { return d, nil })
	return err
}

// newSideBuilt is newSide with the successor's dataplane built once the
// state is in (as the command does: it adopts the handed uplink).
func newSideBuilt(t *testing.T, c *handoff.Conn, cfgs map[string]netdev.Config, opts map[string]PortOptions, twoPhase bool,
	build func(*handoff.State, []int) (*Dataplane, error)) (*Dataplane, error) {
	t.Helper()
	if err := c.Send(handoff.KindHello, handoff.Hello{PID: os.Getpid(), Build: "new", TwoPhase: twoPhase}, nil); err != nil {
		return nil, err
	}
	var st handoff.State
	fds, err := c.Recv(handoff.KindState, &st)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	if err := st.Check(len(fds)); err != nil {
		c.Refuse(err.Error())
		return nil, err
	}
	if st.Running != twoPhase {
		err := fmt.Errorf("state running %v, asked twoPhase %v", st.Running, twoPhase)
		c.Refuse(err.Error())
		return nil, err
	}
	d, err := build(&st, fds)
	if err != nil {
		c.Refuse(err.Error())
		return nil, err
	}
	return d, adoptAll(d, c, &st, fds, cfgs, opts)
}

func adoptAll(d *Dataplane, c *handoff.Conn, st *handoff.State, fds []int, cfgs map[string]netdev.Config, opts map[string]PortOptions) error {
	var adopted []string
	refuse := func(err error) error {
		for _, n := range adopted {
			d.RemovePort(n) // lets go without touching the sessions
		}
		c.Refuse(err.Error())
		return err
	}
	for _, hp := range st.Ports {
		var spec HandedPort
		if err := json.Unmarshal(hp.Spec, &spec); err != nil {
			return refuse(err)
		}
		if err := d.AdoptPort(cfgs[spec.Name], opts[spec.Name], hp, fds); err != nil {
			return refuse(err)
		}
		adopted = append(adopted, spec.Name)
	}
	positions := func(i int) []handoff.Position { return netdev.Positions(st.Ports[i]) }
	networks := st.Networks
	if st.Running {
		if err := c.Send(handoff.KindReady, struct{}{}, nil); err != nil {
			return err
		}
		var fin handoff.Final
		if _, err := c.Recv(handoff.KindFinal, &fin); err != nil {
			return refuse(err)
		}
		if err := st.CheckFinal(&fin); err != nil {
			return refuse(err)
		}
		positions = func(i int) []handoff.Position { return fin.Ports[i].Vrings }
		networks = fin.Networks
	}
	for i, name := range adopted {
		if err := d.PositionAdopted(name, positions(i)); err != nil {
			return refuse(err)
		}
	}
	if _, err := d.LearnHandedMACs(networks); err != nil {
		return err
	}
	if err := c.Send(handoff.KindTaken, struct{}{}, nil); err != nil {
		return err
	}
	if _, err := c.Recv(handoff.KindReleased, &struct{}{}); err != nil {
		return err
	}
	if n := d.StartAdopted(); n != len(st.Ports) {
		return fmt.Errorf("started %d adopted ports, %d handed", n, len(st.Ports))
	}
	return nil
}

func startStream(a, b *frontend.Frontend, n int) *frontend.Stream {
	return frontend.StartStream(a, b, n, func(i int) []byte { return numbered(macB, macA, i) })
}

func waitStream(t *testing.T, s *frontend.Stream) {
	t.Helper()
	if err := s.Wait(); err != nil {
		t.Fatal(err)
	}
}

func waitSent(t *testing.T, s *frontend.Stream, k int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d frames sent", k), func() bool { return s.Sent() >= k })
}

func rxPackets(ps PortStats) (n uint64) {
	for _, q := range ps.Queues {
		n += q.RxPackets
	}
	return n
}

// TestHandoverKeepsEveryFrame (#17): a numbered stream from a to b goes on
// while both ports move to a successor dataplane, in both roles: every
// frame arrives once and in order, the frontends never reconnect, a
// control message sent during the pause is answered by the successor, and
// the successor (not the old dataplane) serves the rest of the stream.
func TestHandoverKeepsEveryFrame(t *testing.T) {
	for _, ph := range phases {
		for _, role := range []netdev.Role{netdev.RoleServer, netdev.RoleClient} {
			t.Run(ph.name+"/"+string(role), func(t *testing.T) { testHandoverKeepsEveryFrame(t, role, ph.twoPhase) })
		}
	}
}

func testHandoverKeepsEveryFrame(t *testing.T, role netdev.Role, twoPhase bool) {
	old := newDataplane(t)
	cfgs := map[string]netdev.Config{}
	a := attach(t, old, "a", role, 2, cfgs)
	b := attach(t, old, "b", role, 2, cfgs)
	c := attach(t, old, "c", role, 1, cfgs)
	learn(t, a, b, 2)
	const n = 6000
	s := startStream(a, b, n)
	waitSent(t, s, n/3)

	// c asks for its features while the old dataplane is paused:
	// the request waits in the socket for the successor.
	asked := make(chan error, 1)
	during := func() {
		go func() {
			c.Conn().Raw().SetReadDeadline(time.Now().Add(10 * time.Second))
			v, err := c.CtrlGet(vhostuser.ReqGetFeatures, nil)
			if err == nil && (len(v) != 8 || binary.LittleEndian.Uint64(v) != netdev.OfferedFeatures) {
				err = fmt.Errorf("GET_FEATURES answered %x", v)
			}
			asked <- err
		}()
		time.Sleep(20 * time.Millisecond)
	}
	oc, nc := handoffPair(t)
	succ := newDataplane(t)
	oldDone, rep := oldSide(old, oc, during)
	if err := newSide(t, succ, nc, cfgs, twoPhase); err != nil {
		t.Fatal("successor: ", err)
	}
	if err := <-oldDone; err != nil {
		t.Fatal("old: ", err)
	}
	if err := <-asked; err != nil {
		t.Fatal("a request sent during the pause: ", err)
	}
	atHandover := s.Sent()
	waitStream(t, s)
	t.Logf("%s: handover of %d ports after %d of %d frames, paused %v", role, rep.Ports, atHandover, n, rep.Pause)
	if rep.Ports != 3 {
		t.Errorf("handed %d ports, want 3", rep.Ports)
	}
	if len(old.Stats()) != 0 {
		t.Errorf("the old dataplane still has %d ports", len(old.Stats()))
	}
	for name := range cfgs {
		p, ok := succ.Port(name)
		if !ok {
			t.Fatalf("successor has no port %q", name)
		}
		if !p.Connected() || p.Connects() != 1 {
			t.Errorf("port %s on the successor: connected %v after %d connects; want the adopted session only", name, p.Connected(), p.Connects())
		}
	}
	if got := rxPackets(portStats(t, succ, "b")); got == 0 || got > uint64(n) {
		t.Errorf("the successor delivered %d frames to b; want the stream's rest", got)
	}
	// The sessions go on: both directions, and the control path.
	learn(t, a, b, 2)
	if v, err := a.CtrlGet(vhostuser.ReqGetQueueNum, nil); err != nil || binary.LittleEndian.Uint64(v) != 2 {
		t.Errorf("GET_QUEUE_NUM after the handover: %x, %v", v, err)
	}
}

// TestHandoverRefusedGoesOnInOldProcess: a successor that refuses half
// way (a port it would set up differently) leaves every port served by the
// old dataplane, the stream whole; it kept none of the ports it had
// adopted before refusing.
func TestHandoverRefusedGoesOnInOldProcess(t *testing.T) {
	for _, ph := range phases {
		t.Run(ph.name, func(t *testing.T) { testHandoverRefused(t, ph.twoPhase) })
	}
}

func testHandoverRefused(t *testing.T, twoPhase bool) {
	old := newDataplane(t)
	cfgs := map[string]netdev.Config{}
	a := attach(t, old, "a", netdev.RoleServer, 2, cfgs)
	b := attach(t, old, "b", netdev.RoleServer, 2, cfgs)
	learn(t, a, b, 2)
	s := startStream(a, b, 4000)
	waitSent(t, s, 1000)
	bad := map[string]netdev.Config{"a": cfgs["a"], "b": cfgs["b"]}
	cb := bad["b"]
	cb.QueuePairs = 1 // ports go in name order: a is adopted, then b is refused
	bad["b"] = cb
	oc, nc := handoffPair(t)
	succ := newDataplane(t)
	oldDone, _ := oldSide(old, oc, nil)
	err := newSide(t, succ, nc, bad, twoPhase)
	if err == nil || !errors.Is(<-oldDone, handoff.ErrRefused) {
		t.Fatalf("successor %v; the old side must see the refusal", err)
	}
	t.Logf("refused: %v", err)
	waitStream(t, s)
	if len(succ.Stats()) != 0 {
		t.Errorf("the refusing successor kept %d ports", len(succ.Stats()))
	}
	for _, name := range []string{"a", "b"} {
		p, ok := old.Port(name)
		if !ok || !p.Connected() || p.Connects() != 1 {
			t.Errorf("port %s on the old dataplane: present %v; want it connected, never reconnected", name, ok)
		}
	}
	if _, err := os.Stat(cfgs["a"].Socket); err != nil {
		t.Errorf("the successor's release removed a's socket: %v", err)
	}
	learn(t, a, b, 2)
}

// TestHandoverWithTapUplink (#17): the tap uplink goes with the ports. A
// numbered stream from a guest on the other node comes in through the
// tap while the port and the tap's queues move to a successor: every
// frame arrives once and in order (the old workers stop reading the tap
// before the rings freeze; what came in meanwhile waits in the tap's
// queues for the successor), the tap is the same interface, still on its
// bridge, and the old dataplane reads none of it afterwards.
func TestHandoverWithTapUplink(t *testing.T) {
	b := newUplinkBed(t)
	old := uplinkDataplane(t, b.node)
	peer := uplinkDataplane(t, b.peer)
	opt := PortOptions{Network: "red", Uplink: true}
	cfgs := map[string]netdev.Config{"a": {Name: "a", Socket: addPortOpt(t, old, "a", opt), Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500}}
	a := dial(t, cfgs["a"].Socket, frontend.Config{})
	bb := dial(t, addPortOpt(t, peer, "b", opt), frontend.Config{})
	ifindex := func() string {
		return strings.Fields(nettest.Run(t, "ip", "-n", b.node, "-o", "link", "show", "vmqtap0"))[0]
	}
	before := ifindex()
	// each side learns the other behind its uplink (a fresh bridge port
	// may take a moment: a's broadcast goes again until b has it)
	bcast := [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	for i := 0; ; i++ {
		if err := a.Send(0, ipFrame(bcast, macA)); err != nil {
			t.Fatal(err)
		}
		if fr, err := bb.Recv(0, 300*time.Millisecond); err == nil && isFrom(macA)(fr) {
			break
		}
		if i == 20 {
			t.Fatal("a's broadcast never reached b")
		}
	}
	if err := bb.Send(0, ipFrame(macA, macB)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, a, "b's unicast at a", isFrom(macB))

	const n = 3000
	s := frontend.StartStreamMatching(bb, a, n, numberedIP, isNumbered)
	waitSent(t, s, n/3)
	oc, nc := handoffPair(t)
	oldDone, rep := oldSide(old, oc, nil)
	succ, err := newSideBuilt(t, nc, cfgs, map[string]PortOptions{"a": opt}, true, func(st *handoff.State, fds []int) (*Dataplane, error) {
		if st.Uplink == nil || st.Uplink.Name != "vmqtap0" || len(st.Uplink.Queues) != 2 {
			return nil, fmt.Errorf("handed uplink %+v, want vmqtap0 with 2 queues", st.Uplink)
		}
		var d *Dataplane
		var err error
		nettest.In(t, b.node, func() {
			d, err = New(Config{CPUs: []int{0, 1}, Logger: testLogger(t), Uplink: &tap.Config{Name: "vmqtap0", Attach: "br0"},
				Handed: &HandedUplink{Uplink: st.Uplink, FDs: fds}})
		})
		if err == nil {
			t.Cleanup(d.Close)
		}
		return d, err
	})
	if err != nil {
		t.Fatal("successor: ", err)
	}
	if err := <-oldDone; err != nil {
		t.Fatal("old: ", err)
	}
	atHandover := s.Sent()
	waitStream(t, s)
	t.Logf("handover of %d port and the tap after %d of %d frames, paused %v", rep.Ports, atHandover, n, rep.Pause)
	if got := ifindex(); got != before {
		t.Errorf("the tap is interface %s after the handover, %s before: it must be the same one", got, before)
	}
	if out := nettest.Run(t, "ip", "-n", b.node, "-d", "link", "show", "vmqtap0"); !strings.Contains(out, "master br0") || !strings.Contains(out, ",UP,") {
		t.Errorf("tap after the handover:\n%s", out)
	}
	ost, _ := old.UplinkStats()
	nst, _ := succ.UplinkStats()
	if nst.RxPackets == 0 || !nst.Healthy {
		t.Errorf("the successor's uplink: %+v; want the stream's rest", nst)
	}
	// the old one reads nothing any more; the successor sends too
	rx := ost.RxPackets
	if err := a.Send(0, ipFrame(macB, macA)); err != nil {
		t.Fatal(err)
	}
	recvMatching(t, bb, "a's unicast at b through the adopted tap", isFrom(macA))
	s2 := frontend.StartStreamMatching(bb, a, 200, numberedIP, isNumbered)
	waitStream(t, s2)
	if ost, _ = old.UplinkStats(); ost.RxPackets != rx {
		t.Errorf("the old dataplane read %d frames from the tap after the handover", ost.RxPackets-rx)
	}
}

// numberedIP is a numbered frame from b to a with a valid IP header
// checksum: a bridge with br_netfilter drops it otherwise.
func numberedIP(i int) []byte {
	f := numbered(macA, macB, i)
	binary.BigEndian.PutUint16(f[24:], nettest.Checksum(f[14:34]))
	return f
}

// isNumbered: b's numbered frames, not what the kernels on the path send.
func isNumbered(f []byte) bool {
	return isFrom(macB)(f) && len(f) > 8 && string(f[len(f)-8:len(f)-4]) == "hold"
}
