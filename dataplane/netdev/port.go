// Package netdev is the vhost-user net device: one Port per vhost-user
// socket. It owns the socket (listening or dialling, with endless
// reconnect), negotiates features, maps guest memory and sets up the vrings
// that the dataplane's workers then serve. It does not move packets.
package netdev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
)

// Role says which side of the socket the dataplane is.
type Role string

const (
	// RoleServer: the dataplane listens; QEMU (reconnect=1) or DPDK
	// virtio-user connects.
	RoleServer Role = "server"
	// RoleClient: QEMU listens (server=on, as KubeVirt configures it) and the
	// dataplane dials, again and again after every disconnect.
	RoleClient Role = "client"
)

// Config describes one port.
type Config struct {
	Name       string
	Socket     string
	Role       Role
	QueuePairs int
	MTU        int
	MAC        net.HardwareAddr // optional, informational
	// SocketOwner, when set, owns the socket a server-role port creates
	// (mode 0660), so that QEMU running as that user can connect.
	SocketOwner *Owner
	// HandshakeTimeout bounds how long a new connection may take to send
	// SET_OWNER (every frontend's first setting message); a connection
	// that has not is closed, so that nothing can hold a port by
	// connecting and saying nothing. 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// RequireSealedMemory refuses guest memory and dirty logs whose file
	// the frontend could shrink (seals.go).
	RequireSealedMemory bool
	// MaxMemory bounds the guest memory one session may map, in bytes: a
	// frontend can send sparse files of any size, and every byte mapped
	// takes address space from the one process that serves every port.
	// 0 means DefaultMaxMemory.
	MaxMemory uint64
	// ControlRate is the port's control budget in messages per second
	// (budget.go); 0 means ControlRate, negative no budget (a test that
	// churns rings on purpose).
	ControlRate int
}

// DefaultMaxMemory is the guest memory a session may map by default:
// 1 TiB, more than KubeVirt gives a VM on one node.
const DefaultMaxMemory = 1 << 40

// DefaultHandshakeTimeout is how long a frontend has to send SET_OWNER
// after connecting (QEMU and DPDK send it within milliseconds).
const DefaultHandshakeTimeout = 10 * time.Second

// Owner is a uid/gid pair.
type Owner struct{ UID, GID int }

// Limits on a port's configuration.
const (
	MinMTU = 68
	MaxMTU = 9702 // what OVS-DPDK and KubeVirt's binding accept
)

// Validate checks the configuration and names the bad field.
func (c *Config) Validate() error {
	switch {
	case c.Name == "":
		return errors.New("name: must not be empty")
	case c.Socket == "":
		return fmt.Errorf("port %q: socket: must not be empty", c.Name)
	case len(c.Socket) >= 108:
		return fmt.Errorf("port %q: socket: path is %d bytes, a unix socket path must be shorter than 108", c.Name, len(c.Socket))
	case c.Role != RoleServer && c.Role != RoleClient:
		return fmt.Errorf("port %q: role: %q is not server or client", c.Name, c.Role)
	case c.QueuePairs < 1 || c.QueuePairs > vhostuser.MaxQueuePairs:
		return fmt.Errorf("port %q: queuePairs: %d is outside 1..%d", c.Name, c.QueuePairs, vhostuser.MaxQueuePairs)
	case c.MTU < MinMTU || c.MTU > MaxMTU:
		return fmt.Errorf("port %q: mtu: %d is outside %d..%d", c.Name, c.MTU, MinMTU, MaxMTU)
	}
	return nil
}

// Hooks connect a port to the rest of the dataplane. Every hook is called
// with the vring's lock held and must not block.
type Hooks struct {
	// WatchKick and UnwatchKick tell the worker serving a TX vring which
	// eventfd to wait on; UnwatchKick runs before the fd is closed.
	WatchKick   func(v *Vring, fd int)
	UnwatchKick func(v *Vring, fd int)
	// Changed is called when a vring became ready or stopped being ready.
	Changed func(v *Vring)
	// RARP asks the switch to announce mac as living behind this port
	// (SEND_RARP after a live migration).
	RARP func(p *Port, mac net.HardwareAddr)
}

