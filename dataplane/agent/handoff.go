package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// An upgrade without a gap (#17, docs/architecture.md "Handing a live port
// to a successor"): a new agent starting on a state directory where an
// old one still runs asks it, over handoff.sock, for every live port; the
// old one parks and freezes them and sends them; the new one adopts them
// all, unserved, answers Taken, and serves them once the old one has let
// go (Released), or has died. The old one then serves nothing (no API, no
// metrics, not ready) until it is stopped.
//
// dataplane.lock says who may serve: the old process takes it when a
// handoff begins and lets go of it only when it commits (or dies). A
// successor that heard no Released serves only if it can take the lock:
// otherwise the old process went back to serving, and the successor lets
// go of everything it adopted.

// PodEnv names the environment variable with the pod's UID (the chart
// sets it from the downward API).
const PodEnv = "POD_UID"

const (
	handoffName = "handoff.sock"
	lockName    = "dataplane.lock"
	// handoffWait bounds how long the old process waits for Taken; the
	// successor answers within handoffWait-handoffMargin or refuses.
	handoffWait   = 15 * time.Second
	handoffMargin = 3 * time.Second
	// pauseBound bounds how long a session may take to reach a message
	// boundary before the handoff gives up.
	pauseBound = 2 * time.Second
	// commitWait bounds how long the old process keeps its rings stopped
	// waiting for Taken in a two-phase handoff (the successor prepared
	// everything but the rings' positions); the successor answers within
	// commitWait-commitMargin or refuses.
	commitWait   = 3 * time.Second
	commitMargin = time.Second
)

// Handoff is the last handoff this process took part in, for vhostmqctl.
type Handoff struct {
	At            time.Time
	Role          string // "adopted" (this process took the ports) or "handed" (it gave them)
	Peer          string // the other process's build
	Ports         int
	Pause         time.Duration // handed: the rings' freeze to Taken; adopted: the freeze to serving (two-phase), else hello to serving
	Adopted       int           // ports whose live session this process adopted
	CreatedAfresh int           // stored ports created afresh instead (their frontends reconnect)
}

// Version, when set at link time (-ldflags -X ...agent.Version=...), is
// what Build reports.
var Version string

// Build identifies this binary in a handoff: Version, else the VCS
// revision.
func Build() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "-dirty"
		}
		if rev != "" {
			return rev
		}
		return bi.Main.Version
	}
	return "unknown"
}

// stateLock is dataplane.lock, taken with flock: released by the kernel
// when its holder dies.
type stateLock struct {
	mu   sync.Mutex
	path string
	f    *os.File
}

// try takes the lock if it is free (or already ours).
func (l *stateLock) try() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		return nil
	}
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return err
	}
	l.f = f
	return nil
}

// wait takes the lock, trying until timeout.
func (l *stateLock) wait(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := l.try()
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (l *stateLock) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close() // drops the flock
		l.f = nil
	}
}

// Takeover is the successor's side of a handoff in progress, from
// AskPredecessor to the agent's Serve: the state the predecessor sent,
// and what became of each handed port.
type Takeover struct {
	c       *handoff.Conn
	log     *slog.Logger
	st      handoff.State
	fds     []int
	byName  map[string]int // handed port name -> index in st.Ports, until adopted
	index   map[string]int // handed port name -> index in st.Ports
	adopted []string
	fresh   int
	t0      time.Time
}

// AskPredecessor asks an agent still running on the state directory for
// its ports, before this process builds its dataplane (which adopts the
// handed uplink: Uplink). No one answering is no predecessor (nil, nil);
// one that answers and then fails the exchange is an error: it goes on
// serving, and this process must not start beside it. Pass the result to
// New (Config.Asked, Config.Takeover), or Refuse it.
func AskPredecessor(stateDir string, log *slog.Logger) (*Takeover, error) {
	if log == nil {
		log = slog.Default()
	}
	t, err := ask(stateDir, log, true)
	if errors.Is(err, errHelloRejected) {
		// A predecessor from before two-phase handoffs rejects the
		// field and closes, having touched nothing: ask it its way.
		log.Info("handoff: the predecessor does not know two-phase handoffs; asking it in one phase")
		t, err = ask(stateDir, log, false)
	}
	return t, err
}

// errHelloRejected: the predecessor closed the connection without
// answering the hello.
var errHelloRejected = errors.New("the predecessor closed the connection without answering the hello")

