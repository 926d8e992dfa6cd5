package netdev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
	"github.com/vhostmq/vhostmq/dataplane/offload"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// requestError is a well-formed request that cannot be honoured. With
// REPLY_ACK the frontend is told and the session goes on; without it the
// session ends, since the frontend would otherwise run on believing it
// succeeded.
type requestError struct{ err error }

func (e requestError) Error() string { return e.err.Error() }
func (e requestError) Unwrap() error { return e.err }

func failed(format string, args ...any) error { return requestError{fmt.Errorf(format, args...)} }

func malformed(m *vhostuser.Message, err error) error {
	return &vhostuser.ProtocolError{Request: m.Request, Reason: err.Error()}
}

// handle processes one message and sends its reply.
func (p *Port) handle(conn *vhostuser.Conn, m *vhostuser.Message) error {
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("vhost-user message", describe(m)...)
	}
	if m.Request == vhostuser.ReqResetOwner || m.Request == vhostuser.ReqResetDevice {
		// Deprecated RESET_OWNER: treat as "stop everything", as DPDK
		// does; reset takes the session lock itself. No reply: the
		// protocol features (REPLY_ACK) are reset too.
		p.reset()
		return nil
	}
	reply, hasReply, ack, err := p.dispatchLocked(m)

	var re requestError
	switch {
	case err == nil && hasReply:
		return conn.Reply(m, reply)
	case err == nil && ack:
		return conn.ReplyU64(m, 0)
	case err == nil:
		return nil
	case errors.As(err, &re) && ack && !hasReply:
		p.log.Warn("vhost-user request refused", "request", m.Request.String(), "err", err)
		return conn.ReplyU64(m, 1)
	default:
		return fmt.Errorf("%s: %w", m.Request, err)
	}
}

// dispatchLocked handles m under the session lock, which a panic in the
// handler releases too (handleSafely turns it into the session's end).
func (p *Port) dispatchLocked(m *vhostuser.Message) (reply []byte, hasReply, ack bool, err error) {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	reply, hasReply, err = p.dispatch(m)
	return reply, hasReply, p.ctl.protocol&(1<<vhostuser.ProtoReplyAck) != 0 && m.NeedReply(), err
}

func (p *Port) vring(m *vhostuser.Message, index uint32) (*Vring, error) {
	if index >= uint32(len(p.vrings)) {
		return nil, malformed(m, fmt.Errorf("vring %d (queue pair %d) is beyond port %q's %d queue pairs (vrings 0..%d); the frontend asks for more queues than the port was created with",
			index, index/2, p.cfg.Name, p.cfg.QueuePairs, len(p.vrings)-1))
	}
	return p.vrings[index], nil
}

func (p *Port) needProtocol(m *vhostuser.Message, bit uint) error {
	if p.ctl.protocol&(1<<bit) == 0 {
		return malformed(m, fmt.Errorf("protocol feature %d not negotiated", bit))
	}
	return nil
}

func u64(v uint64) []byte { return vhostuser.EncodeU64(nil, v) }

