package dataplane

import (
	"encoding/json"
	"sort"

	"github.com/vhostmq/vhostmq/dataplane/netdev"
	"github.com/vhostmq/vhostmq/internal/atomicfile"
)

// PortStats is a snapshot of one port. In queue counters "rx" is toward the
// guest (the guest receives) and "tx" is from the guest.
type PortStats struct {
	Name         string       `json:"name"`
	Socket       string       `json:"socket"`
	Role         string       `json:"role"`
	Connected    bool         `json:"connected"`
	Connects     uint64       `json:"connects"`
	QueuePairs   int          `json:"queuePairs"`
	EnabledPairs int          `json:"enabledPairs"`
	MTU          int          `json:"mtu"`
	Network      string       `json:"network,omitempty"`
	VLAN         int          `json:"vlan,omitempty"`
	Queues       []QueueStats `json:"queues"`
	DHCP         *DHCPStats   `json:"dhcp,omitempty"` // nil: the dataplane does not answer DHCP for this port
	// Faults counts sessions that ended because the frontend took back
	// memory it shared (netdev/fault.go).
	Faults netdev.FaultCounts `json:"faults"`
	// Memory says whether the frontend can still take its memory back.
	Memory netdev.MemorySeals `json:"memory"`
	// ControlThrottled counts control messages that waited for the port's
	// control budget (netdev.ControlRate).
	ControlThrottled uint64 `json:"controlThrottled"`
	// Bandwidth is the port's rate limits (bandwidth.go).
	Bandwidth Bandwidth `json:"bandwidth"`
}

// QueueStats is a snapshot of one queue pair.
type QueueStats struct {
	Pair      int          `json:"pair"`
	CPU       int          `json:"cpu"`
	Worker    int          `json:"worker"`
	RxEnabled bool         `json:"rxEnabled"`
	TxEnabled bool         `json:"txEnabled"`
	RxPackets uint64       `json:"rxPackets"`
	RxBytes   uint64       `json:"rxBytes"`
	TxPackets uint64       `json:"txPackets"`
	TxBytes   uint64       `json:"txBytes"`
	Kicks     uint64       `json:"kicks"`
	Calls     uint64       `json:"calls"`
	NUMA      int          `json:"numa"`   // the worker CPU's NUMA node
	BusyNs    uint64       `json:"busyNs"` // worker time spent moving this pair's guest TX (with Bursts: at most 20 µs behind, worker.publish)
	Bursts    uint64       `json:"bursts"` // bursts that moved frames: BusyNs/Bursts is the cost per burst
	Drops     QueueDrops   `json:"drops"`
	Offload   OffloadStats `json:"offload"`
	// Stalls counts the times the watchdog found the TX ring with entries
	// waiting that its worker could have taken and did not (watchdog.go).
	Stalls uint64 `json:"stalls"`
	// Held counts frames for this guest that found its RX ring full and
	// waited at their source instead of being dropped (hold.go).
	Held uint64 `json:"held"`
	// Shaped counts the bursts from this pair's guest that the port's
	// egress limit cut short, leaving its frames in the ring for later.
	Shaped uint64 `json:"shaped"`
}

// OffloadStats count what checksum and segmentation offloads did for the
// frames this pair's guest received.
type OffloadStats struct {
	GSOWhole     uint64 `json:"gsoWhole"`     // GSO frames delivered whole (the guest takes them)
	GSOSegmented uint64 `json:"gsoSegmented"` // GSO frames segmented in software for the guest
	CsumSoftware uint64 `json:"csumSoftware"` // partial checksums completed in software for the guest
}

// QueueDrops counts frames dropped, by reason.
type QueueDrops struct {
	RxNoBuffer    uint64 `json:"rxNoBuffer"`    // the guest had no RX buffer (or one too small)
	RxDisabled    uint64 `json:"rxDisabled"`    // the RX ring was not ready
	TxDisabled    uint64 `json:"txDisabled"`    // sent on a started but disabled ring: discarded
	BadChain      uint64 `json:"badChain"`      // ring protocol violations (the ring stops)
	MTU           uint64 `json:"mtu"`           // longer than the port's MTU allows
	Runt          uint64 `json:"runt"`          // shorter than an Ethernet header
	NoDestination uint64 `json:"noDestination"` // no port to deliver to
	BadOffload    uint64 `json:"badOffload"`    // offload metadata that does not fit the frame
	RxHoldExpired uint64 `json:"rxHoldExpired"` // held for a full RX ring past the bound, then dropped (also in rxNoBuffer)
	Spoofed       uint64 `json:"spoofed"`       // sent from a MAC or IP address that is not the port's (port security)
	RateLimited   uint64 `json:"rateLimited"`   // to the guest, above the port's ingress limit (bandwidth.go)
}

