// Package config reads and validates the dataplane daemon's YAML
// configuration. Every error names the field, the value and what is
// allowed.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/afxdp"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/vxlan"
	"github.com/vhostmq/vhostmq/internal/bandwidth"
)

// Config is the daemon's configuration file.
type Config struct {
	// CPUs the workers run on, one worker pinned to each; default (Load
	// fills it in): every CPU the process may run on, i.e. the pod's
	// cpuset, so a node pod gets a worker per CPU it was given.
	CPUs []int `yaml:"cpus,omitempty"`
	// StatsFile, when set, receives a JSON snapshot of every counter every
	// 500 ms and at exit.
	StatsFile string `yaml:"statsFile,omitempty"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"logLevel,omitempty"`
	// MACAgeSeconds is how long a learned MAC address lives without
	// traffic; default 300.
	MACAgeSeconds int `yaml:"macAgeSeconds,omitempty"`
	// SlotsPerCPU is how many queue pairs each worker CPU offers to the
	// device plugin; default 4.
	SlotsPerCPU int `yaml:"slotsPerCPU,omitempty"`
	// SocketRoot bounds where ports created through the API may put their
	// sockets; default /var/run/vhostmq.
	SocketRoot string `yaml:"socketRoot,omitempty"`
	// StateDir keeps the ports created through the API across restarts;
	// default /var/lib/vhostmq.
	StateDir string `yaml:"stateDir,omitempty"`
	// APISocket is the control API's unix socket (mode 0600); default
	// /run/vhostmq/api.sock.
	APISocket string `yaml:"apiSocket,omitempty"`
	// MetricsAddress serves Prometheus /metrics, /healthz and /readyz;
	// empty (the default) = off; ":9474" binds to localhost only.
	MetricsAddress string `yaml:"metricsAddress,omitempty"`
	// MetricsHostEnv names an environment variable holding the IP to bind
	// metricsAddress (":port") to: the pod's IP from the downward API.
	MetricsHostEnv string `yaml:"metricsHostEnv,omitempty"`
	// MetricsAuth guards /metrics: none (default), kubernetes (a bearer
	// token allowed GET /metrics by TokenReview and SubjectAccessReview)
	// or tls (a client certificate when metricsTLS.clientCAFile is set).
	// Both others serve HTTPS; /healthz and /readyz stay open to probes.
	MetricsAuth string `yaml:"metricsAuth,omitempty"`
	// MetricsTLS is the HTTPS certificate (kubernetes: optional, a
	// self-signed one otherwise).
	MetricsTLS *MetricsTLS `yaml:"metricsTLS,omitempty"`
	// Ports defined here exist as long as the config says so; they are not
	// stored in StateDir and cannot be deleted through the API.
	Ports []Port `yaml:"ports,omitempty"`
	// Uplink connects the vhostmq networks that ask for it (NAD "uplink")
	// to the node's network; absent: networks stay on this node.
	Uplink *Uplink `yaml:"uplink,omitempty"`
	// Rebalance moves queue pairs from an overloaded worker to others
	// (like Open vSwitch's pmd-auto-lb); absent: off, and vhostmqctl
	// queues rebalance still works.
	Rebalance *Rebalance `yaml:"rebalance,omitempty"`
	// Watchdog tunes the stall watchdog, which serves again a guest TX
	// ring whose entries its worker could have taken and did not; absent:
	// on, with a 100 ms bound.
	Watchdog *Watchdog `yaml:"watchdog,omitempty"`
	// RequireSealedMemory refuses a frontend's guest memory and dirty log
	// unless their files are sealed against shrinking (F_SEAL_SHRINK, QEMU
	// memory-backend-memfd's default): no frontend can then take memory
	// back. Off by default: hugetlbfs memory cannot be sealed, and a
	// frontend that takes memory back costs only its own session.
	RequireSealedMemory bool `yaml:"requireSealedMemory,omitempty"`
	// MaxGuestMemoryGiB bounds the guest memory one VM's session may map
	// (a frontend can send sparse files of any size, and the address
	// space is the one process's); default 1024.
	MaxGuestMemoryGiB int `yaml:"maxGuestMemoryGiB,omitempty"`
}

// MaxGuestMemory is MaxGuestMemoryGiB in bytes (0: the default).
func (c *Config) MaxGuestMemory() uint64 { return uint64(c.MaxGuestMemoryGiB) << 30 }