// dispatch applies one request to the session state. Caller holds ctl.
func (p *Port) dispatch(m *vhostuser.Message) (reply []byte, hasReply bool, err error) {
	switch m.Request {
	case vhostuser.ReqGetFeatures:
		return u64(OfferedFeatures), true, nil
	case vhostuser.ReqSetFeatures:
		return nil, false, p.setFeatures(m)
	case vhostuser.ReqSetOwner:
		return nil, false, nil
	case vhostuser.ReqGetProtocolFeatures:
		return u64(OfferedProtocolFeatures), true, nil
	case vhostuser.ReqSetProtocolFeatures:
		v, err := vhostuser.DecodeU64(m.Payload)
		if err != nil {
			return nil, false, malformed(m, err)
		}
		if v&^OfferedProtocolFeatures != 0 {
			return nil, false, malformed(m, fmt.Errorf("protocol features %#x include unoffered bits %#x", v, v&^OfferedProtocolFeatures))
		}
		p.ctl.protocol = v
		return nil, false, nil
	case vhostuser.ReqGetQueueNum:
		// Answered whenever MQ is offered (always), even before
		// SET_PROTOCOL_FEATURES: the spec asks only that MQ be in the
		// queried features, and DPDK answers it the same way.
		// QEMU compares this with queue *pairs* (net/vhost-user.c).
		return u64(uint64(p.cfg.QueuePairs)), true, nil
	case vhostuser.ReqGetMaxMemSlots:
		if err := p.needProtocol(m, vhostuser.ProtoConfigureMemSlots); err != nil {
			return nil, false, err
		}
		return u64(guestmem.MaxRegions), true, nil
	case vhostuser.ReqSetMemTable:
		return nil, false, p.setMemTable(m)
	case vhostuser.ReqAddMemReg, vhostuser.ReqRemMemReg:
		if err := p.needProtocol(m, vhostuser.ProtoConfigureMemSlots); err != nil {
			return nil, false, err
		}
		return nil, false, p.changeMemRegion(m)
	case vhostuser.ReqSetVringNum, vhostuser.ReqSetVringBase, vhostuser.ReqSetVringEnable, vhostuser.ReqGetVringBase:
		return p.vringState(m)
	case vhostuser.ReqSetVringAddr:
		a, err := vhostuser.DecodeVringAddr(m.Payload)
		if err != nil {
			return nil, false, malformed(m, err)
		}
		v, err := p.vring(m, a.Index)
		if err != nil {
			return nil, false, err
		}
		if a.Flags&^vhostuser.VringAddrFlagLog != 0 {
			return nil, false, malformed(m, fmt.Errorf("vring %d: unknown address flags %#x", a.Index, a.Flags))
		}
		v.mu.Lock()
		v.addr, v.addrSet = a, true
		p.rebuild(v)
		v.mu.Unlock()
		return nil, false, nil
	case vhostuser.ReqSetVringKick, vhostuser.ReqSetVringCall, vhostuser.ReqSetVringErr:
		return nil, false, p.setVringFD(m)
	case vhostuser.ReqSetLogBase:
		if err := p.needProtocol(m, vhostuser.ProtoLogSHMFD); err != nil {
			return nil, false, err
		}
		// The frontend waits for a reply (spec: LOG_SHMFD). A log that
		// cannot be mapped is refused: a NACK with REPLY_ACK, else the
		// session ends (running on unlogged would corrupt the migration).
		if err := p.setLogBase(m); err != nil {
			return nil, false, err
		}
		return nil, true, nil
	case vhostuser.ReqSetLogFD:
		// The log's "I wrote" notification; this backend never needs to
		// say more than the log itself does.
		m.CloseFDs()
		return nil, false, nil
	case vhostuser.ReqSendRARP:
		if err := p.needProtocol(m, vhostuser.ProtoRARP); err != nil {
			return nil, false, err
		}
		v, err := vhostuser.DecodeU64(m.Payload)
		if err != nil {
			return nil, false, malformed(m, err)
		}
		mac := net.HardwareAddr(u64(v)[:6])
		if p.hooks.RARP != nil {
			p.hooks.RARP(p, mac)
		}
		return nil, false, nil
	case vhostuser.ReqNetSetMTU:
		if err := p.needProtocol(m, vhostuser.ProtoNetMTU); err != nil {
			return nil, false, err
		}
		v, err := vhostuser.DecodeU64(m.Payload)
		if err != nil {
			return nil, false, malformed(m, err)
		}
		if v < MinMTU || v > uint64(p.cfg.MTU) {
			return nil, false, failed("mtu %d outside %d..%d (the port's MTU)", v, MinMTU, p.cfg.MTU)
		}
		p.mtu.Store(int32(v))
		return nil, false, nil
	case vhostuser.ReqSetStatus:
		if err := p.needProtocol(m, vhostuser.ProtoStatus); err != nil {
			return nil, false, err
		}
		v, err := vhostuser.DecodeU64(m.Payload)
		if err != nil {
			return nil, false, malformed(m, err)
		}
		p.ctl.status = uint8(v)
		return nil, false, nil
	case vhostuser.ReqGetStatus:
		if err := p.needProtocol(m, vhostuser.ProtoStatus); err != nil {
			return nil, false, err
		}
		return u64(uint64(p.ctl.status)), true, nil
	}
	return nil, false, malformed(m, errors.New("request not supported by this backend"))
}