func ask(stateDir string, log *slog.Logger, twoPhase bool) (*Takeover, error) {
	path := filepath.Join(stateDir, handoffName)
	nc, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil, nil
	}
	c := handoff.NewConn(nc.(*net.UnixConn))
	t := &Takeover{c: c, log: log, t0: time.Now(), byName: map[string]int{}, index: map[string]int{}}
	log.Info("a dataplane is running on this state directory: asking it for its ports", "socket", path, "twoPhase", twoPhase)
	nc.SetDeadline(time.Now().Add(handoffWait))
	if err := c.Send(handoff.KindHello, handoff.Hello{PID: os.Getpid(), Build: Build(), Pod: os.Getenv(PodEnv), TwoPhase: twoPhase}, nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("handoff: hello: %w", err)
	}
	fds, err := c.Recv(handoff.KindState, &t.st)
	if err != nil {
		c.Close()
		if twoPhase && errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("handoff: %w (%v)", errHelloRejected, err)
		}
		return nil, fmt.Errorf("handoff: %w", err)
	}
	nc.SetDeadline(time.Time{})
	t.fds = fds
	if err := t.st.Check(len(fds)); err != nil {
		t.Refuse(nil, err)
		return nil, fmt.Errorf("handoff: %w", err)
	}
	if t.st.Running && !twoPhase {
		err := errors.New("state: running rings in a one-phase handoff")
		t.Refuse(nil, err)
		return nil, fmt.Errorf("handoff: %w", err)
	}
	for i, hp := range t.st.Ports {
		spec, err := dataplane.SpecOf(hp)
		if err != nil {
			t.Refuse(nil, err)
			return nil, fmt.Errorf("handoff: ports[%d]: %w", i, err)
		}
		t.byName[spec.Name] = i
		t.index[spec.Name] = i
	}
	log.Info("handoff: the predecessor sent its ports", "build", t.st.Build, "ports", len(t.st.Ports), "fds", len(fds),
		"running", t.st.Running)
	return t, nil
}

// Uplink is the uplink the predecessor handed over, for dataplane.Config.
func (t *Takeover) Uplink() *dataplane.HandedUplink {
	if t == nil || t.st.Uplink == nil {
		return nil
	}
	return &dataplane.HandedUplink{Uplink: t.st.Uplink, FDs: t.fds}
}

// Refuse ends a takeover: the ports adopted into dp (nil: none yet) are
// let go without touching a session, the predecessor is told why and goes
// on serving.
func (t *Takeover) Refuse(dp *dataplane.Dataplane, why error) {
	for _, name := range t.adopted {
		dp.RemovePort(name)
	}
	t.log.Warn("handoff refused: the predecessor goes on serving", "why", why)
	t.c.Refuse(why.Error())
	t.close()
}

func (t *Takeover) close() {
	for i, fd := range t.fds {
		if fd >= 0 {
			unix.Close(fd)
			t.fds[i] = -1
		}
	}
	t.c.Close()
}

// adopt creates a stored port from its handed session, if one was handed
// (false if not: the caller creates it afresh).
func (t *Takeover) adopt(name string, add func(hp handoff.Port, fds []int) error) (bool, error) {
	i, ok := t.byName[name]
	if !ok {
		t.fresh++
		return false, nil
	}
	delete(t.byName, name)
	if err := add(t.st.Ports[i], t.fds); err != nil {
		return true, err
	}
	t.adopted = append(t.adopted, name)
	return true, nil
}