// Watchdog configures the stall watchdog.
type Watchdog struct {
	// StallMillis is how long a ring may wait before it counts as
	// stalled; 0 = 100, -1 = the watchdog is off.
	StallMillis int `yaml:"stallMillis,omitempty"`
	// RingDumpSeconds, when set, logs every guest TX ring's indices and
	// flags at debug level this often (logLevel: debug), for a stall the
	// watchdog did not catch.
	RingDumpSeconds int `yaml:"ringDumpSeconds,omitempty"`
}

// WatchdogConfig returns the stall watchdog's configuration.
func (c *Config) WatchdogConfig() dataplane.WatchdogConfig {
	w := c.Watchdog
	if w == nil {
		return dataplane.WatchdogConfig{}
	}
	return dataplane.WatchdogConfig{Bound: time.Duration(w.StallMillis) * time.Millisecond,
		RingDump: time.Duration(w.RingDumpSeconds) * time.Second}
}

// Rebalance configures the queue rebalancer.
type Rebalance struct {
	// IntervalSeconds between two looks at the loads; 0 = off (default).
	IntervalSeconds int `yaml:"intervalSeconds,omitempty"`
	// Threshold: a worker busier than this (percent of its CPU) is
	// overloaded; default 95.
	Threshold int `yaml:"threshold,omitempty"`
	// Improvement: the variance of the worker loads must drop by this
	// much (percent) for pairs to move; default 25.
	Improvement int `yaml:"improvement,omitempty"`
	// CrossNUMA lets pairs be placed and moved across NUMA nodes.
	CrossNUMA bool `yaml:"crossNUMA,omitempty"`
}

// RebalanceConfig returns the rebalancer's configuration (zero: off).
func (c *Config) RebalanceConfig() dataplane.RebalanceConfig {
	r := c.Rebalance
	if r == nil {
		return dataplane.RebalanceConfig{}
	}
	return dataplane.RebalanceConfig{Interval: time.Duration(r.IntervalSeconds) * time.Second, Threshold: r.Threshold,
		Improvement: r.Improvement, CrossNUMA: r.CrossNUMA}
}

// Uplink is the node's uplink: exactly one kind.
type Uplink struct {
	Tap   *TapUplink   `yaml:"tap,omitempty"`
	AFXDP *AFXDPUplink `yaml:"af_xdp,omitempty"`
	VXLAN *VXLANUplink `yaml:"vxlan,omitempty"`
	// MaxMACs bounds the addresses each network learns behind the uplink
	// (a LAN's hosts); beyond it, frames to the others flood the
	// network's guests, counted (mac_table_full) and logged. Default 8192.
	MaxMACs int `yaml:"maxMACs,omitempty"`
}

// MaxUplinkMACs is the largest uplink.maxMACs accepted.
const MaxUplinkMACs = 1 << 20

// UplinkMACs returns uplink.maxMACs (0: the dataplane's default).
func (c *Config) UplinkMACs() int {
	if c.Uplink == nil {
		return 0
	}
	return c.Uplink.MaxMACs
}

// AFXDPUplink is AF_XDP sockets on a NIC (one per NIC queue), with an XDP
// program that takes the guests' frames and passes the rest to the host.
type AFXDPUplink struct {
	// Interface is the NIC (or veth); required.
	Interface string `yaml:"interface"`
	// Dedicated: the host does not use the NIC, so broadcasts and
	// multicasts go to the guests only (default: to the host, and a copy
	// to the guests).
	Dedicated bool `yaml:"dedicated,omitempty"`
	// Generic attaches the XDP program in generic (SKB) mode even where
	// the driver offers native XDP.
	Generic bool `yaml:"generic,omitempty"`
}

// VXLANUplink is an overlay: the networks on it reach the same networks
// on the other nodes through VXLAN tunnels over the node's routed
// network, each network its own VNI.
type VXLANUplink struct {
	// Local is the node's underlay address, IPv4; empty: the NODE_IP
	// environment variable (the chart sets it to the node's address).
	Local string `yaml:"local,omitempty"`
	// Port is the UDP port of every VTEP; default 4789 (IANA's).
	Port int `yaml:"port,omitempty"`
	// MTU is the underlay's MTU, default 1500; the guests' is 50 less.
	MTU int `yaml:"mtu,omitempty"`
	// VTEPs are the other nodes' underlay addresses, when Nodes is off.
	VTEPs []string `yaml:"vteps,omitempty"`
	// Nodes: the VTEPs are the cluster's nodes' InternalIP addresses,
	// watched through the API server (in-cluster credentials; list and
	// watch on nodes).
	Nodes bool `yaml:"nodes,omitempty"`
}

