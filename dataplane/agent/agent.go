// Package agent is the node agent: it owns the dataplane's queue slots and
// ports, keeps the desired ports on disk so they come back after a restart,
// and serves the control API (gRPC over a unix socket), metrics and health.
package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// errHanding refuses API changes while the ports go to a successor (and
// after: the successor answers on the API socket then).
var errHanding = status.Error(codes.Unavailable, "the dataplane is handing its ports to its successor: retry")

// errAdopt marks a port whose handed session could not be adopted: the
// whole takeover is refused then.
var errAdopt = errors.New("adopting a handed port")

// Config configures the agent.
type Config struct {
	// SlotsPerCPU is how many queue pairs each worker CPU offers; each slot
	// is one device of the device plugin's resource.
	SlotsPerCPU int
	// SocketRoot bounds where API-created vhost-user sockets may live.
	SocketRoot string
	// StateDir holds ports.json, the desired ports.
	StateDir string
	// APISocket is the gRPC socket (mode 0600).
	APISocket string
	// MetricsAddress serves /metrics, /healthz and /readyz; empty = off.
	MetricsAddress string
	// MetricsTLS, when set, serves them over HTTPS.
	MetricsTLS *tls.Config
	// MetricsGuard, when set, wraps /metrics only: probes of /healthz and
	// /readyz carry no credentials.
	MetricsGuard func(http.Handler) http.Handler
	Logger       *slog.Logger
	// Asked says the caller already asked for a predecessor's ports
	// (AskPredecessor) and Takeover is the answer (nil: none); else New
	// asks.
	Asked    bool
	Takeover *Takeover
}

// Defaults for Config.
const (
	DefaultSlotsPerCPU = 4
	DefaultSocketRoot  = "/var/run/vhostmq"
	DefaultStateDir    = "/var/lib/vhostmq"
	DefaultAPISocket   = "/run/vhostmq/api.sock"
)

// slot is one queue-pair slot on a worker CPU.
type slot struct {
	id    string
	cpu   int
	numa  int
	owner string // port ID, "" when free
	pairs []uint32
	// reserved is the reservation holding the slot (reserve.go), "" none
	reserved string
}

// record is a port the agent manages.
type record struct {
	spec   *agentv1.PortSpec // normalized
	slots  []*slot           // by pair
	static bool              // from the config file: not persisted, not deletable
	// createdDir is the socket directory this agent created for the port,
	// the only one it removes again: a directory it found (the device
	// plugin's per-pod allocation) belongs to someone else.
	createdDir string
}

// Agent manages ports on top of a Dataplane.
type Agent struct {
	cfg Config
	log *slog.Logger
	dp  *dataplane.Dataplane

	mu    sync.Mutex
	slots []*slot
	ports map[string]*record
	// reservations by owner (reserve.go)
	reservations map[string]*reservation
	failed       []*agentv1.PortSpec // stored ports that could not be restored: kept, not dropped
	state        *stateFile

	health *healthMonitor
	ready  atomic.Bool // the API is serving

	// Handoffs (handoff.go): take is the takeover this process began in
	// New and finishes in Serve; handing refuses API changes while the
	// ports are being handed to a successor.
	lock        stateLock
	take        *Takeover
	handing     bool
	handedOver  atomic.Bool
	lastHandoff *Handoff
	handedBy    string        // the pod that handed its ports to this process, if any
	served      chan struct{} // closed once Serve answers (after a takeover)
	stopMu      sync.Mutex
	stops       []func() // what stopServing ends: the API, metrics, handoff.sock
	// closeHandoffs stops answering on handoff.sock
	closeHandoffs func()
	// stopping closes when Serve's context ends: streams return then
	stopping <-chan struct{}
	agentv1.UnimplementedAgentServer
}