// OfferedFeatures are the virtio features every port offers, identical
// after every reconnect (a frontend that reconnects checks that they did
// not change).
//
// VIRTIO_F_IN_ORDER: every ring's buffers are used in the order they were
// made available (a burst's chains are served and returned in ring order;
// a held frame, a fault or a full destination gives the rest back
// untaken; RX buffers are taken and filled in order by whoever holds the
// ring), so a driver may rely on it: DPDK's virtio-user takes it by
// default and then runs its cheaper in-order paths (#29). QEMU offers it
// to a guest only with the device's in_order=on.
const OfferedFeatures uint64 = 1<<virtio.FVersion1 | 1<<virtio.FIndirectDesc | 1<<virtio.FEventIdx |
	1<<virtio.NetFMrgRxbuf | 1<<virtio.NetFMQ | 1<<virtio.NetFMTU | 1<<virtio.NetFGuestAnnounce |
	1<<virtio.FInOrder |
	1<<vhostuser.FeatureProtocolFeatures | 1<<vhostuser.FeatureLogAll | OffloadFeatures

// OffloadFeatures are the checksum and segmentation offloads offered, both
// ways: a guest may send partial checksums and GSO frames up to 64 KiB
// (HOST_*), and receives them whole when it accepts them (GUEST_*); the
// dataplane completes and segments in software for guests that do not
// (package offload). UFO is not offered (Linux dropped it); USO is (QEMU
// 8.2 and later pass it on; 7.2 masks it).
const OffloadFeatures uint64 = 1<<virtio.NetFCsum | 1<<virtio.NetFGuestCsum |
	1<<virtio.NetFHostTSO4 | 1<<virtio.NetFHostTSO6 | 1<<virtio.NetFHostECN | 1<<virtio.NetFHostUSO |
	1<<virtio.NetFGuestTSO4 | 1<<virtio.NetFGuestTSO6 | 1<<virtio.NetFGuestECN |
	1<<virtio.NetFGuestUSO4 | 1<<virtio.NetFGuestUSO6

// OfferedProtocolFeatures are the vhost-user protocol features offered.
const OfferedProtocolFeatures uint64 = 1<<vhostuser.ProtoMQ | 1<<vhostuser.ProtoReplyAck |
	1<<vhostuser.ProtoConfigureMemSlots | 1<<vhostuser.ProtoNetMTU | 1<<vhostuser.ProtoRARP |
	1<<vhostuser.ProtoStatus | 1<<vhostuser.ProtoLogSHMFD

// Port is one vhost-user net device.
type Port struct {
	cfg    Config
	log    *slog.Logger
	hooks  Hooks
	vrings []*Vring

	// session state, guarded by ctl (the connection goroutine is the only
	// writer; readers outside take the lock)
	ctl struct {
		sync.Mutex
		features    uint64
		featuresSet bool
		protocol    uint64
		mem         *guestmem.Table
		log         *guestmem.Log // SET_LOG_BASE's dirty log (live migration)
		status      uint8
		conn        *vhostuser.Conn
	}
	mtu atomic.Int32 // the MTU in force: the port's, or a smaller one QEMU set
	// rxCaps is the offload metadata the guest accepts on its RX side
	// (offload.Caps of the negotiated GUEST_* features), read per frame
	rxCaps atomic.Uint32

	connected atomic.Bool
	connects  atomic.Uint64
	// owned: the current connection sent SET_OWNER (its handshake is
	// done; a newer connection no longer replaces it)
	owned   atomic.Bool
	refused atomic.Uint64 // connections refused while another was established

	ln    *net.UnixListener // server role: the listening socket
	sus   suspender         // a handoff's pause of the session (handover.go)
	fault faults            // faults in the session's shared memory (fault.go)
	// budget bounds how fast control messages are handled (budget.go)
	budget         budget
	throttledCount atomic.Uint64

	cancel context.CancelFunc
	done   chan struct{}
}

// New creates a port and starts serving its socket in the background.
func New(cfg Config, log *slog.Logger, hooks Hooks) (*Port, error) {
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := newPort(cfg, log, hooks)
	if cfg.Role == RoleServer {
		ln, err := listen(cfg.Socket, cfg.SocketOwner)
		if err != nil {
			return nil, fmt.Errorf("port %q: %w", cfg.Name, err)
		}
		p.ln = ln
	}
	p.start(nil)
	return p, nil
}

func newPort(cfg Config, log *slog.Logger, hooks Hooks) *Port {
	p := &Port{cfg: cfg, log: log.With("port", cfg.Name), hooks: hooks, budget: newBudget(cfg.ControlRate), done: make(chan struct{})}
	p.mtu.Store(int32(cfg.MTU))
	for i := 0; i < 2*cfg.QueuePairs; i++ {
		p.vrings = append(p.vrings, newVring(p, i))
	}
	return p
}

// start serves the port's socket in the background, beginning with first
// (a session adopted from a predecessor process) when it is not nil.
func (p *Port) start(first *net.UnixConn) {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go p.routineSocket(ctx, first)
}