// NodeIPEnv names the environment variable an empty uplink.vxlan.local
// comes from.
const NodeIPEnv = "NODE_IP"

// VXLANConfig returns the vxlan uplink's configuration (local from
// getenv(NodeIPEnv) when the file leaves it empty), or nil without one.
func (c *Config) VXLANConfig(getenv func(string) string) (*vxlan.Config, error) {
	if c.Uplink == nil || c.Uplink.VXLAN == nil {
		return nil, nil
	}
	v := c.Uplink.VXLAN
	vc := &vxlan.Config{Port: uint16(v.Port), MTU: v.MTU}
	if vc.Port == 0 {
		vc.Port = vxlan.DefaultPort
	}
	if vc.MTU == 0 {
		vc.MTU = 1500
	}
	local, field := v.Local, "uplink.vxlan.local"
	if local == "" {
		local, field = getenv(NodeIPEnv), "uplink.vxlan.local (empty: $"+NodeIPEnv+")"
	}
	a, err := netip.ParseAddr(local)
	if err != nil || !a.Is4() {
		return nil, fmt.Errorf("%s: %q is not an IPv4 address", field, local)
	}
	vc.Local = a
	for i, s := range v.VTEPs {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("uplink.vxlan.vteps[%d]: %q is not an IPv4 address", i, s)
		}
		vc.VTEPs = append(vc.VTEPs, a)
	}
	return vc, nil
}

// validate checks what the file says of the vxlan uplink.
func (v *VXLANUplink) validate() []error {
	var errs []error
	if v.Port < 0 || v.Port > 65535 {
		errs = append(errs, fmt.Errorf("uplink.vxlan.port: %d is outside 1..65535 (0: %d)", v.Port, vxlan.DefaultPort))
	}
	if v.MTU != 0 && (v.MTU < vxlan.MinUnderlayMTU || v.MTU > vxlan.MaxUnderlayMTU) {
		errs = append(errs, fmt.Errorf("uplink.vxlan.mtu: %d is outside %d..%d (the underlay's MTU; 0: 1500)", v.MTU, vxlan.MinUnderlayMTU, vxlan.MaxUnderlayMTU))
	}
	if v.Local != "" {
		if a, err := netip.ParseAddr(v.Local); err != nil || !a.Is4() {
			errs = append(errs, fmt.Errorf("uplink.vxlan.local: %q is not an IPv4 address", v.Local))
		}
	}
	for i, s := range v.VTEPs {
		if a, err := netip.ParseAddr(s); err != nil || !a.Is4() {
			errs = append(errs, fmt.Errorf("uplink.vxlan.vteps[%d]: %q is not an IPv4 address", i, s))
		}
	}
	if v.Nodes && len(v.VTEPs) > 0 {
		errs = append(errs, errors.New("uplink.vxlan: vteps and nodes exclude each other (nodes: the VTEPs come from the Node objects)"))
	}
	return errs
}

// TapUplink is a multiqueue tap (one queue per worker) the dataplane
// creates and attaches to a Linux bridge.
type TapUplink struct {
	// Name of the tap to create; default vhostmq0.
	Name string `yaml:"name,omitempty"`
	// Attach is the Linux bridge the tap joins (e.g. the bridge holding
	// the node's NIC); empty: the tap stays a plain host interface.
	Attach string `yaml:"attach,omitempty"`
	// MTU of the tap; default 1500. Networks with a VLAN need 4 bytes
	// more room on the bridge's other ports, not here.
	MTU int `yaml:"mtu,omitempty"`
}

// DefaultTapName is the tap uplink's default name.
const DefaultTapName = "vhostmq0"

// TapConfig returns the tap uplink's configuration, or nil without one.
func (c *Config) TapConfig() *tap.Config {
	if c.Uplink == nil || c.Uplink.Tap == nil {
		return nil
	}
	t := c.Uplink.Tap
	tc := &tap.Config{Name: t.Name, Attach: t.Attach, MTU: t.MTU}
	if tc.Name == "" {
		tc.Name = DefaultTapName
	}
	return tc
}

