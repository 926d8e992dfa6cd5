// Package dataplane is vhostmq's node dataplane: vhost-user net ports
// (dataplane/netdev) joined by a learning L2 switch (dataplane/vswitch),
// with each queue pair served by a worker thread pinned to a CPU.
//
// The Dataplane type is the Go API for the port lifecycle that the node
// agent exposes over gRPC; cmd/vhostmq-dataplane drives it from a config
// file.
package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/afxdp"
	"github.com/vhostmq/vhostmq/dataplane/balance"
	"github.com/vhostmq/vhostmq/dataplane/dhcp"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
)

// Config configures the dataplane as a whole.
type Config struct {
	// CPUs the workers run on, one worker per CPU. Empty means one worker,
	// not pinned.
	CPUs []int
	// parkedSweep, for tests: how often a worker looks at its parked rings
	// whatever their kicks (0: sweepInterval; negative: never), so that
	// the watchdog's own healing can be seen (active.go).
	parkedSweep time.Duration
	// MACAge is how long a learned address lives without traffic.
	MACAge time.Duration
	// Uplink, when set, is the tap uplink networks may ask for
	// (PortOptions.Uplink).
	Uplink *tap.Config
	// AFXDP, when set instead, is the af_xdp uplink: AF_XDP sockets on a
	// NIC (dataplane/afxdp).
	AFXDP *afxdp.Config
	// VXLAN, when set instead, is the vxlan uplink: networks reach the
	// other nodes' through VXLAN tunnels over the node's network
	// (overlay.go).
	VXLAN *vxlan.Config
	// Topology gives each worker CPU's NUMA node; nil reads /sys. A port's
	// pairs, and the rebalancer's moves, stay on one node unless
	// Rebalance.CrossNUMA.
	Topology balance.Topology
	// Rebalance moves queue pairs between workers when one is overloaded
	// (rebalance.go).
	Rebalance RebalanceConfig
	// Watchdog finds and heals guest TX rings that nobody serves
	// (watchdog.go); on by default.
	Watchdog WatchdogConfig
	// RequireSealedMemory refuses guest memory and dirty logs whose file
	// the frontend could shrink (take back): every port's
	// netdev.Config.RequireSealedMemory.
	RequireSealedMemory bool
	// MaxGuestMemory bounds the guest memory one port's session may map,
	// in bytes (netdev.Config.MaxMemory); 0: netdev.DefaultMaxMemory.
	MaxGuestMemory uint64
	// Handed is the uplink a predecessor process handed over (an upgrade
	// without a gap): its tap is adopted when it is the one Uplink names,
	// and read only once StartAdopted serves the adopted ports.
	Handed *HandedUplink
	// UplinkMACs bounds the addresses a network learns behind the uplink
	// (0: DefaultUplinkMACs); a network's guests own one each.
	UplinkMACs int
	Logger     *slog.Logger
}

// DefaultUplinkMACs is how many addresses a network learns behind the
// uplink by default: a LAN's worth (Open vSwitch's mac-table-size).
const DefaultUplinkMACs = 8192

// HandedUplink is the uplink part of a handoff: what the predecessor said
// of it and the message's fds (New takes the ones it uses, setting them
// to -1; the caller closes the rest).
type HandedUplink struct {
	Uplink *handoff.Uplink
	FDs    []int
}

// portLimits applies the dataplane's bounds to a port that sets none.
func (d *Dataplane) portLimits(cfg *netdev.Config) {
	cfg.RequireSealedMemory = cfg.RequireSealedMemory || d.sealed
	if cfg.MaxMemory == 0 {
		cfg.MaxMemory = d.maxMem
	}
}

// ErrPortExists and ErrNoPort are returned by AddPort and RemovePort.
var (
	ErrPortExists = errors.New("port already exists")
	ErrNoPort     = errors.New("no such port")
)