// Config returns the port's configuration.
func (p *Port) Config() Config { return p.cfg }

// Name returns the port's name.
func (p *Port) Name() string { return p.cfg.Name }

// Vrings returns the port's vrings (2 per queue pair).
func (p *Port) Vrings() []*Vring { return p.vrings }

// Connected reports whether a frontend is attached.
func (p *Port) Connected() bool { return p.connected.Load() }

// Connects counts frontend connections since the port was created.
func (p *Port) Connects() uint64 { return p.connects.Load() }

// MTU returns the MTU in force (the port's, or a smaller one QEMU set).
func (p *Port) MTU() int { return int(p.mtu.Load()) }

// Features returns the negotiated virtio features.
func (p *Port) Features() uint64 {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	return p.ctl.features
}

// RxOffload returns what the guest accepts on its RX side: partial
// checksums, GSO frames (offload.Caps, from the negotiated GUEST_*
// features; 0 before negotiation).
func (p *Port) RxOffload() offload.Caps { return offload.Caps(p.rxCaps.Load()) }

// Close stops serving, disconnects the frontend, releases guest memory and
// removes the socket file the port created.
func (p *Port) Close() {
	if p.cancel == nil { // adopted and never started: the sockets are still the predecessor's too
		if p.ln != nil {
			p.ln.SetUnlinkOnClose(false)
			p.ln.Close()
		}
		if p.ctl.conn != nil {
			p.ctl.conn.Close()
		}
		p.reset()
		return
	}
	p.cancel()
	<-p.done
}

func listen(path string, owner *Owner) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("socket: %s exists and is not a socket", path)
		}
		os.Remove(path) // stale socket of an earlier run
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if owner != nil {
		if err := os.Chown(path, owner.UID, owner.GID); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket: %w", err)
		}
		if err := os.Chmod(path, 0o660); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket: %w", err)
		}
	}
	return ln, nil
}

// routineSocket accepts (server) or dials (client) frontends, one session
// at a time, forever, until the port is closed.
func (p *Port) routineSocket(ctx context.Context, first *net.UnixConn) {
	defer close(p.done)
	if p.ln != nil {
		p.serveListener(ctx, p.ln, first)
	} else {
		if first != nil {
			p.serve(ctx, first)
		}
		p.dialForever(ctx)
	}
	p.reset()
}

// dialForever dials the frontend's socket (client role) and serves each
// connection until it ends, then dials again.
func (p *Port) dialForever(ctx context.Context) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if !p.sus.waitDial(ctx) {
			return
		}
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", p.cfg.Socket)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if p.connects.Load() == 0 && backoff == 50*time.Millisecond {
				p.log.Info("waiting for the frontend's socket", "socket", p.cfg.Socket, "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		p.serve(ctx, nc.(*net.UnixConn))
	}
}

// serveListener accepts frontends (server role). The port serves one
// session at a time, and never leaves a connection waiting unanswered: a
// new connection replaces the current one while that has not finished its
// handshake (a frontend that connected and said nothing, or one that died
// half way), and is closed at once, with a log line, while the current one
// is established, as QEMU's and DPDK's single-connection sockets do.
func (p *Port) serveListener(ctx context.Context, ln *net.UnixListener, first *net.UnixConn) {
	conns := make(chan *net.UnixConn)
	go p.acceptLoop(ctx, ln, conns)
	var cur *net.UnixConn
	var curDone chan struct{}
	var lastRefusalLog time.Time
	start := func(c *net.UnixConn) {
		cur, curDone = c, make(chan struct{})
		done := curDone
		go func() { p.serve(ctx, c); close(done) }()
	}
	if first != nil {
		start(first)
	}
	for {
		select {
		case <-ctx.Done():
			if cur != nil {
				<-curDone // serve ends with the context
			}
			return
		case <-curDone:
			cur, curDone = nil, nil
		case c := <-conns:
			if cur != nil && peerGone(cur) {
				<-curDone // its session sees the hang-up and ends
				cur, curDone = nil, nil
			}
			switch {
			case p.sus.suspended():
				// A handoff is under way: the successor takes the
				// listener; this frontend connects again to it.
				p.log.Info("connection closed during a handoff; the frontend reconnects to the successor", "socket", p.cfg.Socket)
				c.Close()
			case cur == nil:
				start(c)
			case !p.owned.Load():
				p.log.Warn("a newer frontend connection replaces one that has not finished its handshake",
					"socket", p.cfg.Socket, "connection", p.connects.Load())
				cur.Close()
				<-curDone
				start(c)
			default:
				c.Close()
				n := p.refused.Add(1)
				if time.Since(lastRefusalLog) >= 10*time.Second {
					lastRefusalLog = time.Now()
					p.log.Warn("refused a second frontend connection: the port serves one frontend at a time and its current one is established",
						"socket", p.cfg.Socket, "connection", p.connects.Load(), "refusedSoFar", n)
				}
			}
		}
	}
}

