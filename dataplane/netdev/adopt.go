package netdev

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Adopt creates a port from a predecessor process's export (Export, sent
// over dataplane/handoff) and takes over its live session: the same
// sockets, guest memory, eventfds and ring positions, so the frontend sees
// nothing happen. fds are the handoff message's; Adopt takes the ones st
// names (setting them to -1) and the caller closes the rest. A state this
// version cannot serve (a feature it does not offer, a ring it cannot
// map) is refused with an error and everything Adopt took is closed.
//
// The rings are mapped, not positioned: Position sets where each resumes,
// from the predecessor's last word (a two-phase handoff's Final, else the
// state's own bases). The port does not serve until Start: the caller
// first gives its rings to workers, as the kick hooks expect.
func Adopt(cfg Config, st handoff.Port, fds []int, log *slog.Logger, hooks Hooks) (*Port, error) {
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := newPort(cfg, log, hooks)
	var first *net.UnixConn
	take := func(i int) int {
		if i < 0 || i >= len(fds) {
			return -1
		}
		fd := fds[i]
		fds[i] = -1
		return fd
	}
	// Take every fd first, so that a refusal closes all of them.
	listenFD, connFD := take(st.Listener), take(st.Conn)
	regionFDs := make([]int, len(st.Regions))
	for i, r := range st.Regions {
		regionFDs[i] = take(r.FD)
	}
	logFD := -1
	if st.Log != nil {
		logFD = take(st.Log.FD)
	}
	type ringFDs struct{ kick, call, err int }
	rings := make([]ringFDs, len(st.Vrings))
	for i, v := range st.Vrings {
		rings[i] = ringFDs{take(v.Kick), take(v.Call), take(v.Err)}
	}
	var regions []*guestmem.Region // mapped, not yet in a table
	// fail closes what was taken and not yet used (those are -1 once
	// used), and undoes what was set up from the rest.
	fail := func(err error) (*Port, error) {
		for _, fd := range append([]int{listenFD, connFD, logFD}, regionFDs...) {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		for _, r := range rings {
			for _, fd := range []int{r.kick, r.call, r.err} {
				if fd >= 0 {
					unix.Close(fd)
				}
			}
		}
		if first != nil {
			first.Close()
		}
		if p.ln != nil {
			p.ln.SetUnlinkOnClose(false) // the predecessor still has it
			p.ln.Close()
		}
		for _, v := range p.vrings {
			closeFD(&v.kickFD)
			closeFD(&v.callFD)
			closeFD(&v.errFD)
		}
		if p.ctl.mem == nil {
			for _, r := range regions {
				r.Unmap()
			}
		}
		p.ctl.mem.Unmap()
		p.ctl.log.Unmap()
		return nil, fmt.Errorf("port %q: adopt: %w", cfg.Name, err)
	}
	if err := checkAdoptable(cfg, st); err != nil {
		return fail(err)
	}

	var err error
	if cfg.Role == RoleServer {
		if listenFD < 0 {
			return fail(errors.New("a server-role port needs its listening socket"))
		}
		p.ln, err = fileSocket[*net.UnixListener](listenFD, cfg.Socket, func(f *os.File) (any, error) { return net.FileListener(f) })
		listenFD = -1
		if err != nil {
			return fail(fmt.Errorf("listening socket: %w", err))
		}
		p.ln.SetUnlinkOnClose(true)
	}
	if connFD >= 0 {
		first, err = fileSocket[*net.UnixConn](connFD, cfg.Socket, func(f *os.File) (any, error) { return net.FileConn(f) })
		connFD = -1
		if err != nil {
			return fail(fmt.Errorf("vhost-user connection: %w", err))
		}
	}

	// Guest memory and the dirty log, mapped from the predecessor's fds.
	// A file the frontend shrank since the predecessor mapped it costs
	// this port its session (lost), not the whole takeover.
	var lost *pendingFault
	for i, r := range st.Regions {
		gr, err := guestmem.Map(regionFDs[i], r.GPA, r.Size, r.UVA, r.MmapOffset)
		unix.Close(regionFDs[i])
		regionFDs[i] = -1
		if errors.Is(err, guestmem.ErrShortFile) {
			if lost == nil {
				lost = &pendingFault{vring: -1, where: "handoff adoption", reason: FaultGuestMemory, revoked: fmt.Sprintf("regions[%d]: %v", i, err)}
			}
			continue
		}
		if err != nil {
			return fail(fmt.Errorf("regions[%d]: %w", i, err))
		}
		for range r.Adds {
			gr.AddAgain()
		}
		regions = append(regions, gr)
	}
	if lost != nil {
		for _, r := range regions {
			r.Unmap()
		}
		regions = nil
	}
	if len(regions) > 0 {
		t, err := guestmem.NewTable(regions)
		if err != nil {
			return fail(err)
		}
		p.ctl.mem = t
	}
	if st.Log != nil {
		p.ctl.log, err = guestmem.MapLog(logFD, st.Log.Size, st.Log.Offset)
		unix.Close(logFD)
		logFD = -1
		if errors.Is(err, guestmem.ErrShortFile) && lost == nil {
			lost = &pendingFault{vring: -1, where: "handoff adoption", reason: FaultDirtyLog, revoked: "log: " + err.Error()}
		} else if err != nil {
			return fail(fmt.Errorf("log: %w", err))
		}
	}

	c := &p.ctl
	c.features, c.featuresSet, c.protocol, c.status = st.Features, st.FeaturesSet, st.ProtocolFeatures, st.Status
	p.rxCaps.Store(uint32(offload.CapsFromFeatures(st.Features)))
	p.mtu.Store(int32(st.MTU))
	p.owned.Store(st.Owned)
	if first != nil {
		c.conn = vhostuser.NewConn(first) // serve knows it by this: an adopted session
		p.fault.live.Store(first)
		if lost != nil {
			lost.conn = first
			p.fault.first = lost
			p.log.Warn("adopted without its session: the frontend took back memory it shared; it reconnects", "revoked", lost.revoked)
		}
	}
	p.lockAll()
	for i, hv := range st.Vrings {
		v := p.vrings[hv.Index]
		v.num, v.base, v.started, v.enabled = hv.Num, hv.Base, hv.Started, hv.Enabled
		if hv.Addr != nil {
			v.addr = vhostuser.VringAddr{Index: uint32(hv.Index), Flags: hv.Addr.Flags, Desc: hv.Addr.Desc,
				Used: hv.Addr.Used, Avail: hv.Addr.Avail, Log: hv.Addr.Log}
			v.addrSet = true
		}
		v.kickFD, v.callFD, v.errFD = rings[i].kick, rings[i].call, rings[i].err
		rings[i] = ringFDs{-1, -1, -1}
		if v.kickFD >= 0 {
			unix.SetNonblock(v.kickFD, true)
		}
		if hv.Broken != "" {
			v.broken = errors.New(hv.Broken) // stays stopped until set up again
			continue
		}
		// Map the ring now, to refuse what cannot be served before the
		// predecessor lets go; it is served from Start on. In a two-phase
		// handoff the predecessor still serves it: its indexes move.
		if err := v.rebuild(c.mem, p.queueFeatures()); err != nil && !v.brokenBy(err, "handoff adoption") {
			p.unlockAll()
			return fail(fmt.Errorf("vrings[%d]: %w", i, err))
		}
		v.q = nil
	}
	p.unlockAll()
	return p, nil
}

// Position sets an adopted port's rings where the predecessor stopped
// them, at a burst boundary: every chain before Base completed, so the
// ring's used index in guest memory must equal it; a ring the predecessor
// found broken stays stopped until its frontend sets it up again. Before
// Start only.
func (p *Port) Position(pos []handoff.Position) error {
	p.lockAll()
	defer p.unlockAll()
	for i, hp := range pos {
		if hp.Index < 0 || hp.Index >= len(p.vrings) {
			return fmt.Errorf("port %q: position %d: ring %d is beyond the port's %d rings", p.cfg.Name, i, hp.Index, len(p.vrings))
		}
		v := p.vrings[hp.Index]
		v.base = hp.Base
		if hp.Broken != "" {
			v.broken = errors.New(hp.Broken)
			continue
		}
		if v.broken != nil {
			continue
		}
		if err := v.rebuild(p.ctl.mem, p.queueFeatures()); err != nil {
			if v.brokenBy(err, "handoff positioning") {
				continue // the session ends once served; the takeover goes on
			}
			return fmt.Errorf("port %q: vring %d: %w", p.cfg.Name, hp.Index, err)
		}
		if v.q != nil && v.q.LastAvail() != hp.Base {
			used := v.q.UsedIdx()
			v.q = nil
			return fmt.Errorf("port %q: vring %d: base %d but the ring's used index is %d: the predecessor was not stopped at a burst boundary",
				p.cfg.Name, hp.Index, hp.Base, used)
		}
		v.q = nil
	}
	return nil
}

// Positions are the rings' positions a one-phase handoff's state gives
// (its rings stopped when it was taken).
func Positions(st handoff.Port) []handoff.Position {
	out := make([]handoff.Position, len(st.Vrings))
	for i, v := range st.Vrings {
		out[i] = handoff.Position{Index: v.Index, Base: v.Base, Broken: v.Broken}
	}
	return out
}

// checkAdoptable refuses what this version cannot serve as it was set up.
func checkAdoptable(cfg Config, st handoff.Port) error {
	if st.Features&^OfferedFeatures != 0 {
		return fmt.Errorf("features: %#x include %#x, which this version does not offer", st.Features, st.Features&^OfferedFeatures)
	}
	if st.ProtocolFeatures&^OfferedProtocolFeatures != 0 {
		return fmt.Errorf("protocolFeatures: %#x include %#x, which this version does not offer",
			st.ProtocolFeatures, st.ProtocolFeatures&^OfferedProtocolFeatures)
	}
	if st.MTU < MinMTU || st.MTU > cfg.MTU {
		return fmt.Errorf("mtu: %d outside %d..%d (the port's MTU)", st.MTU, MinMTU, cfg.MTU)
	}
	if st.Conn < 0 && (st.FeaturesSet || len(st.Regions) > 0) {
		return errors.New("conn: a negotiated session without its connection")
	}
	seen := make(map[int]bool)
	for i, v := range st.Vrings {
		switch {
		case v.Index < 0 || v.Index >= 2*cfg.QueuePairs:
			return fmt.Errorf("vrings[%d].index: %d is beyond the port's %d queue pairs", i, v.Index, cfg.QueuePairs)
		case seen[v.Index]:
			return fmt.Errorf("vrings[%d].index: ring %d given twice", i, v.Index)
		case v.Num != 0 && (v.Num > virtio.MaxQueueSize || v.Num&(v.Num-1) != 0):
			return fmt.Errorf("vrings[%d].num: %d is not a power of 2 in 1..%d", i, v.Num, virtio.MaxQueueSize)
		case v.Addr != nil && v.Addr.Flags&^vhostuser.VringAddrFlagLog != 0:
			return fmt.Errorf("vrings[%d].addr.flags: unknown flags %#x", i, v.Addr.Flags)
		}
		seen[v.Index] = true
	}
	return nil
}

// fileSocket turns a received socket fd into a net type (which dups it;
// fd is closed either way).
func fileSocket[T any](fd int, name string, conv func(*os.File) (any, error)) (T, error) {
	var zero T
	f := os.NewFile(uintptr(fd), name)
	x, err := conv(f)
	f.Close()
	if err != nil {
		return zero, err
	}
	t, ok := x.(T)
	if !ok {
		if c, ok := x.(interface{ Close() error }); ok {
			c.Close()
		}
		return zero, fmt.Errorf("fd %d is a %T, not a unix socket", fd, x)
	}
	return t, nil
}

// StartAll begins serving adopted ports: their rings are set up again
// from where the predecessor stopped, their kicks watched (the caller gave
// the rings to workers) and their readiness announced, then each session
// goes on from the message its frontend sends next. Until then no worker
// can touch an adopted ring: it has no queue. The rings of all the ports
// start together, under all their locks, so that no frame moves from one
// port to another that is not served yet (it would be dropped).
func StartAll(ports []*Port) {
	unfreeze := FreezeAll(ports)
	for _, p := range ports {
		for _, v := range p.vrings {
			if v.kickFD >= 0 && v.IsTX() && p.hooks.WatchKick != nil {
				p.hooks.WatchKick(v, v.kickFD)
			}
			if v.broken == nil {
				p.rebuild(v) // the queue, its notification and log settings; announces it
			} else {
				p.changed(v)
			}
		}
	}
	firsts := make([]*net.UnixConn, len(ports))
	for i, p := range ports {
		if p.ctl.conn != nil {
			firsts[i] = p.ctl.conn.Raw()
		}
	}
	unfreeze()
	for i, p := range ports {
		p.start(firsts[i])
	}
}