// Dataplane owns the workers, the switch and the ports.
type Dataplane struct {
	log     *slog.Logger
	workers []*worker
	macAge  time.Duration
	// healthMu serialises WorkerHealth, whose progress bookkeeping
	// (worker.seenPasses, seenAt) the agent's monitor and its callers share
	healthMu sync.Mutex

	topo        balance.Topology
	rebal       RebalanceConfig
	sealed      bool          // Config.RequireSealedMemory
	maxMem      uint64        // Config.MaxGuestMemory
	parkedSweep time.Duration // Config.parkedSweep
	balance     *rebalancer   // rebalance.go
	wd          *watchdog     // watchdog.go

	// placeMu orders the changes to which worker serves a pair: AddPort's,
	// RemovePort's and the rebalancer's moves.
	placeMu sync.Mutex

	// own are the node's own addresses on the uplink (its device, bridge
	// and the bridge's ports), as Keys: never learned behind a guest nor
	// steered to us by the af_xdp map. Read when the uplink opens, before
	// any port exists, and again at every aging tick (a bridge takes a
	// new address when its ports change); ownDev and ownBridge say where.
	own               atomic.Pointer[map[uint64]struct{}]
	ownDev, ownBridge string
	uplinkMACs        int

	mu     sync.Mutex
	byName map[string]*port
	nets   map[string]*network // by name; each has its own MAC table and ports
	up     *uplink             // nil without an uplink; set before any port exists
	next   int                 // round-robin start for the next port's pairs

	stopAging chan struct{}
	agingDone chan struct{}
}

func (d *Dataplane) workerOn(cpu int) *worker {
	for _, w := range d.workers {
		if w.cpu == cpu {
			return w
		}
	}
	return nil
}

// port is the dataplane's view of a netdev port.
type port struct {
	polling Polling
	dev     *netdev.Port
	net     *network
	dhcp    *dhcpResponder         // nil: DHCP from this port's guest is switched like any frame
	guard   *guard                 // port security (security.go); a stand-in's is off
	limits  atomic.Pointer[limits] // rate limits (bandwidth.go); nil: none
	ingress atomic.Pointer[bucket] // limits' ingress bucket, for the delivery paths
	// mac is the port's configured MAC (a Key), noKey when none
	mac uint64
	// up marks a network's stand-in for its uplink in the MAC table
	// (addresses learned from the tap); such a port has no device.
	up *uplink
	// workers[i] serves pair i; a move changes it under the TX vring's
	// lock (the kick hooks read it there) and placeMu.
	workers []atomic.Pointer[worker]
	assigns []*assignment // by pair; each on the list of workers[i]
	removed bool          // under placeMu: RemovePort took its pairs off the workers
	adopted bool          // under mu: taken from a predecessor, not served until StartAdopted
	flows   vswitch.FlowTable
	rxReady []atomic.Bool // by pair: the guest RX vring can take frames
	// announce is a MAC (a Key) its frontend announced, with
	// announcePending set until the worker of pair 0 broadcast it
	// (announce.go); 0: none
	announce atomic.Uint64
}

// New starts the workers.
func New(cfg Config) (*Dataplane, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.MACAge <= 0 {
		cfg.MACAge = 300 * time.Second
	}
	if err := cfg.Rebalance.Validate(); err != nil {
		return nil, err
	}
	topo := cfg.Topology
	if topo == nil {
		var err error
		if topo, err = balance.ReadTopology("/sys"); err != nil {
			log.Warn("cannot read the NUMA topology; every CPU counts as node 0", "err", err)
			topo = balance.Topology{}
		}
	}
	if cfg.UplinkMACs <= 0 {
		cfg.UplinkMACs = DefaultUplinkMACs
	}
	d := &Dataplane{log: log, macAge: cfg.MACAge, byName: map[string]*port{}, nets: map[string]*network{}, uplinkMACs: cfg.UplinkMACs,
		topo: topo, rebal: cfg.Rebalance.withDefaults(), sealed: cfg.RequireSealedMemory, maxMem: cfg.MaxGuestMemory, parkedSweep: cfg.parkedSweep,
		stopAging: make(chan struct{}), agingDone: make(chan struct{})}
	cpus := cfg.CPUs
	if len(cpus) == 0 {
		cpus = []int{-1}
	}
	for i, cpu := range cpus {
		w, err := newWorker(d, i, cpu)
		if err != nil {
			d.closeWorkers()
			return nil, err
		}
		d.workers = append(d.workers, w)
	}
	if cfg.Uplink != nil || cfg.AFXDP != nil || cfg.VXLAN != nil {
		if err := d.openUplink(cfg.Uplink, cfg.AFXDP, cfg.VXLAN, cfg.Handed); err != nil {
			d.closeWorkers()
			return nil, err
		}
	}
	for _, w := range d.workers {
		go w.routine() // after the uplink: a worker's uplink queue is fixed before it runs
	}
	go d.routineAging()
	d.balance = d.startRebalancer()
	d.wd = d.startWatchdog(cfg.Watchdog)
	log.Info("dataplane started", "workers", len(d.workers), "cpus", cpus, "rebalance", d.rebal.String())
	return d, nil
}

