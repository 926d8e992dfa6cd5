package dataplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// A handoff moves every live port of this dataplane to a successor
// process (an upgrade) without the frontends seeing it: Handover on the
// old side, AdoptPort and LearnHandedMACs on the new one. The wire and the
// agent's exchange are dataplane/handoff's and the agent's.

// HandedPort is what the dataplane says of a port in a handoff (the Spec
// of handoff.Port): what the successor checks its own port against.
type HandedPort struct {
	Name       string `json:"name"`
	Socket     string `json:"socket"`
	Role       string `json:"role"`
	QueuePairs int    `json:"queuePairs"`
	MTU        int    `json:"mtu"`
	// CPUs are the CPUs of the workers serving each pair at the handoff.
	CPUs    []int  `json:"cpus"`
	Network string `json:"network"`
	VLAN    int    `json:"vlan"`
	Polling string `json:"polling"`
}

// handedMAC is one learned guest address in a handoff.
type handedMAC struct {
	Network string `json:"network"`
	MAC     string `json:"mac"`
	Port    string `json:"port"`
}

// Exchange is how Handover talks to the successor.
type Exchange struct {
	// Send transmits the ports (their fds are closed after it returns).
	// In one phase they are frozen and Send returns once the successor
	// has taken them; in two they have their sessions parked and their
	// rings still running (State.Running), and Send returns once the
	// successor has set them up.
	Send func(*handoff.State, []int) error
	// Commit, set for two phases, transmits the rings' positions at the
	// freeze and the learned addresses, and returns once the successor
	// has taken them.
	Commit func(*handoff.Final) error
	// Committed, if set, is called once the ports are the successor's and
	// no worker here touches them again, before this dataplane forgets
	// them: the moment to tell the successor to serve.
	Committed func()
}

// HandoverReport says what a handoff moved and how long the rings were
// stopped here (from their freeze to the successor's answer).
type HandoverReport struct {
	Ports int
	Pause time.Duration
}