// AFXDPConfig returns the af_xdp uplink's configuration, or nil without
// one.
func (c *Config) AFXDPConfig() *afxdp.Config {
	if c.Uplink == nil || c.Uplink.AFXDP == nil {
		return nil
	}
	x := c.Uplink.AFXDP
	return &afxdp.Config{Interface: x.Interface, Dedicated: x.Dedicated, Generic: x.Generic}
}

// Port is one vhost-user port.
type Port struct {
	Name       string `yaml:"name"`
	Socket     string `yaml:"socket"`
	Role       string `yaml:"role"`
	QueuePairs int    `yaml:"queuePairs"`
	MTU        int    `yaml:"mtu,omitempty"`
	MAC        string `yaml:"mac,omitempty"`
	// Polling is interrupt, adaptive (default) or busy.
	Polling string `yaml:"polling,omitempty"`
	// PortSecurity (default on): the guest may send only from mac and
	// ips; false for a guest that bridges or routes other hosts' frames.
	PortSecurity *bool `yaml:"portSecurity,omitempty"`
	// IPs the guest may send from; none: IP fields are not checked.
	IPs []string `yaml:"ips,omitempty"`
	// Bandwidth limits the port's rate in each direction; absent: none.
	Bandwidth *PortBandwidth `yaml:"bandwidth,omitempty"`
}

// PortBandwidth is a port's rate limits as Kubernetes quantities, as in
// the pod annotations kubernetes.io/ingress-bandwidth: rates in bits per
// second (100M, 1G), bursts in bits (default: 10 ms of the rate).
type PortBandwidth struct {
	Ingress      string `yaml:"ingress,omitempty"` // to the guest: policed
	Egress       string `yaml:"egress,omitempty"`  // from the guest: shaped
	IngressBurst string `yaml:"ingressBurst,omitempty"`
	EgressBurst  string `yaml:"egressBurst,omitempty"`
}

// Limits returns the port's rate limits, naming the first bad field.
func (p *Port) Limits() (dataplane.Bandwidth, error) {
	var bw dataplane.Bandwidth
	b := p.Bandwidth
	if b == nil {
		return bw, nil
	}
	for _, f := range []struct {
		name, s string
		rate    bool
		v       *uint64
	}{
		{"ingress", b.Ingress, true, &bw.Ingress.BitsPerSecond}, {"ingressBurst", b.IngressBurst, false, &bw.Ingress.BurstBits},
		{"egress", b.Egress, true, &bw.Egress.BitsPerSecond}, {"egressBurst", b.EgressBurst, false, &bw.Egress.BurstBits},
	} {
		if f.s == "" {
			continue
		}
		parse := bandwidth.ParseQuantity
		if f.rate {
			parse = bandwidth.ParseRate
		}
		v, err := parse(f.s)
		if err != nil {
			return bw, fmt.Errorf("bandwidth.%s: %w", f.name, err)
		}
		*f.v = v
	}
	for _, d := range []struct {
		name string
		r    dataplane.Rate
	}{{"ingress", bw.Ingress}, {"egress", bw.Egress}} {
		if d.r.BitsPerSecond == 0 && d.r.BurstBits != 0 {
			return bw, fmt.Errorf("bandwidth.%sBurst: a burst without bandwidth.%s", d.name, d.name)
		}
	}
	return bw, bw.Validate()
}

// Load reads and validates a config file.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b)
}

// Parse decodes and validates YAML; unknown fields (names match exactly,
// case included) are errors.
func Parse(b []byte) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	// yaml.v3 truncates 1.5 into an int field; nothing here is fractional.
	if err := noFloats(&doc, ""); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(c.CPUs) == 0 {
		var allowed unix.CPUSet
		if err := unix.SchedGetaffinity(0, &allowed); err != nil {
			return nil, fmt.Errorf("config: cpus: reading this process's CPU affinity: %w", err)
		}
		for cpu := 0; cpu < 1024; cpu++ {
			if allowed.IsSet(cpu) {
				c.CPUs = append(c.CPUs, cpu)
			}
		}
	}
	return &c, nil
}