// Polling says how a worker waits for a port's queues.
type Polling int

const (
	// PollAdaptive polls while work keeps arriving and sleeps on the kick
	// eventfds after adaptiveIdle without any: the default.
	PollAdaptive Polling = iota
	// PollInterrupt sleeps on the kick eventfds as soon as a pass finds no
	// work.
	PollInterrupt
	// PollBusy never sleeps, like a DPDK PMD thread.
	PollBusy
)

// String names the mode as the API and annotations spell it.
func (p Polling) String() string {
	switch p {
	case PollInterrupt:
		return "interrupt"
	case PollBusy:
		return "busy"
	}
	return "adaptive"
}

// PortOptions place a port's queue pairs.
type PortOptions struct {
	// CPUs[i] is the CPU whose worker serves pair i; it must be one of the
	// dataplane's CPUs. Empty spreads the pairs over distinct workers of
	// one NUMA node (all nodes with Rebalance.CrossNUMA): pickWorkers.
	CPUs    []int
	Polling Polling
	// Network is the L2 segment the port joins ("" = the default one);
	// ports on different networks never see each other's frames.
	Network string
	// VLAN is the network's 802.1Q VID on the uplink (0 = untagged); every
	// port of a network must agree on it.
	VLAN int
	// DHCP, when set, makes the dataplane answer the guest's DHCPv4
	// client with this lease instead of switching its requests.
	DHCP *dhcp.Lease
	// Uplink puts the port's network on the dataplane's uplink (every
	// port of a network must agree).
	Uplink bool
	// VNI is the network's VXLAN network identifier on the vxlan uplink
	// (1..vxlan.MaxVNI; 0 on the other kinds); every port of a network
	// must agree on it.
	VNI uint32
	// Security says which source addresses the port's guest may send
	// from (security.go); the zero value is on.
	Security PortSecurity
	// Bandwidth limits the port's rate in each direction (bandwidth.go);
	// the zero value is no limit.
	Bandwidth Bandwidth
}

// CPUs returns the CPUs the workers run on (-1: one unpinned worker).
func (d *Dataplane) CPUs() []int {
	out := make([]int, len(d.workers))
	for i, w := range d.workers {
		out[i] = w.cpu
	}
	return out
}

// AddPort creates a port and assigns its queue pairs to workers: to the
// CPUs given, or spread so that a port's pairs land on distinct workers
// of one NUMA node where there are enough.
func (d *Dataplane) AddPort(cfg netdev.Config, opt PortOptions) error {
	d.portLimits(&cfg)
	_, err := d.addPort(cfg, opt, func(h netdev.Hooks) (*netdev.Port, error) { return netdev.New(cfg, d.log, h) })
	return err
}