// finish completes the takeover once every port is adopted: in a
// two-phase handoff Ready, then the rings' final positions (Final); each
// adopted port positioned; Taken, then Released (or the predecessor's
// death), then the adopted ports are served. An error leaves nothing
// adopted and the predecessor serving.
func (t *Takeover) finish(a *Agent) error {
	defer t.close()
	for name := range t.byName {
		// The predecessor had it, this process has no such port: its
		// session ends with the predecessor.
		a.log.Warn("handoff: a handed port is not in this process's ports; its frontend loses it", "port", name)
	}
	positions := func(i int) []handoff.Position { return netdev.Positions(t.st.Ports[i]) }
	networks, deadline, margin := t.st.Networks, t.st.Deadline, handoffMargin
	var frozenAt time.Time
	if t.st.Running {
		if err := t.refuseLate(a, deadline, margin); err != nil {
			return err
		}
		if err := t.c.Send(handoff.KindReady, struct{}{}, nil); err != nil {
			t.Refuse(a.dp, err)
			return fmt.Errorf("handoff: ready: %w", err)
		}
		var fin handoff.Final
		t.c.SetDeadline(deadline.Add(commitWait))
		if _, err := t.c.Recv(handoff.KindFinal, &fin); err != nil {
			t.Refuse(a.dp, err)
			return fmt.Errorf("handoff: %w", err)
		}
		t.c.SetDeadline(time.Time{})
		if err := t.st.CheckFinal(&fin); err != nil {
			t.Refuse(a.dp, err)
			return fmt.Errorf("handoff: %w", err)
		}
		positions = func(i int) []handoff.Position { return fin.Ports[i].Vrings }
		networks, deadline, margin, frozenAt = fin.Networks, fin.Deadline, commitMargin, fin.FrozenAt
	}
	for _, name := range t.adopted {
		if err := a.dp.PositionAdopted(name, positions(t.index[name])); err != nil {
			t.Refuse(a.dp, err)
			return fmt.Errorf("handoff: %w", err)
		}
	}
	if _, err := a.dp.LearnHandedMACs(networks); err != nil {
		a.log.Warn("handoff: the learned addresses were not taken over; the switch learns them again", "err", err)
	}
	if err := t.refuseLate(a, deadline, margin); err != nil {
		return err
	}
	if err := t.c.Send(handoff.KindTaken, struct{}{}, nil); err != nil {
		t.Refuse(a.dp, err)
		return fmt.Errorf("handoff: taken: %w", err)
	}
	released := true
	if _, err := t.c.Recv(handoff.KindReleased, &struct{}{}); err != nil {
		released = false
		a.log.Warn("handoff: no Released from the predecessor; serving only if it let go of the lock", "err", err)
	}
	if err := a.lock.wait(handoffMargin); err != nil {
		for _, name := range t.adopted {
			a.dp.RemovePort(name)
		}
		return fmt.Errorf("handoff: the predecessor still holds %s (it went back to serving): %w", lockName, err)
	}
	n := a.dp.StartAdopted()
	a.handedBy = t.st.Pod
	sinceHello := time.Since(t.t0)
	pause := sinceHello
	attrs := []any{"adopted", n, "created afresh", t.fresh, "released", released, "twoPhase", t.st.Running, "sinceHello", sinceHello.String()}
	if !frozenAt.IsZero() {
		pause = time.Since(frozenAt)
		attrs = append(attrs, "sinceFreeze", pause.String())
	}
	a.setLastHandoff(Handoff{At: time.Now(), Role: "adopted", Peer: t.st.Build, Ports: len(t.st.Ports), Pause: pause,
		Adopted: n, CreatedAfresh: t.fresh})
	a.log.Info("handoff done: serving the predecessor's ports", attrs...)
	return nil
}

// refuseLate refuses the takeover when less than margin is left before
// the predecessor's deadline: it may give up waiting before the answer
// arrives.
func (t *Takeover) refuseLate(a *Agent, deadline time.Time, margin time.Duration) error {
	if left := time.Until(deadline); left < margin {
		err := fmt.Errorf("handoff: %v left before the predecessor's deadline, under the %v margin", left.Round(time.Millisecond), margin)
		t.Refuse(a.dp, err)
		return err
	}
	return nil
}

// serveHandoffs answers successors on handoff.sock until the process hands
// its ports over or stop closes.
func (a *Agent) serveHandoffs(ln *net.UnixListener, stop <-chan struct{}) {
	go func() {
		<-stop
		if a.handedOver.Load() {
			// The path is the successor's socket by now (it listens on it
			// once it serves, which may be before this runs): keep it.
			ln.SetUnlinkOnClose(false)
		}
		ln.Close()
	}()
	for {
		nc, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		if done := a.handOver(handoff.NewConn(nc)); done {
			return
		}
	}
}

