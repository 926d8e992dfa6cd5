package netdev

import (
	"fmt"

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
func (p *Port) Freeze() (unfreeze func()) {
	p.ctl.Lock()
	p.lockAll()
	return func() {
		p.unlockAll()
		p.ctl.Unlock()
	}
}

// Export describes the frozen port's live session for a successor process
// (dataplane/handoff): the negotiated features, the memory table, the
// dirty log and every ring, with duplicates of their fds, which the caller
// owns (close them once they are sent). Spec, Listener and Conn are the
// caller's to fill; Listener and Conn are -1. The caller froze the port.
func (p *Port) Export() (handoff.Port, []int, error) {
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
	c := &p.ctl
	out := handoff.Port{Listener: -1, Conn: -1, Features: c.features, FeaturesSet: c.featuresSet,
		ProtocolFeatures: c.protocol, Status: c.status, MTU: p.MTU(), Owned: p.owned.Load()}
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
		hv := handoff.Vring{Index: v.Index, Num: v.num, Base: v.base, Started: v.started, Enabled: v.enabled}
		if v.q != nil {
			hv.Base = v.q.LastAvail()
		}
		if v.addrSet {
			a := v.addr
			hv.Addr = &handoff.Address{Flags: a.Flags, Desc: a.Desc, Used: a.Used, Avail: a.Avail, Log: a.Log}
		}
		if v.broken != nil {
			hv.Broken = v.broken.Error()
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