// addPort checks a port's options, makes its device with newDev and puts
// its pairs on workers.
func (d *Dataplane) addPort(cfg netdev.Config, opt PortOptions, newDev func(netdev.Hooks) (*netdev.Port, error)) (*netdev.Port, error) {
	d.placeMu.Lock()
	defer d.placeMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.byName[cfg.Name]; ok {
		return nil, fmt.Errorf("port %q: %w", cfg.Name, ErrPortExists)
	}
	if cfg.QueuePairs < 1 || cfg.QueuePairs > vhostuser.MaxQueuePairs {
		return nil, fmt.Errorf("port %q: queuePairs: %d is outside 1..%d", cfg.Name, cfg.QueuePairs, vhostuser.MaxQueuePairs)
	}
	if len(opt.CPUs) != 0 && len(opt.CPUs) != cfg.QueuePairs {
		return nil, fmt.Errorf("port %q: %d CPUs given for %d queue pairs", cfg.Name, len(opt.CPUs), cfg.QueuePairs)
	}
	if opt.VLAN < 0 || opt.VLAN > vswitch.MaxVLAN {
		return nil, fmt.Errorf("port %q: vlan: %d is outside 0..%d", cfg.Name, opt.VLAN, vswitch.MaxVLAN)
	}
	if err := opt.Bandwidth.Validate(); err != nil {
		return nil, fmt.Errorf("port %q: %w", cfg.Name, err)
	}
	p := &port{rxReady: make([]atomic.Bool, cfg.QueuePairs), polling: opt.Polling,
		workers: make([]atomic.Pointer[worker], cfg.QueuePairs), guard: newGuard(opt.Security, cfg.MAC), mac: noKey}
	if len(cfg.MAC) == 6 {
		var m vswitch.MAC
		copy(m[:], cfg.MAC)
		if m.IsMulticast() || m.IsZero() {
			return nil, fmt.Errorf("port %q: mac: %s is not a unicast address", cfg.Name, cfg.MAC)
		}
		if p.mac = vswitch.KeyOf(m); d.reserved(p.mac) {
			return nil, fmt.Errorf("port %q: mac: %s is the node's own address on the uplink", cfg.Name, cfg.MAC)
		}
	}
	if opt.DHCP != nil {
		r, err := newDHCPResponder(*opt.DHCP)
		if err != nil {
			return nil, fmt.Errorf("port %q: dhcp: %w", cfg.Name, err)
		}
		p.dhcp = r
	}
	ws := d.pickWorkers(cfg.QueuePairs)
	if len(opt.CPUs) > 0 {
		for i, cpu := range opt.CPUs {
			if ws[i] = d.workerOn(cpu); ws[i] == nil {
				return nil, fmt.Errorf("port %q: pair %d: CPU %d runs no worker (workers run on %v)", cfg.Name, i, cpu, d.CPUs())
			}
		}
		if nodes := d.nodesOf(ws); len(nodes) > 1 && !d.rebal.CrossNUMA {
			// The kubelet's allocation: served as given, but said.
			d.log.Warn("port's CPUs span NUMA nodes", "port", cfg.Name, "cpus", opt.CPUs, "nodes", nodes)
		}
	}
	for i, w := range ws {
		p.workers[i].Store(w)
	}
	hooks := netdev.Hooks{
		WatchKick:   func(v *netdev.Vring, fd int) { p.workers[v.Pair()].Load().watch(v, fd) },
		UnwatchKick: func(v *netdev.Vring, fd int) { p.workers[v.Pair()].Load().unwatch(v, fd) },
		Changed: func(v *netdev.Vring) {
			if !v.IsTX() {
				p.rxReady[v.Pair()].Store(v.Queue() != nil)
				d.wakeHolding(v) // hold.go
				return
			}
			p.workers[v.Pair()].Load().poke() // a parked ring started or stopped (active.go)
		},
		RARP: func(_ *netdev.Port, mac net.HardwareAddr) { d.announced(p, mac) },
	}
	if opt.VNI > vxlan.MaxVNI {
		return nil, fmt.Errorf("port %q: vni: %d is outside 1..%d", cfg.Name, opt.VNI, vxlan.MaxVNI)
	}
	if err := d.checkNetwork(opt.Network, opt.VLAN, opt.VNI); err != nil {
		return nil, fmt.Errorf("port %q: %w", cfg.Name, err)
	}
	if err := d.checkUplink(opt.Network, opt.VLAN, opt.VNI, opt.Uplink, cfg.MTU); err != nil {
		return nil, fmt.Errorf("port %q: %w", cfg.Name, err)
	}
	dev, err := newDev(hooks)
	if err != nil {
		return nil, err
	}
	p.dev = dev
	p.setLimits(newLimits(opt.Bandwidth, dev.MTU()))
	d.next = (d.next + 1) % len(d.workers)
	d.byName[cfg.Name] = p
	d.joinNetwork(p, opt.Network, opt.VLAN, opt.VNI, opt.Uplink)
	d.pinOwn(p)
	for i := range p.workers {
		a := &assignment{port: p, pair: i, tx: dev.Vrings()[2*i+1], polling: opt.Polling, hold: txHold{kick: -1}}
		p.assigns = append(p.assigns, a)
		p.workers[i].Load().add(a)
	}
	d.log.Info("port added", "port", cfg.Name, "socket", cfg.Socket, "role", cfg.Role, "queuePairs", cfg.QueuePairs, "mtu", dev.MTU(),
		"network", opt.Network, "vlan", opt.VLAN, "vni", opt.VNI, "dhcp", opt.DHCP != nil)
	return dev, nil
}