// Handover hands every port to a successor: it parks every session
// between two vhost-user messages, stops every worker at a burst boundary
// (FreezeAll), exports the ports and the learned MAC addresses, and calls
// send, which transmits them and returns once the successor has taken them
// (nil) or refused (an error). On success this dataplane lets go of the
// ports without telling their frontends anything and forgets them; on any
// error every port goes on here as before. A tap uplink goes with the
// ports: the workers stop reading it (pauseUplink) before the rings
// freeze, its queues are handed over, and this process never reads them
// again; so do a vxlan uplink's sockets. An af_xdp uplink is refused: the
// caller falls back to a restart, which the frontends see as a reconnect.
//
// With Exchange.Commit set, the handoff runs in two phases so that the
// rings stop only for its last step (see Exchange). The pause reported is
// the rings' freeze.
func (d *Dataplane) Handover(build string, timeout time.Duration, x Exchange) (HandoverReport, error) {
	if d.up != nil && d.up.xdp != nil {
		return HandoverReport{}, fmt.Errorf("handover: the %s uplink cannot be handed over (its NIC queues are bound to this process's sockets)", d.up.kind)
	}
	d.placeMu.Lock()
	d.mu.Lock()
	var ports []*port
	for _, p := range d.byName {
		ports = append(ports, p)
	}
	d.mu.Unlock()
	slices.SortFunc(ports, func(a, b *port) int { return strings.Compare(a.dev.Name(), b.dev.Name()) })
	tSuspend := time.Now()
	t0 := tSuspend // the pause's start: the rings' freeze
	var suspended []*port
	resume := func() {
		for _, p := range suspended {
			p.dev.Resume()
		}
	}
	for _, p := range ports {
		if err := p.dev.Suspend(timeout); err != nil {
			resume()
			d.placeMu.Unlock()
			return HandoverReport{}, fmt.Errorf("handover: %w", err)
		}
		suspended = append(suspended, p)
	}
	devs := make([]*netdev.Port, len(ports))
	for i, p := range ports {
		devs[i] = p.dev
	}
	uplinkPaused, unfreeze := false, func() {}
	fail := func(err error) (HandoverReport, error) {
		unfreeze()
		resume()
		if uplinkPaused {
			d.resumeUplink()
		}
		d.placeMu.Unlock()
		d.log.Warn("handover failed; every port goes on in this process", "err", err)
		return HandoverReport{}, fmt.Errorf("handover: %w", err)
	}
	// freeze stops the uplink's readers, then every ring.
	freeze := func() error {
		if err := d.pauseUplink(timeout); err != nil {
			return err
		}
		uplinkPaused = true
		unfreeze = netdev.FreezeAll(devs)
		t0 = time.Now()
		return nil
	}
	if x.Commit == nil {
		if err := freeze(); err != nil {
			return fail(err)
		}
	}
	st, fds, err := d.export(build, ports, x.Commit != nil)
	if err == nil {
		err = x.Send(st, fds)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err != nil {
		return fail(err)
	}
	if x.Commit != nil {
		if err := freeze(); err != nil {
			return fail(err)
		}
		fin := &handoff.Final{FrozenAt: t0, Ports: make([]handoff.FinalPort, len(ports))}
		for i, p := range devs {
			fin.Ports[i].Vrings = p.Positions()
		}
		if fin.Networks, err = d.exportMACs(ports); err == nil {
			err = x.Commit(fin)
		}
		if err != nil {
			return fail(err)
		}
	}
	pause := time.Since(t0)
	for _, p := range devs {
		p.HandedOver()
	}
	unfreeze()
	d.placeMu.Unlock()
	if x.Committed != nil {
		x.Committed()
	}
	for _, p := range ports {
		d.RemovePort(p.dev.Name())
	}
	// The uplink stays paused: its queues are the successor's now.
	d.log.Info("handover done: the successor serves every port", "ports", len(ports), "pause", pause.String(),
		"twoPhase", x.Commit != nil, "sinceSuspend", time.Since(tSuspend).String())
	return HandoverReport{Ports: len(ports), Pause: pause}, nil
}

// export describes the ports and the guest addresses learned on them:
// frozen, or (running) with their sessions parked and their rings still
// running. Caller holds placeMu.
func (d *Dataplane) export(build string, ports []*port, running bool) (*handoff.State, []int, error) {
	st := &handoff.State{Build: build, Running: running}
	var fds []int
	fail := func(err error) (*handoff.State, []int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	for _, p := range ports {
		cfg := p.dev.Config()
		export := p.dev.Export
		if running {
			export = p.dev.ExportRunning
		}
		hp, pfds, err := export()
		if err != nil {
			return fail(err)
		}
		shift(&hp, len(fds))
		fds = append(fds, pfds...)
		spec := HandedPort{Name: cfg.Name, Socket: cfg.Socket, Role: string(cfg.Role), QueuePairs: cfg.QueuePairs, MTU: cfg.MTU,
			Network: p.net.name, VLAN: p.net.vlan, Polling: p.polling.String()}
		for i := range p.workers {
			spec.CPUs = append(spec.CPUs, p.workers[i].Load().cpu)
		}
		if hp.Spec, err = json.Marshal(spec); err != nil {
			return fail(err)
		}
		st.Ports = append(st.Ports, hp)
	}
	var err error
	if st.Uplink, fds, err = d.exportUplink(fds); err != nil {
		return fail(err)
	}
	if st.Networks, err = d.exportMACs(ports); err != nil {
		return fail(err)
	}
	return st, fds, nil
}

// exportMACs encodes the guest addresses learned on ports.
func (d *Dataplane) exportMACs(ports []*port) (json.RawMessage, error) {
	names := make(map[*port]string, len(ports))
	for _, p := range ports {
		names[p] = p.dev.Name()
	}
	var macs []handedMAC
	for _, n := range d.networks() {
		n.macs.Entries(func(mac vswitch.MAC, owner *port, _ int64) {
			if name, ok := names[owner]; ok {
				macs = append(macs, handedMAC{Network: n.name, MAC: macString(mac), Port: name})
			}
		})
	}
	slices.SortFunc(macs, func(a, b handedMAC) int { return strings.Compare(a.Network+a.MAC, b.Network+b.MAC) })
	return json.Marshal(macs)
}

// shift moves a port's fd indexes by n (its fds follow earlier ports').
func shift(p *handoff.Port, n int) {
	at := func(i *int) {
		if *i >= 0 {
			*i += n
		}
	}
	at(&p.Listener)
	at(&p.Conn)
	for i := range p.Regions {
		at(&p.Regions[i].FD)
	}
	if p.Log != nil {
		at(&p.Log.FD)
	}
	for i := range p.Vrings {
		at(&p.Vrings[i].Kick)
		at(&p.Vrings[i].Call)
		at(&p.Vrings[i].Err)
	}
}

func macString(m vswitch.MAC) string { return net.HardwareAddr(m[:]).String() }

// SpecOf reads what the dataplane said of a handed port.
func SpecOf(hp handoff.Port) (HandedPort, error) {
	var spec HandedPort
	if err := json.Unmarshal(hp.Spec, &spec); err != nil {
		return spec, fmt.Errorf("spec: %w", err)
	}
	if spec.Name == "" {
		return spec, errors.New("spec.name: missing")
	}
	return spec, nil
}

// CheckHanded compares a handed port's spec with the port this process
// would create: a successor adopts a session only into the same port
// (socket, role, queue pairs, MTU, network); anything else is refused and
// the port is created afresh, its frontend reconnecting.
func CheckHanded(hp handoff.Port, cfg netdev.Config, opt PortOptions) (HandedPort, error) {
	spec, err := SpecOf(hp)
	if err != nil {
		return spec, err
	}
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = 1500
	}
	switch {
	case spec.Name != cfg.Name:
		return spec, fmt.Errorf("name: handed %q, this port is %q", spec.Name, cfg.Name)
	case spec.Socket != cfg.Socket:
		return spec, fmt.Errorf("socket: handed %q, this port has %q", spec.Socket, cfg.Socket)
	case spec.Role != string(cfg.Role):
		return spec, fmt.Errorf("role: handed %q, this port has %q", spec.Role, cfg.Role)
	case spec.QueuePairs != cfg.QueuePairs:
		return spec, fmt.Errorf("queuePairs: handed %d, this port has %d", spec.QueuePairs, cfg.QueuePairs)
	case spec.MTU != mtu:
		return spec, fmt.Errorf("mtu: handed %d, this port has %d", spec.MTU, mtu)
	case spec.Network != opt.Network || spec.VLAN != opt.VLAN:
		return spec, fmt.Errorf("network: handed %q vlan %d, this port has %q vlan %d", spec.Network, spec.VLAN, opt.Network, opt.VLAN)
	}
	return spec, nil
}

// AdoptPort creates a port from a handed one (CheckHanded first) without
// serving it yet: StartAdopted does, once the predecessor has released
// the sessions (handoff.KindReleased); RemovePort lets go of it without
// touching its session, should the predecessor go on instead. Its pairs
// stay on the CPUs they were on when the options name none. fds are the
// handoff message's: AdoptPort takes the ones hp names (netdev.Adopt).
func (d *Dataplane) AdoptPort(cfg netdev.Config, opt PortOptions, hp handoff.Port, fds []int) error {
	d.portLimits(&cfg)
	spec, err := CheckHanded(hp, cfg, opt)
	if err != nil {
		return fmt.Errorf("port %q: adopt: %w", cfg.Name, err)
	}
	if len(opt.CPUs) == 0 && len(spec.CPUs) == cfg.QueuePairs {
		all := true
		for _, c := range spec.CPUs {
			all = all && d.workerOn(c) != nil
		}
		if all {
			opt.CPUs = spec.CPUs
		}
	}
	if _, err := d.addPort(cfg, opt, func(h netdev.Hooks) (*netdev.Port, error) { return netdev.Adopt(cfg, hp, fds, d.log, h) }); err != nil {
		return err
	}
	d.mu.Lock()
	d.byName[cfg.Name].adopted = true
	d.mu.Unlock()
	d.log.Info("port adopted from the predecessor; served once it lets go", "port", cfg.Name, "established", hp.Owned, "rings", len(hp.Vrings))
	return nil
}

// PositionAdopted sets an adopted port's rings where the predecessor
// stopped them (netdev.Port.Position), before StartAdopted.
func (d *Dataplane) PositionAdopted(name string, pos []handoff.Position) error {
	d.mu.Lock()
	p, ok := d.byName[name]
	d.mu.Unlock()
	if !ok || !p.adopted {
		return fmt.Errorf("port %q: not adopted here", name)
	}
	return p.dev.Position(pos)
}

// StartAdopted serves every adopted port; it returns how many.
func (d *Dataplane) StartAdopted() int {
	d.mu.Lock()
	var start []*port
	for _, p := range d.byName {
		if p.adopted {
			p.adopted = false
			start = append(start, p)
		}
	}
	d.mu.Unlock()
	devs := make([]*netdev.Port, len(start))
	for i, p := range start {
		devs[i] = p.dev
	}
	netdev.StartAll(devs)
	d.resumeUplink() // an adopted tap is read from now on
	return len(start)
}

// LearnHandedMACs teaches the switch the guest addresses the predecessor
// had learned (handoff.State's or Final's Networks), on the ports adopted
// here, so that no frame is flooded or lost while the guests are quiet.
func (d *Dataplane) LearnHandedMACs(networks json.RawMessage) (int, error) {
	if len(networks) == 0 {
		return 0, nil
	}
	var macs []handedMAC
	if err := json.Unmarshal(networks, &macs); err != nil {
		return 0, fmt.Errorf("networks: %w", err)
	}
	now := time.Now().UnixNano()
	n := 0
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range macs {
		p, ok := d.byName[m.Port]
		if !ok || p.net.name != m.Network {
			continue
		}
		hw, err := parseMAC(m.MAC)
		if err != nil {
			return n, fmt.Errorf("networks: %w", err)
		}
		if p.adoptMAC(hw, now) {
			n++
		}
	}
	return n, nil
}

func parseMAC(s string) (vswitch.MAC, error) {
	var m vswitch.MAC
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != len(m) {
		return m, fmt.Errorf("mac %q: not an Ethernet address", s)
	}
	copy(m[:], hw)
	return m, nil
}