// setLogBase maps the dirty log QEMU hands over when a migration starts
// (or resizes it) and gives every ring the new one; the old log is unmapped
// once no ring can touch it.
func (p *Port) setLogBase(m *vhostuser.Message) error {
	lg, err := vhostuser.DecodeLog(m.Payload)
	if err != nil {
		return malformed(m, err)
	}
	fd := m.TakeFD(0)
	if fd < 0 {
		return malformed(m, errors.New("SET_LOG_BASE without the log's file descriptor"))
	}
	defer unix.Close(fd)
	l, err := guestmem.MapLog(fd, lg.Size, lg.Offset)
	if err != nil {
		return failed("SET_LOG_BASE: %v", err)
	}
	if err := p.checkSealed("SET_LOG_BASE dirty log", l.Seals()); err != nil {
		l.Unmap()
		return failed("%w", err)
	}
	p.lockAll()
	old := p.ctl.log
	p.ctl.log = l
	for _, v := range p.vrings {
		p.setLog(v)
	}
	p.unlockAll()
	old.Unmap()
	p.log.Info("dirty-page log mapped (live migration)", "bytes", lg.Size, "pages", l.Pages())
	return nil
}

func (p *Port) setFeatures(m *vhostuser.Message) error {
	v, err := vhostuser.DecodeU64(m.Payload)
	if err != nil {
		return malformed(m, err)
	}
	if v&^OfferedFeatures != 0 {
		return malformed(m, fmt.Errorf("features %#x include unoffered bits %#x", v, v&^OfferedFeatures))
	}
	if p.ctl.featuresSet && p.ctl.features == v {
		return nil // QEMU repeats it once per queue pair (one vhost_dev each)
	}
	p.ctl.features, p.ctl.featuresSet = v, true
	p.rxCaps.Store(uint32(offload.CapsFromFeatures(v)))
	// Without protocol features a ring starts enabled (spec "Ring states").
	enableAll := v&(1<<vhostuser.FeatureProtocolFeatures) == 0
	p.lockAll()
	for _, v := range p.vrings {
		if enableAll {
			v.enabled = true
		}
		p.rebuild(v)
	}
	p.unlockAll()
	return nil
}