// New builds the agent and restores the stored ports before returning, so
// that client-role ports are already re-dialling their QEMUs when the API
// starts answering.
func New(cfg Config, dp *dataplane.Dataplane) (*Agent, error) {
	if cfg.SlotsPerCPU <= 0 {
		cfg.SlotsPerCPU = DefaultSlotsPerCPU
	}
	if cfg.SocketRoot == "" {
		cfg.SocketRoot = DefaultSocketRoot
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.APISocket == "" {
		cfg.APISocket = DefaultAPISocket
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, dp: dp, ports: map[string]*record{}, reservations: map[string]*reservation{}, served: make(chan struct{})}
	a.lock.path = filepath.Join(cfg.StateDir, lockName)
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	// An agent still running here hands its live ports over first (it
	// saves the state file as it does).
	take := cfg.Takeover
	if !cfg.Asked {
		var err error
		if take, err = AskPredecessor(cfg.StateDir, a.log); err != nil {
			return nil, err
		}
	}
	a.take = take
	for _, cpu := range dp.CPUs() {
		numa := dp.NUMANode(cpu)
		for s := range cfg.SlotsPerCPU {
			a.slots = append(a.slots, &slot{id: slotID(cpu, s), cpu: cpu, numa: numa})
		}
	}
	st, err := openState(cfg.StateDir, a.log)
	if err != nil {
		if take != nil {
			take.Refuse(a.dp, err)
		}
		return nil, err
	}
	a.state = st
	a.restoreReservations(st.reservations)
	for _, spec := range st.ports {
		if _, err := a.create(spec, false, false); err != nil {
			if take != nil && errors.Is(err, errAdopt) {
				take.Refuse(a.dp, err)
				return nil, err
			}
			a.log.Error("stored port cannot be restored; it is kept in the state file", "port", spec.Id, "err", err)
			a.failed = append(a.failed, spec)
			continue
		}
		a.log.Info("port restored", "port", spec.Id, "socket", spec.SocketPath)
	}
	a.health = newHealthMonitor(a)
	return a, nil
}

func slotID(cpu, s int) string {
	if cpu < 0 {
		return fmt.Sprintf("c0-s%d", s)
	}
	return fmt.Sprintf("c%d-s%d", cpu, s)
}

func (a *Agent) slotByID(id string) *slot {
	for _, s := range a.slots {
		if s.id == id {
			return s
		}
	}
	return nil
}

func clone(s *agentv1.PortSpec) *agentv1.PortSpec {
	if s == nil {
		return nil
	}
	return proto.Clone(s).(*agentv1.PortSpec)
}

// CreateStatic creates a port from the config file: not persisted, not
// deletable through the API.
func (a *Agent) CreateStatic(spec *agentv1.PortSpec) error {
	_, err := a.create(spec, false, true)
	return err
}

// Create creates a port (idempotent by ID) and persists it.
func (a *Agent) Create(spec *agentv1.PortSpec) (*agentv1.Port, error) {
	return a.create(spec, true, false)
}

func (a *Agent) create(req *agentv1.PortSpec, persist, static bool) (*agentv1.Port, error) {
	if req == nil {
		return nil, status.Error(codes.InvalidArgument, "spec: missing")
	}
	spec := normalize(req)
	if req.Mtu == 0 && spec.Uplink == UplinkVXLAN && a.dp.HasUplink(UplinkVXLAN) {
		// the vxlan uplink's own MTU (the underlay's less the
		// encapsulation), not 1500, which it cannot carry on a
		// 1500-byte underlay
		spec.Mtu = uint32(a.dp.UplinkMTU())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handing {
		return nil, errHanding
	}
	if err := a.validate(spec, static); err != nil {
		return nil, err
	}
	if r, ok := a.ports[spec.Id]; ok {
		if f := firstDifference(r.spec, spec); f != "" {
			return nil, status.Errorf(codes.AlreadyExists, "spec.%s: port %q exists with a different %s", f, spec.Id, f)
		}
		return a.portLocked(r), nil
	}
	for _, r := range a.ports {
		if r.spec.SocketPath == spec.SocketPath {
			return nil, status.Errorf(codes.AlreadyExists, "spec.socket_path: %q is used by port %q", spec.SocketPath, r.spec.Id)
		}
	}
	// Ports from the config file live outside the device plugin's
	// accounting unless they name slots: they are spread over the workers.
	var slots []*slot
	if !static || len(spec.Slots) > 0 {
		var err error
		if slots, err = a.place(spec); err != nil {
			return nil, err
		}
	}
	created, err := prepareSocketDir(spec, a.cfg.SocketRoot)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "spec.socket_path: %v", err)
	}
	var cpus []int
	for _, s := range slots {
		cpus = append(cpus, s.cpu)
	}
	opt := dataplane.PortOptions{CPUs: cpus, Polling: polling(spec.Polling), Network: spec.Network, VLAN: int(spec.Vlan),
		Uplink: spec.Uplink == UplinkTap || spec.Uplink == UplinkAFXDP || spec.Uplink == UplinkVXLAN, VNI: spec.Vni,
		Security: security(spec), Bandwidth: limitsOf(spec.Bandwidth)}
	if spec.Dhcp {
		if opt.DHCP, err = leaseOf(spec); err != nil {
			return nil, err // validated above: not reached
		}
	}
	adopted := false
	if a.take != nil {
		var err error
		adopted, err = a.take.adopt(spec.Id, func(hp handoff.Port, fds []int) error { return a.dp.AdoptPort(netdevConfig(spec), opt, hp, fds) })
		if err != nil {
			if created != "" {
				os.Remove(created)
			}
			return nil, fmt.Errorf("%w: port %q: %v", errAdopt, spec.Id, err)
		}
	}
	if !adopted {
		if err := a.dp.AddPort(netdevConfig(spec), opt); err != nil {
			if created != "" {
				os.Remove(created)
			}
			return nil, status.Errorf(codes.Internal, "creating port %q: %v", spec.Id, err)
		}
	}
	r := &record{spec: spec, slots: slots, static: static, createdDir: created}
	for i, s := range slots {
		s.owner = spec.Id
		s.pairs = append(s.pairs, uint32(i))
	}
	a.ports[spec.Id] = r
	if persist {
		if err := a.saveLocked(); err != nil {
			a.removeLocked(r)
			return nil, status.Errorf(codes.Internal, "saving state: %v", err)
		}
	}
	a.log.Info("port created", "port", spec.Id, "socket", spec.SocketPath, "role", spec.Role.String(), "queuePairs", spec.QueuePairs, "slots", slotIDs(slots))
	a.noteCappedBursts(spec.Id, spec.Bandwidth)
	return a.portLocked(r), nil
}