// peerGone reports whether the other end of c hung up (a frontend that
// exited just before its successor connected).
func peerGone(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true
	}
	gone := false
	if err := rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(pfd, 0); err == nil && n > 0 {
			gone = pfd[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		}
	}); err != nil {
		return true // its session closed it already: it is ending
	}
	return gone
}

// acceptLoop hands every accepted connection to serveListener.
func (p *Port) acceptLoop(ctx context.Context, ln *net.UnixListener, conns chan<- *net.UnixConn) {
	go func() { <-ctx.Done(); ln.Close() }()
	backoff := 50 * time.Millisecond
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.log.Error("accept failed", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		select {
		case conns <- c:
		case <-ctx.Done():
			c.Close()
			return
		}
	}
}

// Refused counts connections refused because another frontend was
// established.
func (p *Port) Refused() uint64 { return p.refused.Load() }

// serve runs one frontend session. Any protocol error ends this session
// only; the port waits for the next one.
func (p *Port) serve(ctx context.Context, c *net.UnixConn) {
	// Shared memory is touched through code that catches its faults
	// (fault.go); should anything else of the session touch it, the
	// fault is a panic that handleSafely confines to the session.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	conn := vhostuser.NewConn(c)
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	p.ctl.Lock()
	adopted := p.ctl.conn != nil && p.ctl.conn.Raw() == c // Adopt set it up, state and all
	p.ctl.conn = conn
	p.ctl.Unlock()
	p.fault.live.Store(c)
	if !adopted {
		p.owned.Store(false)
	}
	p.connected.Store(true)
	n := p.connects.Add(1)
	if adopted {
		p.log.Info("frontend session adopted from the previous process", "socket", p.cfg.Socket, "role", p.cfg.Role, "established", p.owned.Load())
	} else {
		p.log.Info("frontend connected", "socket", p.cfg.Socket, "role", p.cfg.Role, "connection", n)
	}
	hs := p.handshakeTimeout()
	if !p.owned.Load() {
		c.SetReadDeadline(time.Now().Add(hs))
	}
	err := p.session(ctx, conn, c)
	conn.Close()
	p.connected.Store(false)
	faulted := p.reset()
	p.fault.live.CompareAndSwap(c, nil) // faults recorded from now on are no session's
	switch {
	case ctx.Err() != nil, faulted:
	case errors.Is(err, os.ErrDeadlineExceeded):
		p.log.Warn("frontend connection closed: no SET_OWNER within the handshake timeout", "socket", p.cfg.Socket,
			"connection", n, "timeout", hs.String())
	case errors.Is(err, net.ErrClosed), errors.Is(err, os.ErrClosed), isEOF(err):
		p.log.Info("frontend disconnected", "socket", p.cfg.Socket)
	default:
		p.log.Warn("frontend connection closed after an error", "socket", p.cfg.Socket, "err", err)
	}
}

func (p *Port) handshakeTimeout() time.Duration {
	if p.cfg.HandshakeTimeout > 0 {
		return p.cfg.HandshakeTimeout
	}
	return DefaultHandshakeTimeout
}

// session reads and handles the frontend's messages one at a time. It
// waits for each message before reading it, so that a handoff can pause
// it between two messages (suspender.next) and never inside one.
func (p *Port) session(ctx context.Context, conn *vhostuser.Conn, c *net.UnixConn) error {
	defer p.sus.end()
	for {
		if p.faulted() {
			return errFaulted
		}
		if err := p.sus.next(ctx, p, c); err != nil {
			return err
		}
		m, err := conn.ReadMessage()
		if err != nil {
			p.sus.done()
			return err
		}
		if !p.spend(ctx, m.Request) {
			m.CloseFDs()
			p.sus.done()
			return ctx.Err()
		}
		if m.Request == vhostuser.ReqSetOwner && !p.owned.Load() {
			p.owned.Store(true)
			c.SetReadDeadline(time.Time{}) // established: it may stay quiet for as long as it likes
		}
		err = p.handleSafely(conn, m)
		m.CloseFDs()
		p.sus.done()
		if err != nil {
			return err
		}
	}
}

