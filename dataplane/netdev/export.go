package netdev

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/handoff"
)

// Freeze stops the port at a burst boundary for a handoff: it takes the
// session lock and every vring lock (a worker holds a vring's lock for one
// burst, so once Freeze returns none is inside one, and none starts
// another until unfreeze). Between bursts no chain is in hand: every chain
// taken from a TX ring has been completed, unused RX buffers were given
// back, a held frame was never taken. So each ring's next avail index is
// exact, and equals its used index.
func (p *Port) Freeze() (unfreeze func()) { return FreezeAll([]*Port{p}) }

// FreezeAll freezes several ports at once. A worker holds one TX vring
// and then one RX vring of any port, so the locks are taken in the global
// order across all the ports: every session lock, every TX vring, then
// every RX vring.
func FreezeAll(ports []*Port) (unfreeze func()) {
	for _, p := range ports {
		p.ctl.Lock()
	}
	for _, p := range ports {
		for i := 1; i < len(p.vrings); i += 2 {
			p.vrings[i].mu.Lock()
		}
	}
	for _, p := range ports {
		for i := 0; i < len(p.vrings); i += 2 {
			p.vrings[i].mu.Lock()
		}
	}
	return func() {
		for _, p := range ports {
			p.unlockAll()
			p.ctl.Unlock()
		}
	}
}

// Positions says where each ring of the frozen port stands, for the last
// message of a two-phase handoff (handoff.Final).
func (p *Port) Positions() []handoff.Position {
	out := make([]handoff.Position, len(p.vrings))
	for i, v := range p.vrings {
		out[i] = v.position()
	}
	return out
}

// position is where the ring stands; caller holds its lock.
func (v *Vring) position() handoff.Position {
	pos := handoff.Position{Index: v.Index, Base: v.base}
	if v.q != nil {
		pos.Base = v.q.LastAvail()
	}
	if v.broken != nil {
		pos.Broken = v.broken.Error()
	}
	return pos
}

// Export describes the frozen port's live session for a successor process
// (dataplane/handoff): the listening socket (server role), the vhost-user
// connection, the negotiated features, the memory table, the dirty log and
// every ring, with duplicates of their fds, which the caller owns (close
// them once they are sent). Spec is the caller's to fill. The caller
// suspended and froze the port.
func (p *Port) Export() (handoff.Port, []int, error) { return p.export(false) }

// ExportRunning is Export for the first message of a two-phase handoff:
// the caller suspended the port (its session parked) but its rings still
// run, so each ring's position is read under its lock and is only where
// the ring stood then.
func (p *Port) ExportRunning() (handoff.Port, []int, error) {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	return p.export(true)
}

func (p *Port) export(running bool) (handoff.Port, []int, error) {
	var fds []int
	fail := func(err error) (handoff.Port, []int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return handoff.Port{}, nil, fmt.Errorf("port %q: export: %w", p.cfg.Name, err)
	}
	// dup adds a duplicate of fd to fds and returns its index (-1 for -1)
	dup := func(fd int) (int, error) {
		if fd < 0 {
			return -1, nil
		}
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		fds = append(fds, d)
		return len(fds) - 1, nil
	}
	// dupSocket duplicates a socket's fd the same way
	dupSocket := func(sc syscall.Conn) (int, error) {
		rc, err := sc.SyscallConn()
		if err != nil {
			return -1, err
		}
		i, derr := -1, error(nil)
		if err := rc.Control(func(fd uintptr) { i, derr = dup(int(fd)) }); err != nil {
			return -1, err
		}
		return i, derr
	}
	c := &p.ctl
	out := handoff.Port{Listener: -1, Conn: -1, Features: c.features, FeaturesSet: c.featuresSet,
		ProtocolFeatures: c.protocol, Status: c.status, MTU: p.MTU(), Owned: p.owned.Load()}
	if p.ln != nil {
		i, err := dupSocket(p.ln)
		if err != nil {
			return fail(fmt.Errorf("listening socket: %w", err))
		}
		out.Listener = i
	}
	if c.conn != nil {
		i, err := dupSocket(c.conn.Raw())
		if err != nil {
			return fail(fmt.Errorf("vhost-user connection: %w", err))
		}
		out.Conn = i
	}
	if c.mem != nil {
		for _, r := range c.mem.Regions() {
			fd, off := r.File()
			i, err := dup(fd)
			if err != nil {
				return fail(fmt.Errorf("region gpa %#x: %w", r.GPA, err))
			}
			out.Regions = append(out.Regions, handoff.Region{GPA: r.GPA, UVA: r.UVA, Size: r.Size, MmapOffset: off, FD: i, Adds: r.Adds()})
		}
	}
	if c.log != nil {
		fd, size, off := c.log.File()
		i, err := dup(fd)
		if err != nil {
			return fail(fmt.Errorf("dirty log: %w", err))
		}
		out.Log = &handoff.Log{Size: size, Offset: off, FD: i}
	}
	for _, v := range p.vrings {
		hv := handoff.Vring{Index: v.Index, Num: v.num, Started: v.started, Enabled: v.enabled}
		if running {
			v.mu.Lock()
		}
		pos := v.position()
		if running {
			v.mu.Unlock()
		}
		hv.Base, hv.Broken = pos.Base, pos.Broken
		if v.addrSet {
			a := v.addr
			hv.Addr = &handoff.Address{Flags: a.Flags, Desc: a.Desc, Used: a.Used, Avail: a.Avail, Log: a.Log}
		}
		var err error
		for _, f := range []struct {
			fd  int
			dst *int
		}{{v.kickFD, &hv.Kick}, {v.callFD, &hv.Call}, {v.errFD, &hv.Err}} {
			if *f.dst, err = dup(f.fd); err != nil {
				return fail(fmt.Errorf("vring %d: %w", v.Index, err))
			}
		}
		out.Vrings = append(out.Vrings, hv)
	}
	return out, fds, nil
}