// RemovePort disconnects a port's frontend and forgets it.
func (d *Dataplane) RemovePort(name string) error {
	d.mu.Lock()
	p, ok := d.byName[name]
	if !ok {
		d.mu.Unlock()
		return fmt.Errorf("port %q: %w", name, ErrNoPort)
	}
	delete(d.byName, name)
	d.leaveNetwork(p)
	d.mu.Unlock()
	d.forgetGuestMACs(p)
	p.net.macs.Forget(p)
	d.repin(p)
	d.placeMu.Lock()
	p.removed = true
	for _, w := range d.workers {
		w.remove(p)
	}
	d.placeMu.Unlock()
	// Workers still holding p see its rings stop under their locks; guest
	// memory is unmapped only after that.
	p.dev.Close()
	d.log.Info("port removed", "port", name)
	return nil
}

// Port returns a port's device.
func (d *Dataplane) Port(name string) (*netdev.Port, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.byName[name]
	if !ok {
		return nil, false
	}
	return p.dev, true
}

// Close removes every port and stops the workers.
func (d *Dataplane) Close() {
	d.mu.Lock()
	var names []string
	for n := range d.byName {
		names = append(names, n)
	}
	d.mu.Unlock()
	for _, n := range names {
		d.RemovePort(n)
	}
	close(d.stopAging)
	<-d.agingDone
	d.wd.close()
	d.balance.stop()
	d.stopWorkers()
	if d.up != nil {
		d.up.close()
	}
}

// closeWorkers releases workers that never ran.
func (d *Dataplane) closeWorkers() {
	for _, w := range d.workers {
		unix.Close(w.epfd)
		unix.Close(w.wakefd)
	}
}

func (d *Dataplane) stopWorkers() {
	for _, w := range d.workers {
		w.stop()
	}
}

func (d *Dataplane) routineAging() {
	defer close(d.agingDone)
	t := time.NewTicker(d.macAge / 4)
	defer t.Stop()
	for {
		select {
		case <-d.stopAging:
			return
		case now := <-t.C:
			if d.ownDev != "" {
				// kept as it was while the device cannot be read
				if own := ownAddresses(d.ownDev, d.ownBridge); len(own) > 0 {
					d.own.Store(&own)
				}
			}
			for _, n := range d.networks() {
				if c := n.macs.Age(now.UnixNano(), int64(d.macAge)); c > 0 {
					d.log.Debug("aged out MAC addresses", "network", n.name, "count", c)
				}
				if n.vteps != nil {
					if c := n.vteps.Age(now.UnixNano(), int64(d.macAge)); c > 0 {
						d.log.Debug("aged out addresses behind VTEPs", "network", n.name, "count", c)
					}
				}
			}
		}
	}
}

// pickWorkers spreads n pairs over distinct workers of one NUMA node (the
// node of the next worker in turn; every node with Rebalance.CrossNUMA),
// starting at a different worker for each port; pairs beyond the node's
// workers share them.
func (d *Dataplane) pickWorkers(n int) []*worker {
	start := d.workers[d.next%len(d.workers)]
	var pool []*worker
	for i := range d.workers {
		w := d.workers[(d.next+i)%len(d.workers)]
		if d.rebal.CrossNUMA || d.topo.Node(w.cpu) == d.topo.Node(start.cpu) {
			pool = append(pool, w)
		}
	}
	out := make([]*worker, n)
	for i := range out {
		out[i] = pool[i%len(pool)]
	}
	return out
}

// nodesOf lists the NUMA nodes of the workers, in first-seen order.
func (d *Dataplane) nodesOf(ws []*worker) []int {
	var nodes []int
	for _, w := range ws {
		if n := d.topo.Node(w.cpu); !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	return nodes
}

// pickRX chooses the RX queue pair for a flow: the one the guest sent the
// flow from, when known and ready; else by hash; else the next ready one.
func (p *port) pickRX(hash uint32) int {
	n := len(p.rxReady)
	if n == 1 { // no choice: no flow lookup
		if p.rxReady[0].Load() {
			return 0
		}
		return -1
	}
	if q := p.flows.Lookup(hash); q >= 0 && q < n && p.rxReady[q].Load() {
		return q
	}
	start := int(hash % uint32(n))
	for i := range n {
		q := (start + i) % n
		if p.rxReady[q].Load() {
			return q
		}
	}
	return -1
}