// place picks the slot of every pair: the requested slots (pairs beyond
// them share them, round robin), or free slots spread over distinct CPUs.
func (a *Agent) place(spec *agentv1.PortSpec) ([]*slot, error) {
	var chosen []*slot
	var res *reservation
	if spec.Reservation != "" {
		if res = a.reservations[spec.Reservation]; res == nil {
			return nil, status.Errorf(codes.FailedPrecondition, "spec.reservation: no reservation %q on this node", spec.Reservation)
		}
	}
	if len(spec.Slots) == 0 && res != nil {
		for _, s := range res.slots {
			if s.owner != "" {
				return nil, status.Errorf(codes.FailedPrecondition, "spec.reservation: slot %s of %q is in use by port %q", s.id, res.owner, s.owner)
			}
		}
		chosen = distinctCPUsFirst(res.slots)
	} else if len(spec.Slots) > 0 {
		for i, id := range spec.Slots {
			s := a.slotByID(id)
			if s.owner != "" {
				return nil, status.Errorf(codes.FailedPrecondition, "spec.slots[%d]: %s is in use by port %q", i, id, s.owner)
			}
			if s.reserved != "" && s.reserved != spec.Reservation && !strings.HasPrefix(s.reserved, agentv1.OwnerAllocation) {
				return nil, status.Errorf(codes.FailedPrecondition, "spec.slots[%d]: %s is reserved by %q", i, id, s.reserved)
			}
			chosen = append(chosen, s)
		}
		if nodes := slotNodes(chosen); len(nodes) > 1 && !a.dp.CrossNUMA() {
			// The kubelet's allocation (its topology manager may allow
			// this): served as given, but said.
			a.log.Warn("port's slots span NUMA nodes", "port", spec.Id, "slots", spec.Slots, "nodes", nodes)
		}
		chosen = distinctCPUsFirst(chosen)
	} else {
		chosen = a.freeSlots(int(spec.QueuePairs))
		if len(chosen) == 0 {
			return nil, status.Errorf(codes.ResourceExhausted, "spec.slots: no free queue slot on this node (%d of %d in use)", len(a.slots), len(a.slots))
		}
	}
	out := make([]*slot, spec.QueuePairs)
	for i := range out {
		out[i] = chosen[i%len(chosen)]
	}
	return out, nil
}

// distinctCPUsFirst orders slots so that each CPU's first slot comes
// before any CPU's second (otherwise in the order given): pair i takes
// slots[i % len], so a port's pairs land on distinct CPUs whenever its
// slots allow.
func distinctCPUsFirst(slots []*slot) []*slot {
	seen := map[int]int{}
	rank := make([]int, len(slots))
	for i, s := range slots {
		rank[i] = seen[s.cpu]
		seen[s.cpu]++
	}
	idx := make([]int, len(slots))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return rank[idx[i]] < rank[idx[j]] })
	out := make([]*slot, len(slots))
	for i, k := range idx {
		out[i] = slots[k]
	}
	return out
}