// handleSafely confines a panic (a bug, or a fault in guest memory) to this
// connection.
func (p *Port) handleSafely(conn *vhostuser.Conn, m *vhostuser.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("vhost-user %s: handler panicked: %v", m.Request, r)
		}
	}()
	return p.handle(conn, m)
}

// reset returns the port to its unconnected state: every ring stopped, its
// eventfds closed, guest memory unmapped. It reports whether the session
// ended for a fault in its shared memory (fault.go), which it logged.
func (p *Port) reset() (faulted bool) {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	p.lockAll()
	for _, v := range p.vrings {
		v.stop()
		p.dropKick(v)
		closeFD(&v.callFD)
		closeFD(&v.errFD)
		v.num, v.base, v.addrSet, v.enabled, v.broken = 0, 0, false, false, nil
		v.addr = vhostuser.VringAddr{}
		p.changed(v)
	}
	old, oldLog := p.ctl.mem, p.ctl.log
	p.ctl.mem, p.ctl.log = nil, nil
	p.unlockAll()
	faulted = p.reportFault(old, oldLog)
	old.Unmap()
	oldLog.Unmap()
	p.ctl.features, p.ctl.featuresSet, p.ctl.protocol, p.ctl.status = 0, false, 0, 0
	p.rxCaps.Store(0)
	p.mtu.Store(int32(p.cfg.MTU))
	p.ctl.conn = nil
	return faulted
}

// lockAll takes every vring lock in the global order: TX vrings first.
func (p *Port) lockAll() {
	for i := 1; i < len(p.vrings); i += 2 {
		p.vrings[i].mu.Lock()
	}
	for i := 0; i < len(p.vrings); i += 2 {
		p.vrings[i].mu.Lock()
	}
}

func (p *Port) unlockAll() {
	for _, v := range p.vrings {
		v.mu.Unlock()
	}
}

func (p *Port) dropKick(v *Vring) {
	if v.kickFD >= 0 && v.IsTX() && p.hooks.UnwatchKick != nil {
		p.hooks.UnwatchKick(v, v.kickFD)
	}
	closeFD(&v.kickFD)
}

func (p *Port) changed(v *Vring) {
	if p.hooks.Changed != nil {
		p.hooks.Changed(v)
	}
}

func (p *Port) queueFeatures() virtq.Features {
	return virtq.Features{
		EventIdx:     p.ctl.features&(1<<virtio.FEventIdx) != 0,
		IndirectDesc: p.ctl.features&(1<<virtio.FIndirectDesc) != 0,
	}
}

// hdrLen is the virtio-net header size the negotiated features imply.
func (p *Port) hdrLen() int {
	if p.ctl.features&(1<<virtio.FVersion1|1<<virtio.NetFMrgRxbuf) != 0 {
		return virtio.NetHdrSize
	}
	return virtio.NetHdrLegacySize
}

// rebuild re-derives a vring's queue; caller holds ctl and the vring lock.
func (p *Port) rebuild(v *Vring) {
	v.hdrLen = p.hdrLen()
	v.mergeable = p.ctl.features&(1<<virtio.NetFMrgRxbuf) != 0
	if err := v.rebuild(p.ctl.mem, p.queueFeatures()); err != nil {
		if !v.brokenBy(err, "ring setup") {
			v.broken = err
			p.log.Warn("vring cannot be used", "vring", v.Index, "err", err)
		}
	} else if v.q != nil && !v.IsTX() {
		// Only a worker holding a frame for a full RX ring waits for
		// buffers, and it asks for the kick then (dataplane/hold.go):
		// spare the guest the kicks.
		v.guarded("ring setup", notifyOff)
	}
	p.setLog(v)
	p.changed(v)
}

// setLog turns dirty-page logging on for v's queue while LOG_ALL is
// negotiated and a log is mapped (live migration), off otherwise; the
// used ring is logged when SET_VRING_ADDR asked for it. Caller holds
// ctl and v's lock.
func (p *Port) setLog(v *Vring) {
	if v.q == nil {
		return
	}
	if p.ctl.features&(1<<vhostuser.FeatureLogAll) == 0 || p.ctl.log == nil {
		v.guarded("log flush", func(q *virtq.Queue) { q.SetLog(nil, false, 0) })
		return
	}
	l, logUsed, usedGPA := p.ctl.log, v.addr.Flags&vhostuser.VringAddrFlagLog != 0, v.addr.Log
	v.guarded("log flush", func(q *virtq.Queue) { q.SetLog(l, logUsed, usedGPA) })
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, unix.ECONNRESET)
}

func errRing(what string, addr uint64, err error) error {
	return fmt.Errorf("%s at frontend address %#x: %w", what, addr, err)
}