func (p *Port) vringState(m *vhostuser.Message) ([]byte, bool, error) {
	s, err := vhostuser.DecodeVringState(m.Payload)
	if err != nil {
		return nil, false, malformed(m, err)
	}
	v, err := p.vring(m, s.Index)
	if err != nil {
		return nil, false, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	switch m.Request {
	case vhostuser.ReqSetVringNum:
		if s.Num < 1 || s.Num > virtio.MaxQueueSize || s.Num&(s.Num-1) != 0 {
			return nil, false, malformed(m, fmt.Errorf("vring %d: size %d is not a power of 2 in 1..%d", s.Index, s.Num, virtio.MaxQueueSize))
		}
		v.num = int(s.Num)
	case vhostuser.ReqSetVringBase:
		if s.Num > 0xffff {
			return nil, false, malformed(m, fmt.Errorf("vring %d: base %d exceeds 16 bits (packed rings are not offered)", s.Index, s.Num))
		}
		v.q = nil // the new base wins over the running ring's position
		v.base = uint16(s.Num)
		// A ring's position across a stop, a migration or a restart is
		// what shows that nothing was lost or taken twice.
		p.log.Info("vring base set", "vring", s.Index, "base", v.base)
	case vhostuser.ReqSetVringEnable:
		// Accepted before SET_FEATURES too: QEMU disables the extra pairs at
		// device init, having seen PROTOCOL_FEATURES in GET_FEATURES.
		if s.Num > 1 {
			return nil, false, malformed(m, fmt.Errorf("vring %d: enable value %d is not 0 or 1", s.Index, s.Num))
		}
		v.enabled = s.Num == 1
		p.log.Debug("vring enable", "vring", s.Index, "enabled", v.enabled)
		p.changed(v)
		return nil, false, nil
	case vhostuser.ReqGetVringBase:
		// Stops the ring (spec "Ring states"): no more processing, kick and
		// call eventfds are dropped; the frontend resumes from base.
		base := v.stop()
		p.log.Info("vring stopped", "vring", s.Index, "base", base)
		p.dropKick(v)
		closeFD(&v.callFD)
		p.changed(v)
		return vhostuser.VringState{Index: s.Index, Num: uint32(base)}.Encode(nil), true, nil
	}
	p.rebuild(v)
	return nil, false, nil
}

func (p *Port) setVringFD(m *vhostuser.Message) error {
	x, err := vhostuser.DecodeU64(m.Payload)
	if err != nil {
		return malformed(m, err)
	}
	if x&^uint64(vhostuser.VringIndexMask|vhostuser.VringNoFD) != 0 {
		return malformed(m, fmt.Errorf("reserved bits set in %#x", x))
	}
	v, err := p.vring(m, uint32(x&vhostuser.VringIndexMask))
	if err != nil {
		return err
	}
	fd := -1
	if x&vhostuser.VringNoFD == 0 {
		fd = m.TakeFD(0)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	switch m.Request {
	case vhostuser.ReqSetVringKick:
		p.dropKick(v)
		v.kickFD = fd
		if fd >= 0 {
			unix.SetNonblock(fd, true)
			if v.IsTX() && p.hooks.WatchKick != nil {
				p.hooks.WatchKick(v, fd)
			}
		}
		// The kick message starts the ring (spec "Ring states").
		v.started = true
		p.rebuild(v)
	case vhostuser.ReqSetVringCall:
		closeFD(&v.callFD)
		v.callFD = fd
	case vhostuser.ReqSetVringErr:
		closeFD(&v.errFD)
		v.errFD = fd
	}
	return nil
}

// setMemTable maps a new memory table and swaps it in while no worker
// touches guest memory; the old table is unmapped after.
func (p *Port) setMemTable(m *vhostuser.Message) error {
	regions, err := vhostuser.DecodeMemTable(m.Payload)
	if err != nil {
		return malformed(m, err)
	}
	if len(m.FDs) != len(regions) {
		return malformed(m, fmt.Errorf("%d regions but %d file descriptors", len(regions), len(m.FDs)))
	}
	var total uint64
	for _, r := range regions {
		total += min(r.Size, 1<<62) // a single size beyond the bound fails below, without wrapping the sum
	}
	if err := p.checkMemory(total); err != nil {
		return failed("SET_MEM_TABLE: %w", err)
	}
	mapped := make([]*guestmem.Region, 0, len(regions))
	undo := func() {
		for _, r := range mapped {
			r.Unmap()
		}
	}
	for i, r := range regions {
		fd := m.TakeFD(i)
		gr, err := guestmem.Map(fd, r.GuestPhysAddr, r.Size, r.UserAddr, r.MmapOffset)
		unix.Close(fd)
		if err != nil {
			undo()
			return failed("region %d: %w", i, err)
		}
		mapped = append(mapped, gr)
		if err := p.checkSealed(fmt.Sprintf("SET_MEM_TABLE region %d (gpa %#x)", i, r.GuestPhysAddr), gr.Seals()); err != nil {
			undo()
			return failed("%w", err)
		}
	}
	t, err := guestmem.NewTable(mapped)
	if err != nil {
		undo()
		return failed("%w", err)
	}
	p.swapMem(t, p.ctl.mem.Regions())
	p.log.Info("memory table set", "regions", len(regions))
	return nil
}

// changeMemRegion handles ADD_MEM_REG and REM_MEM_REG (memory hotplug).
func (p *Port) changeMemRegion(m *vhostuser.Message) error {
	r, err := vhostuser.DecodeSingleRegion(m.Payload)
	if err != nil {
		return malformed(m, err)
	}
	cur := p.ctl.mem
	if cur == nil {
		cur, _ = guestmem.NewTable(nil)
	}
	if m.Request == vhostuser.ReqRemMemReg {
		reg := cur.Find(r.GuestPhysAddr, r.Size, r.UserAddr)
		if reg == nil {
			return failed("no region at gpa %#x size %#x uva %#x", r.GuestPhysAddr, r.Size, r.UserAddr)
		}
		if !reg.Release() {
			return nil // another queue pair's vhost_dev still holds it
		}
		t, gone, err := cur.Without(r.GuestPhysAddr, r.Size, r.UserAddr)
		if err != nil {
			return failed("%w", err)
		}
		p.swapMem(t, []*guestmem.Region{gone})
		return nil
	}
	if reg := cur.Find(r.GuestPhysAddr, r.Size, r.UserAddr); reg != nil {
		// QEMU < 8.1 adds every region once per queue pair.
		reg.AddAgain()
		return nil
	}
	var total uint64
	for _, x := range cur.Regions() {
		total += x.Size
	}
	if err := p.checkMemory(total + min(r.Size, 1<<62)); err != nil {
		return failed("ADD_MEM_REG: %w", err)
	}
	fd := m.TakeFD(0)
	gr, err := guestmem.Map(fd, r.GuestPhysAddr, r.Size, r.UserAddr, r.MmapOffset)
	unix.Close(fd)
	if err != nil {
		return failed("%w", err)
	}
	if err := p.checkSealed(fmt.Sprintf("ADD_MEM_REG region gpa %#x", r.GuestPhysAddr), gr.Seals()); err != nil {
		gr.Unmap()
		return failed("%w", err)
	}
	t, err := cur.With(gr)
	if err != nil {
		gr.Unmap()
		return failed("%w", err)
	}
	p.swapMem(t, nil)
	return nil
}

// swapMem installs t with every vring locked, re-translates the rings, then
// unmaps the regions in retire that t no longer holds.
func (p *Port) swapMem(t *guestmem.Table, retire []*guestmem.Region) {
	p.lockAll()
	p.ctl.mem = t
	for _, v := range p.vrings {
		p.rebuild(v)
	}
	p.unlockAll()
	keep := make(map[*guestmem.Region]bool, t.Len())
	for _, r := range t.Regions() {
		keep[r] = true
	}
	for _, r := range retire {
		if !keep[r] {
			r.Unmap()
		}
	}
}

// describe turns a message into log attributes: the request, the ring it
// is for and the values it carries, as a debug log of the frontend's
// conversation (what QEMU really sends, in order).
func describe(m *vhostuser.Message) []any {
	a := []any{"request", m.Request.String(), "fds", len(m.FDs)}
	if m.NeedReply() {
		a = append(a, "needReply", true)
	}
	switch m.Request {
	case vhostuser.ReqSetVringNum, vhostuser.ReqSetVringBase, vhostuser.ReqSetVringEnable, vhostuser.ReqGetVringBase:
		if s, err := vhostuser.DecodeVringState(m.Payload); err == nil {
			a = append(a, "vring", s.Index, "num", s.Num)
		}
	case vhostuser.ReqSetVringAddr:
		if v, err := vhostuser.DecodeVringAddr(m.Payload); err == nil {
			a = append(a, "vring", v.Index, "flags", v.Flags, "desc", fmt.Sprintf("%#x", v.Desc),
				"avail", fmt.Sprintf("%#x", v.Avail), "used", fmt.Sprintf("%#x", v.Used))
		}
	case vhostuser.ReqSetVringKick, vhostuser.ReqSetVringCall, vhostuser.ReqSetVringErr:
		if x, err := vhostuser.DecodeU64(m.Payload); err == nil {
			a = append(a, "vring", x&vhostuser.VringIndexMask, "noFD", x&vhostuser.VringNoFD != 0)
		}
	case vhostuser.ReqSetFeatures, vhostuser.ReqSetProtocolFeatures, vhostuser.ReqSetStatus, vhostuser.ReqNetSetMTU:
		if x, err := vhostuser.DecodeU64(m.Payload); err == nil {
			a = append(a, "value", fmt.Sprintf("%#x", x))
		}
	case vhostuser.ReqSetMemTable:
		if r, err := vhostuser.DecodeMemTable(m.Payload); err == nil {
			a = append(a, "regions", len(r))
		}
	case vhostuser.ReqAddMemReg, vhostuser.ReqRemMemReg:
		if r, err := vhostuser.DecodeSingleRegion(m.Payload); err == nil {
			a = append(a, "gpa", fmt.Sprintf("%#x", r.GuestPhysAddr), "size", r.Size)
		}
	}
	return a
}

// checkMemory refuses a memory table of total bytes beyond the port's
// bound (Config.MaxMemory).
func (p *Port) checkMemory(total uint64) error {
	limit := p.cfg.MaxMemory
	if limit == 0 {
		limit = DefaultMaxMemory
	}
	if total > limit {
		return fmt.Errorf("port %q: the regions add up to %d bytes, more than the %d a session may map (maxGuestMemoryGiB)", p.cfg.Name, total, limit)
	}
	return nil
}