func slotNodes(slots []*slot) []int {
	var nodes []int
	for _, s := range slots {
		if !slices.Contains(nodes, s.numa) {
			nodes = append(nodes, s.numa)
		}
	}
	return nodes
}

// freeSlots returns up to n free slots, one per CPU before a second on
// any, all on one NUMA node unless the dataplane places across nodes: the
// node with the most CPUs that have a free slot (then the most free
// slots, then the lowest number).
func (a *Agent) freeSlots(n int) []*slot {
	node := -1
	if !a.dp.CrossNUMA() {
		cpus, free := map[int]map[int]bool{}, map[int]int{}
		for _, s := range a.slots {
			if s.owner == "" && s.reserved == "" {
				if cpus[s.numa] == nil {
					cpus[s.numa] = map[int]bool{}
				}
				cpus[s.numa][s.cpu] = true
				free[s.numa]++
			}
		}
		for nd := range cpus {
			if node < 0 || len(cpus[nd]) > len(cpus[node]) ||
				len(cpus[nd]) == len(cpus[node]) && (free[nd] > free[node] || free[nd] == free[node] && nd < node) {
				node = nd
			}
		}
	}
	byCPU := map[int][]*slot{}
	var cpus []int
	for _, s := range a.slots {
		if s.owner != "" || s.reserved != "" || (node >= 0 && s.numa != node) {
			continue
		}
		if _, ok := byCPU[s.cpu]; !ok {
			cpus = append(cpus, s.cpu)
		}
		byCPU[s.cpu] = append(byCPU[s.cpu], s)
	}
	// the CPUs with the most free slots first: they are the least loaded
	sort.SliceStable(cpus, func(i, j int) bool { return len(byCPU[cpus[i]]) > len(byCPU[cpus[j]]) })
	var out []*slot
	for round := 0; len(out) < n; round++ {
		added := false
		for _, c := range cpus {
			if round < len(byCPU[c]) && len(out) < n {
				out = append(out, byCPU[c][round])
				added = true
			}
		}
		if !added {
			break
		}
	}
	return out
}

func slotIDs(slots []*slot) string { return strings.Join(idsOf(slots), ",") }

// Delete removes a port; a missing port is not an error.
func (a *Agent) Delete(id string) (existed bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handing {
		return false, errHanding
	}
	r, ok := a.ports[id]
	if !ok {
		for i, f := range a.failed {
			if f.Id == id {
				a.failed = append(a.failed[:i], a.failed[i+1:]...)
				return true, a.saveLocked()
			}
		}
		return false, nil
	}
	if r.static {
		return true, status.Errorf(codes.FailedPrecondition, "id: port %q comes from the config file; remove it there", id)
	}
	a.removeLocked(r)
	if err := a.saveLocked(); err != nil {
		return true, status.Errorf(codes.Internal, "saving state: %v", err)
	}
	return true, nil
}

func (a *Agent) removeLocked(r *record) {
	if err := a.dp.RemovePort(r.spec.Id); err != nil && !errors.Is(err, dataplane.ErrNoPort) {
		a.log.Warn("removing port", "port", r.spec.Id, "err", err)
	}
	for _, s := range a.slots {
		if s.owner == r.spec.Id {
			s.owner, s.pairs = "", nil
		}
	}
	delete(a.ports, r.spec.Id)
	// A server-role socket is ours (netdev unlinks it too); QEMU's socket in
	// client role is QEMU's. The directory goes only if we made it and it
	// is empty.
	if r.spec.Role == agentv1.Role_ROLE_SERVER {
		os.Remove(r.spec.SocketPath)
	}
	if r.createdDir != "" {
		os.Remove(r.createdDir)
	}
	a.log.Info("port deleted", "port", r.spec.Id)
}

func (a *Agent) saveLocked() error {
	var specs []*agentv1.PortSpec
	for _, r := range a.ports {
		if !r.static {
			specs = append(specs, r.spec)
		}
	}
	specs = append(specs, a.failed...)
	sort.Slice(specs, func(i, j int) bool { return specs[i].Id < specs[j].Id })
	return a.state.save(specs, a.reservationsLocked())
}

// Get returns one port.
func (a *Agent) Get(id string) (*agentv1.Port, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.ports[id]
	if !ok {
		return nil, false
	}
	return a.portLocked(r), true
}

// List returns every port, sorted by ID.
func (a *Agent) List() []*agentv1.Port {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*agentv1.Port, 0, len(a.ports))
	for _, r := range a.ports {
		out = append(out, a.portLocked(r))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.Id < out[j].Spec.Id })
	return out
}