// Validate checks the whole config and reports every problem it finds.
func (c *Config) Validate() error {
	var errs []error
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return fmt.Errorf("cpus: reading this process's CPU affinity: %w", err)
	}
	seen := map[int]bool{}
	for i, cpu := range c.CPUs {
		if cpu < 0 || cpu >= 1024 || !allowed.IsSet(cpu) {
			errs = append(errs, fmt.Errorf("cpus[%d]: CPU %d is not one this process may run on (allowed: %s)", i, cpu, cpuList(&allowed)))
		}
		if seen[cpu] {
			errs = append(errs, fmt.Errorf("cpus[%d]: CPU %d is listed twice", i, cpu))
		}
		seen[cpu] = true
	}
	switch strings.ToLower(c.LogLevel) {
	case "", "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("logLevel: %q is not debug, info, warn or error", c.LogLevel))
	}
	if c.MACAgeSeconds < 0 {
		errs = append(errs, fmt.Errorf("macAgeSeconds: %d must not be negative", c.MACAgeSeconds))
	}
	if c.SlotsPerCPU < 0 || c.SlotsPerCPU > 128 {
		errs = append(errs, fmt.Errorf("slotsPerCPU: %d is outside 1..128", c.SlotsPerCPU))
	}
	for _, f := range []struct{ name, path string }{{"socketRoot", c.SocketRoot}, {"stateDir", c.StateDir}, {"apiSocket", c.APISocket}} {
		if f.path != "" && (!filepath.IsAbs(f.path) || filepath.Clean(f.path) != f.path) {
			errs = append(errs, fmt.Errorf("%s: %q must be an absolute, clean path", f.name, f.path))
		}
	}
	if len(c.APISocket) >= 108 {
		errs = append(errs, fmt.Errorf("apiSocket: %q is %d bytes; a unix socket path must be shorter than 108", c.APISocket, len(c.APISocket)))
	}
	errs = append(errs, c.validateMetrics()...)
	if c.Uplink != nil && c.Uplink.Tap == nil && c.Uplink.AFXDP == nil && c.Uplink.VXLAN == nil {
		errs = append(errs, errors.New("uplink: names no kind (tap, af_xdp or vxlan)"))
	}
	if c.Uplink != nil && (c.Uplink.MaxMACs < 0 || c.Uplink.MaxMACs > MaxUplinkMACs) {
		errs = append(errs, fmt.Errorf("uplink.maxMACs: %d is outside 0..%d (0: the default, %d)", c.Uplink.MaxMACs, MaxUplinkMACs, dataplane.DefaultUplinkMACs))
	}
	if u := c.Uplink; u != nil {
		var kinds []string
		for _, k := range []struct {
			name string
			on   bool
		}{{"tap", u.Tap != nil}, {"af_xdp", u.AFXDP != nil}, {"vxlan", u.VXLAN != nil}} {
			if k.on {
				kinds = append(kinds, k.name)
			}
		}
		if len(kinds) > 1 {
			errs = append(errs, fmt.Errorf("uplink: names %d kinds (%s); a node has one uplink", len(kinds), strings.Join(kinds, " and ")))
		}
		if u.VXLAN != nil {
			errs = append(errs, u.VXLAN.validate()...)
		}
	}
	if r := c.Rebalance; r != nil {
		if r.IntervalSeconds < 0 || r.IntervalSeconds > 86400 {
			errs = append(errs, fmt.Errorf("rebalance.intervalSeconds: %d is outside 0..86400 (0 = off)", r.IntervalSeconds))
		}
		if err := c.RebalanceConfig().Validate(); err != nil && r.IntervalSeconds >= 0 {
			errs = append(errs, err)
		}
	}
	if c.MaxGuestMemoryGiB < 0 || c.MaxGuestMemoryGiB > 1<<16 {
		errs = append(errs, fmt.Errorf("maxGuestMemoryGiB: %d is outside 0..65536 (0 = 1024)", c.MaxGuestMemoryGiB))
	}
	if w := c.Watchdog; w != nil {
		if w.StallMillis < -1 || w.StallMillis > 60000 {
			errs = append(errs, fmt.Errorf("watchdog.stallMillis: %d is outside -1..60000 (0 = 100, -1 = off)", w.StallMillis))
		}
		if w.RingDumpSeconds < 0 || w.RingDumpSeconds > 3600 {
			errs = append(errs, fmt.Errorf("watchdog.ringDumpSeconds: %d is outside 0..3600 (0 = off)", w.RingDumpSeconds))
		}
	}
	if xc := c.AFXDPConfig(); xc != nil {
		if err := xc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("uplink.af_xdp.%w", err))
		}
	}
	if tc := c.TapConfig(); tc != nil {
		if err := tc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("uplink.tap.%w", err))
		}
	}
	names, sockets := map[string]bool{}, map[string]bool{}
	for i := range c.Ports {
		p := &c.Ports[i]
		nc, err := p.NetdevConfig()
		if err != nil {
			errs = append(errs, fmt.Errorf("ports[%d]: %w", i, err))
			continue
		}
		if err := nc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("ports[%d]: %w", i, err))
		}
		switch p.Polling {
		case "", "interrupt", "adaptive", "busy":
		default:
			errs = append(errs, fmt.Errorf("ports[%d]: polling: %q is not interrupt, adaptive or busy", i, p.Polling))
		}
		if _, err := p.Addrs(); err != nil {
			errs = append(errs, fmt.Errorf("ports[%d]: %w", i, err))
		}
		if _, err := p.Limits(); err != nil {
			errs = append(errs, fmt.Errorf("ports[%d]: %w", i, err))
		}
		if names[p.Name] {
			errs = append(errs, fmt.Errorf("ports[%d]: name: %q is used twice", i, p.Name))
		}
		if sockets[p.Socket] {
			errs = append(errs, fmt.Errorf("ports[%d]: socket: %q is used twice", i, p.Socket))
		}
		names[p.Name], sockets[p.Socket] = true, true
	}
	return errors.Join(errs...)
}