// handOver answers one successor; true once the ports are its.
func (a *Agent) handOver(c *handoff.Conn) bool {
	defer c.Close()
	var h handoff.Hello
	if _, err := c.Recv(handoff.KindHello, &h); err != nil {
		a.log.Warn("handoff: a connection that did not say hello", "err", err)
		return false
	}
	a.log.Info("handoff: a successor asks for the ports", "pid", h.PID, "build", h.Build, "pod", h.Pod, "twoPhase", h.TwoPhase)
	if a.handedBy != "" && h.Pod == a.handedBy {
		// The container of the pod being replaced restarted before the
		// pod was deleted: the ports stay here.
		c.Refuse(fmt.Sprintf("pod %s handed its ports to this process (pod %s) and is being replaced: it takes nothing back", h.Pod, os.Getenv(PodEnv)))
		return false
	}
	if err := a.lock.try(); err != nil {
		c.Refuse(fmt.Sprintf("this process cannot take %s: %v", lockName, err))
		return false
	}
	a.mu.Lock()
	a.handing = true
	err := a.saveLocked() // the successor reads the ports from the state file
	a.mu.Unlock()
	if err != nil {
		a.endHanding()
		c.Refuse("saving the state file: " + err.Error())
		return false
	}
	deadline := time.Now().Add(handoffWait)
	send := func(st *handoff.State, fds []int) error {
		st.Deadline = deadline
		st.Pod = os.Getenv(PodEnv)
		if err := c.Send(handoff.KindState, st, fds); err != nil {
			return err
		}
		c.SetDeadline(deadline)
		if h.TwoPhase {
			_, err := c.Recv(handoff.KindReady, &struct{}{})
			return err
		}
		_, err := c.Recv(handoff.KindTaken, &struct{}{})
		return err
	}
	var commit func(*handoff.Final) error
	if h.TwoPhase {
		commit = func(fin *handoff.Final) error {
			fin.Deadline = time.Now().Add(commitWait)
			c.SetDeadline(fin.Deadline)
			if err := c.Send(handoff.KindFinal, fin, nil); err != nil {
				return err
			}
			_, err := c.Recv(handoff.KindTaken, &struct{}{})
			return err
		}
	}
	// Committed: nothing here touches the ports again. Let go of the lock
	// and tell the successor to serve at once; then of what it takes
	// next (the API socket, metrics, this socket), which it waits for.
	committed := func() {
		a.handedOver.Store(true)
		a.lock.release()
		c.SetDeadline(time.Now().Add(time.Second))
		if err := c.Send(handoff.KindReleased, struct{}{}, nil); err != nil {
			a.log.Warn("handoff: Released not sent; the successor serves once it sees the lock free", "err", err)
		}
	}
	rep, err := a.dp.Handover(Build(), pauseBound, dataplane.Exchange{Send: send, Commit: commit, Committed: committed})
	if err != nil {
		a.endHanding()
		c.Refuse(err.Error())
		a.log.Warn("handoff refused or broken: this process goes on serving every port", "err", err)
		return false
	}
	a.stopServing()
	a.setLastHandoff(Handoff{At: time.Now(), Role: "handed", Peer: h.Build, Ports: rep.Ports, Pause: rep.Pause})
	a.log.Info("handoff done: the successor serves every port; this process now waits to be stopped",
		"ports", rep.Ports, "pause", rep.Pause.String(), "successorPID", h.PID)
	return true
}

func (a *Agent) endHanding() {
	a.mu.Lock()
	a.handing = false
	a.mu.Unlock()
}

func (a *Agent) setLastHandoff(h Handoff) {
	a.mu.Lock()
	a.lastHandoff = &h
	a.mu.Unlock()
}

// HandedOver reports whether this process gave its ports to a successor:
// it serves nothing then (no stats file either) and waits to be stopped.
func (a *Agent) HandedOver() bool { return a.handedOver.Load() }

// LastHandoff returns the last handoff this process took part in.
func (a *Agent) LastHandoff() (Handoff, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lastHandoff == nil {
		return Handoff{}, false
	}
	return *a.lastHandoff, true
}

// listenHandoff makes handoff.sock (a stale one of a dead process is
// replaced; the caller already asked whoever answered on it).
func listenHandoff(dir string) (*net.UnixListener, error) {
	path := filepath.Join(dir, handoffName)
	os.Remove(path)
	old := umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	umask(old)
	if err != nil {
		return nil, fmt.Errorf("handoff socket: %w", err)
	}
	return ln, nil
}

// GetHandoff implements the API.
func (a *Agent) GetHandoff(context.Context, *agentv1.GetHandoffRequest) (*agentv1.Handoff, error) {
	out := &agentv1.Handoff{Build: Build(), Pod: os.Getenv(PodEnv)}
	h, ok := a.LastHandoff()
	if !ok {
		return out, nil
	}
	out.Happened = true
	out.TimeUnixNano = h.At.UnixNano()
	out.Role, out.PeerBuild = h.Role, h.Peer
	out.Ports, out.Adopted, out.CreatedAfresh = uint32(h.Ports), uint32(h.Adopted), uint32(h.CreatedAfresh)
	out.PauseUs = uint32(min(h.Pause.Microseconds(), math.MaxUint32))
	return out, nil
}