func (a *Agent) portLocked(r *record) *agentv1.Port {
	st := &agentv1.PortStatus{Mtu: r.spec.Mtu}
	if dev, ok := a.dp.Port(r.spec.Id); ok {
		st.Connected, st.Connects, st.Mtu = dev.Connected(), dev.Connects(), uint32(dev.MTU())
	}
	ps, _ := a.dp.PortStats(r.spec.Id)
	st.EnabledPairs = uint32(ps.EnabledPairs)
	st.Memory = &agentv1.MemorySeals{Regions: uint32(ps.Memory.Regions), ShrinkSealed: uint32(ps.Memory.ShrinkSealed),
		Log: ps.Memory.Log, LogShrinkSealed: ps.Memory.LogShrinkSealed}
	st.Faults = &agentv1.PortFaults{GuestMemory: ps.Faults.GuestMemory, DirtyLog: ps.Faults.DirtyLog}
	for i, s := range r.slots {
		st.Queues = append(st.Queues, &agentv1.QueueAssignment{Pair: uint32(i), Slot: s.id, Cpu: int32(s.cpu)})
	}
	if len(r.slots) == 0 { // a static port, spread over the workers
		for _, q := range ps.Queues {
			st.Queues = append(st.Queues, &agentv1.QueueAssignment{Pair: uint32(q.Pair), Cpu: int32(q.CPU)})
		}
	}
	return &agentv1.Port{Spec: clone(r.spec), Status: st}
}

func netdevConfig(s *agentv1.PortSpec) netdev.Config {
	c := netdev.Config{Name: s.Id, Socket: s.SocketPath, Role: netdev.RoleClient, QueuePairs: int(s.QueuePairs), MTU: int(s.Mtu)}
	if s.Role == agentv1.Role_ROLE_SERVER {
		c.Role = netdev.RoleServer
	}
	if s.Mac != "" {
		c.MAC, _ = net.ParseMAC(s.Mac)
	}
	if s.SocketUid != nil || s.SocketGid != nil {
		o := netdev.Owner{UID: -1, GID: -1}
		if s.SocketUid != nil {
			o.UID = int(*s.SocketUid)
		}
		if s.SocketGid != nil {
			o.GID = int(*s.SocketGid)
		}
		c.SocketOwner = &o
	}
	return c
}

// security is the port's source address check: off when the spec turns
// it off, else the port's MAC and its IPAM addresses (none: the IP
// fields are not checked).
func security(s *agentv1.PortSpec) dataplane.PortSecurity {
	if !s.PortSecurityOn() {
		return dataplane.PortSecurity{Off: true}
	}
	var sec dataplane.PortSecurity
	for _, a := range s.GetIp().GetAddresses() {
		if p, err := netip.ParsePrefix(a); err == nil { // validated
			sec.IPs = append(sec.IPs, p.Addr().Unmap())
		}
	}
	return sec
}

func polling(m agentv1.PollingMode) dataplane.Polling {
	switch m {
	case agentv1.PollingMode_POLLING_INTERRUPT:
		return dataplane.PollInterrupt
	case agentv1.PollingMode_POLLING_BUSY:
		return dataplane.PollBusy
	}
	return dataplane.PollAdaptive
}

// prepareSocketDir makes sure the socket's directory exists; one it
// creates gets the requested owner and a mode no wider than 0770. It
// returns the directory if it created it.
func prepareSocketDir(s *agentv1.PortSpec, root string) (string, error) {
	dir := filepath.Dir(s.SocketPath)
	created := ""
	fi, err := os.Stat(dir)
	switch {
	case os.IsNotExist(err):
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return "", err
		}
		if err := os.Mkdir(dir, os.FileMode(s.SocketMode)); err != nil && !os.IsExist(err) {
			return "", err
		}
		created = dir
	case err != nil:
		return "", err
	case !fi.IsDir():
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	if created == "" {
		// An existing directory is its owner's (the socket root, a device
		// plugin allocation, QEMU's own): its mode and owner stay.
		return "", nil
	}
	// Mkdir applies the umask; set the mode exactly.
	if err := os.Chmod(dir, os.FileMode(s.SocketMode)); err != nil {
		return created, err
	}
	if s.SocketUid != nil || s.SocketGid != nil {
		uid, gid := -1, -1
		if s.SocketUid != nil {
			uid = int(*s.SocketUid)
		}
		if s.SocketGid != nil {
			gid = int(*s.SocketGid)
		}
		if err := os.Chown(dir, uid, gid); err != nil {
			return created, err
		}
	}
	return created, nil
}