// NetdevConfig converts a port entry, applying defaults (MTU 1500).
func (p *Port) NetdevConfig() (netdev.Config, error) {
	nc := netdev.Config{Name: p.Name, Socket: p.Socket, Role: netdev.Role(p.Role), QueuePairs: p.QueuePairs, MTU: p.MTU}
	if nc.MTU == 0 {
		nc.MTU = 1500
	}
	if p.MAC != "" {
		mac, err := net.ParseMAC(p.MAC)
		if err != nil || len(mac) != 6 {
			return nc, fmt.Errorf("mac: %q is not an Ethernet address like 52:54:00:12:34:56", p.MAC)
		}
		nc.MAC = mac
	}
	return nc, nil
}

// MaxIPs is the most addresses a port may list (the agent's bound on a
// port's ip.addresses).
const MaxIPs = 8

// Addrs returns the port's ips, naming the first bad one.
func (p *Port) Addrs() ([]netip.Addr, error) {
	if len(p.IPs) > MaxIPs {
		return nil, fmt.Errorf("ips: %d addresses; at most %d", len(p.IPs), MaxIPs)
	}
	var out []netip.Addr
	for i, s := range p.IPs {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil || a.Zone() != "":
			return nil, fmt.Errorf("ips[%d]: %q is not an IP address", i, s)
		case a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
			return nil, fmt.Errorf("ips[%d]: %q cannot be a guest's address", i, s)
		}
		for j, b := range out {
			if a.Unmap() == b {
				return nil, fmt.Errorf("ips[%d]: %q is ips[%d] again", i, s, j)
			}
		}
		out = append(out, a.Unmap()) // guests send IPv4 from IPv4 addresses
	}
	return out, nil
}

// cpuList formats a CPU set as "0-3,6".
func cpuList(set *unix.CPUSet) string {
	var parts []string
	for cpu := 0; cpu < 1024; cpu++ {
		if !set.IsSet(cpu) {
			continue
		}
		end := cpu
		for end+1 < 1024 && set.IsSet(end+1) {
			end++
		}
		if end == cpu {
			parts = append(parts, fmt.Sprint(cpu))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpu, end))
		}
		cpu = end
	}
	return strings.Join(parts, ",")
}

func noFloats(n *yaml.Node, path string) error {
	switch n.Kind {
	case yaml.ScalarNode:
		// A rate limit is a quantity: 1.5e9 is one.
		if n.Tag == "!!float" && !strings.Contains(path, ".bandwidth.") {
			return fmt.Errorf("%s: %q is not a whole number", strings.TrimPrefix(path, "."), n.Value)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := noFloats(n.Content[i+1], path+"."+n.Content[i].Value); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			if err := noFloats(c, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := noFloats(c, path); err != nil {
				return err
			}
		}
	}
	return nil
}