// Stats returns a snapshot of every port, sorted by name.
func (d *Dataplane) Stats() []PortStats {
	d.mu.Lock()
	ports := make([]*port, 0, len(d.byName))
	for _, p := range d.byName {
		ports = append(ports, p)
	}
	d.mu.Unlock()
	out := make([]PortStats, 0, len(ports))
	for _, p := range ports {
		out = append(out, p.stats())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PortStats returns a snapshot of one port.
func (d *Dataplane) PortStats(name string) (PortStats, bool) {
	d.mu.Lock()
	p, ok := d.byName[name]
	d.mu.Unlock()
	if !ok {
		return PortStats{}, false
	}
	return p.stats(), true
}

// ReadPortStats is PortStats into ps, reusing ps.Queues: a reader of every
// port at every scrape (the agent's metrics) allocates nothing for the
// ports without DHCP, and one DHCPStats for each with.
func (d *Dataplane) ReadPortStats(name string, ps *PortStats) bool {
	d.mu.Lock()
	p, ok := d.byName[name]
	d.mu.Unlock()
	if ok {
		p.statsInto(ps)
	}
	return ok
}

func (p *port) stats() PortStats {
	var ps PortStats
	p.statsInto(&ps)
	return ps
}

func (p *port) statsInto(ps *PortStats) {
	cfg := p.dev.Config()
	*ps = PortStats{Name: cfg.Name, Socket: cfg.Socket, Role: string(cfg.Role), Connected: p.dev.Connected(),
		Faults: p.dev.Faults(), Memory: p.dev.MemorySeals(), ControlThrottled: p.dev.ControlThrottled(),
		Connects: p.dev.Connects(), QueuePairs: cfg.QueuePairs, MTU: p.dev.MTU(), Network: p.net.name, VLAN: p.net.vlan,
		DHCP: p.dhcp.stats(), Bandwidth: p.bandwidth(), Queues: ps.Queues[:0]}
	vr := p.dev.Vrings()
	for i := range cfg.QueuePairs {
		rx, tx := vr[2*i], vr[2*i+1]
		w, a := p.workers[i].Load(), p.assigns[i]
		qs := QueueStats{Pair: i, CPU: w.cpu, Worker: w.id, NUMA: p.numa(w), BusyNs: a.busyNs.Load(), Bursts: a.bursts.Load()}
		qs.RxEnabled, qs.TxEnabled = ready(rx), ready(tx)
		if qs.RxEnabled && qs.TxEnabled {
			ps.EnabledPairs++
		}
		rc, tc := &rx.Counters, &tx.Counters
		qs.RxPackets, qs.RxBytes = rc.Packets.Load(), rc.Bytes.Load()
		qs.TxPackets, qs.TxBytes = tc.Packets.Load(), tc.Bytes.Load()
		qs.Kicks = tc.Kicks.Load() + rc.Kicks.Load()
		qs.Calls = tc.Calls.Load() + rc.Calls.Load()
		qs.Drops = QueueDrops{
			RxNoBuffer:    rc.DropNoBuf.Load(),
			RxDisabled:    rc.DropDisable.Load(),
			TxDisabled:    tc.DropDisable.Load(),
			BadChain:      rc.DropBad.Load() + tc.DropBad.Load(),
			MTU:           tc.DropMTU.Load(),
			Runt:          tc.DropRunt.Load(),
			NoDestination: tc.DropNoDest.Load(),
			BadOffload:    tc.DropOffload.Load(),
		}
		qs.Stalls, qs.Held = tc.Stalls.Load(), rc.Held.Load()
		qs.Drops.RxHoldExpired = rc.HoldExpired.Load()
		qs.Drops.Spoofed = tc.DropSpoofed.Load()
		qs.Drops.RateLimited = rc.DropRateLimited.Load()
		qs.Shaped = tc.Shaped.Load()
		qs.Offload = OffloadStats{GSOWhole: rc.GSOWhole.Load(), GSOSegmented: rc.GSOSegmented.Load(), CsumSoftware: rc.CsumSoftware.Load()}
		ps.Queues = append(ps.Queues, qs)
	}
}

func ready(v *netdev.Vring) bool {
	v.Lock()
	defer v.Unlock()
	return v.Queue() != nil
}

// WriteStatsFile writes the stats as JSON, atomically (temp file + rename),
// so a reader never sees a partial file.
func (d *Dataplane) WriteStatsFile(path string) error {
	var up *UplinkStats
	if u, ok := d.UplinkStats(); ok {
		up = &u
	}
	b, err := json.MarshalIndent(struct {
		Ports  []PortStats  `json:"ports"`
		Uplink *UplinkStats `json:"uplink,omitempty"`
	}{d.Stats(), up}, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteBytes(path, append(b, '\n'), 0o644, false)
}

func (p *port) numa(w *worker) int { return w.dp.topo.Node(w.cpu) }

// WorkerStats is one worker's load.
type WorkerStats struct {
	ID           int
	CPU          int
	NUMA         int
	BusyNs       uint64 // time spent moving frames (its queues' and its uplink queue's)
	UplinkBusyNs uint64 // the uplink queue's part of BusyNs: it cannot move
	Sleeps       uint64 // times it slept waiting for kicks
	Queues       int    // queue pairs it serves
	Active       int    // of those, the TX rings its passes visit (the others are parked: active.go)
}

// WorkerStats returns every worker's load counters.
func (d *Dataplane) WorkerStats() []WorkerStats {
	out := make([]WorkerStats, len(d.workers))
	for i, w := range d.workers {
		out[i] = WorkerStats{ID: w.id, CPU: w.cpu, NUMA: d.topo.Node(w.cpu), BusyNs: w.busyNs.Load(), UplinkBusyNs: w.upBusyNs.Load(),
			Sleeps: w.sleeps.Load(), Queues: len(w.list.Load().list), Active: int(w.activeN.Load())}
	}
	return out
}
