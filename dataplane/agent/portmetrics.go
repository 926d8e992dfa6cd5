package agent

import (
	"cmp"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// The ports' metrics are most of /metrics: some 30 series a port of one
// queue pair, 26 more a pair. Made as const metrics at every scrape they
// cost the registry a metric object, a label slice, a consistency hash and
// a sort each, and the garbage of them (#27: 37 MB a scrape at 1024
// ports). Collectors made once a port (CounterFunc and the like) would
// keep most of that: the registry writes every metric into a new dto
// message, hashes it and sorts each family at every Gather. Here each
// port's series are built once, as the dto messages the encoder reads, and
// served through promhttp's transactional gatherer: a scrape only sets
// their values, and the encoding is what grows with the ports. They are
// built again when their labels or their set change (a rebalance moves a
// pair: its cpu label; a frontend attaches: port_memory_sealed appears),
// and merged into the sorted families then.

// Label names; pod labels come from the port's k8s.pod.* labels. Label
// pairs point at these: the names are shared by every series.
var (
	lPort, lQueue, lSlot, lCPU, lNamespace, lPod = "port", "queue", "slot", "cpu", "namespace", "pod"
)

// portFamily is one family of the ports' metrics. queue_* families carry
// the queue's labels (port, queue, slot, cpu, namespace, pod), the others
// the port's (port, namespace, pod); extra names one more label, whose
// value each series gives.
type portFamily struct {
	name, help string
	typ        dto.MetricType
	extra      string
	idx        int // in portFamilies
}

var portFamilies []*portFamily

func portFamilyOf(typ dto.MetricType, name, help, extra string) *portFamily {
	f := &portFamily{name: "vhostmq_" + name, help: help, typ: typ, extra: extra, idx: len(portFamilies)}
	portFamilies = append(portFamilies, f)
	return f
}

func counterFamily(name, help, extra string) *portFamily {
	return portFamilyOf(dto.MetricType_COUNTER, name, help, extra)
}

func gaugeFamily(name, help, extra string) *portFamily {
	return portFamilyOf(dto.MetricType_GAUGE, name, help, extra)
}

var (
	famPackets   = counterFamily("queue_packets_total", "Frames through a queue pair; direction rx is toward the guest, tx from it.", "direction")
	famBytes     = counterFamily("queue_bytes_total", "Frame bytes through a queue pair.", "direction")
	famDrops     = counterFamily("queue_drops_total", "Frames dropped, by reason.", "reason")
	famKicks     = counterFamily("queue_kicks_total", "Guest notifications (kick eventfd wake-ups) received.", "")
	famCalls     = counterFamily("queue_calls_total", "Guest interrupts (call eventfd writes) sent.", "")
	famQBusy     = counterFamily("queue_busy_seconds_total", "Worker time spent moving this pair's guest TX.", "")
	famQBursts   = counterFamily("queue_bursts_total", "Bursts that moved this pair's guest TX; busy seconds over bursts is the cost per burst.", "")
	famStalls    = counterFamily("queue_stalls_total", "Times the stall watchdog found this pair's guest TX ring with entries its worker could have taken and did not, and served it again.", "")
	famHeld      = counterFamily("queue_held_total", "Frames for this pair's guest that found its RX ring full and waited at their source instead of being dropped.", "")
	famHoldExp   = counterFamily("queue_hold_expired_total", "Held frames for this pair's guest dropped after the hold bound (also counted as drops, reason rx_no_buffer).", "")
	famShaped    = counterFamily("queue_shaped_total", "Bursts from this pair's guest that the port's egress rate limit cut short, leaving its frames in the ring for later (shaped: nothing is dropped).", "")
	famLimit     = gaugeFamily("port_bandwidth_limit_bits_per_second", "The port's rate limit by direction (ingress: to the guest, policed, drops reason rate_limited; egress: from it, shaped); no series for a direction without one.", "direction")
	famEnabled   = gaugeFamily("queue_enabled", "1 when both rings of the pair can carry traffic.", "")
	famOffload   = counterFamily("queue_offload_frames_total", "Frames with offload metadata delivered to the pair's guest: gso_whole (a GSO frame passed whole), gso_segmented (a GSO frame segmented in software), csum_software (a partial checksum completed in software).", "offload")
	famConnected = gaugeFamily("port_connected", "1 while a vhost-user frontend is attached.", "")
	famConnects  = counterFamily("port_connects_total", "vhost-user sessions since the port was created (reconnects + 1).", "")
	famFaults    = counterFamily("port_faults_total", "Sessions ended because the frontend took back memory it shared (a fault in guest_memory or the dirty_log); the port serves its next frontend.", "reason")
	famSealed    = gaugeFamily("port_memory_sealed", "1 when the session's memory and dirty log are sealed against shrinking (F_SEAL_SHRINK): the frontend cannot take them back.", "")
	famDHCP      = counterFamily("dhcp_messages_total", "DHCP messages of a port's guest answered by the dataplane, by type (malformed: dropped; ignored: not ours to answer).", "type")
)

// portMetrics gathers the registry's metrics and the ports' families. It
// is transactional: the families stay as they are from Gather until done
// while promhttp encodes them, so a second scrape waits for the first.
type portMetrics struct {
	a   *Agent
	reg prometheus.Gatherer
	mu  sync.Mutex // from Gather until done; guards the rest
	// done is mu.Unlock, made once: a method value per scrape allocates
	done  func()
	ports map[*record]*portSeries
	fams  []*dto.MetricFamily // by portFamily.idx
	out   []*dto.MetricFamily
	// stale are the metrics of series built again or gone, added the
	// series built, since the families were last put in order (regroup)
	stale map[*dto.Metric]struct{}
	added []series
	// extras are the extra label pairs, shared by every series with one
	extras map[[2]string]*dto.LabelPair
	buf    dataplane.PortStats // each port's reading, reused
}

var _ prometheus.TransactionalGatherer = (*portMetrics)(nil)

func newPortMetrics(a *Agent, reg prometheus.Gatherer) *portMetrics {
	g := &portMetrics{a: a, reg: reg, ports: map[*record]*portSeries{}, extras: map[[2]string]*dto.LabelPair{}, stale: map[*dto.Metric]struct{}{}}
	g.done = g.mu.Unlock
	for _, f := range portFamilies {
		g.fams = append(g.fams, &dto.MetricFamily{Name: proto.String(f.name), Help: proto.String(f.help), Type: f.typ.Enum()})
	}
	return g
}

// Gather implements prometheus.TransactionalGatherer: the families sorted
// by name, as the registry's are; the ports' without series left out, as
// the registry leaves out a family no collector gave a metric of.
func (g *portMetrics) Gather() ([]*dto.MetricFamily, func(), error) {
	node, err := g.reg.Gather()
	g.mu.Lock()
	g.update()
	out := append(g.out[:0], node...)
	for _, f := range g.fams {
		if len(f.Metric) > 0 {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(x, y *dto.MetricFamily) int { return cmp.Compare(x.GetName(), y.GetName()) })
	g.out = out
	return out, g.done, err
}

// warm builds every port's series.
func (g *portMetrics) warm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.update()
}

// update reads every port: its series are those of the agent's ports that
// the dataplane has (as GetStats lists them).
func (g *portMetrics) update() {
	a := g.a
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, r := range a.ports {
		if g.ports[r] == nil {
			g.ports[r] = newPortSeries(r)
		}
	}
	if len(g.ports) > len(a.ports) {
		for r, s := range g.ports {
			if a.ports[r.spec.Id] != r {
				g.retire(s)
				delete(g.ports, r)
			}
		}
	}
	for _, s := range g.ports {
		ok := a.dp.ReadPortStats(s.r.spec.Id, &g.buf)
		switch {
		case ok != s.present || ok && !s.fits(&g.buf):
			s.build(g, ok, &g.buf)
		case ok && !s.walk(g, &g.buf, false): // a series fits misses came or went
			s.build(g, true, &g.buf)
		}
	}
	if len(g.stale) > 0 || len(g.added) > 0 {
		g.regroup()
	}
}

// retire marks s's series stale: regroup takes them out of their families.
func (g *portMetrics) retire(s *portSeries) {
	for _, x := range s.series {
		g.stale[x.m] = struct{}{}
	}
}

// regroup takes the stale series out of their families and merges the
// added ones in, in order: a port that comes, goes or changes costs a pass
// over the families, not a sort of them.
func (g *portMetrics) regroup() {
	byFam := make([][]*dto.Metric, len(g.fams))
	for _, x := range g.added {
		if _, gone := g.stale[x.m]; !gone {
			byFam[x.fam.idx] = append(byFam[x.fam.idx], x.m)
		}
	}
	for i, f := range g.fams {
		add := byFam[i]
		slices.SortFunc(add, compareMetrics)
		merged := make([]*dto.Metric, 0, len(f.Metric)+len(add))
		for _, m := range f.Metric {
			if _, gone := g.stale[m]; gone {
				continue
			}
			for len(add) > 0 && compareMetrics(add[0], m) < 0 {
				merged, add = append(merged, add[0]), add[1:]
			}
			merged = append(merged, m)
		}
		f.Metric = append(merged, add...)
	}
	clear(g.stale)
	clear(g.added)
	g.added = g.added[:0]
}

// compareMetrics orders a family's metrics by their label values, as the
// registry does (their labels sorted by name).
func compareMetrics(x, y *dto.Metric) int {
	if c := cmp.Compare(len(x.Label), len(y.Label)); c != 0 {
		return c
	}
	for i, l := range x.Label {
		if c := cmp.Compare(l.GetValue(), y.Label[i].GetValue()); c != 0 {
			return c
		}
	}
	return 0
}

// portSeries are one port's series, with what shaped them.
type portSeries struct {
	r       *record
	id      string
	present bool // the dataplane has the port: it has series
	// connected (port_memory_sealed), dhcp (dhcp_messages_total) and
	// each pair's worker CPU (the cpu label) when built
	connected, dhcp bool
	limited         [2]bool // ingress, egress: port_bandwidth_limit_bits_per_second
	cpus            []int
	labels          []*dto.LabelPair   // port, namespace, pod
	queues          [][]*dto.LabelPair // by pair: port, queue, slot, cpu, namespace, pod
	series          []series
}

type series struct {
	fam   *portFamily
	extra string // the value of fam's extra label
	m     *dto.Metric
	v     *float64 // m's counter or gauge value
}

func newPortSeries(r *record) *portSeries {
	s := &portSeries{r: r, id: r.spec.Id}
	ns, pod := r.spec.Labels["k8s.pod.namespace"], r.spec.Labels["k8s.pod.name"]
	s.labels = []*dto.LabelPair{{Name: &lPort, Value: &s.id}, {Name: &lNamespace, Value: &ns}, {Name: &lPod, Value: &pod}}
	return s
}

// fits reports whether the series built match the port's reading.
func (s *portSeries) fits(ps *dataplane.PortStats) bool {
	if ps.Connected != s.connected || (ps.DHCP != nil) != s.dhcp || limited(ps) != s.limited || len(ps.Queues) != len(s.cpus) {
		return false
	}
	for i, q := range ps.Queues {
		if q.CPU != s.cpus[i] {
			return false
		}
	}
	return true
}

// build makes the port's series anew for its reading (none when the
// dataplane does not have it).
func (s *portSeries) build(g *portMetrics, present bool, ps *dataplane.PortStats) {
	g.retire(s)
	s.present, s.series, s.queues, s.cpus = present, nil, nil, nil
	if !present {
		return
	}
	s.connected, s.dhcp, s.limited = ps.Connected, ps.DHCP != nil, limited(ps)
	for _, q := range ps.Queues {
		pair, cpu, slot := strconv.Itoa(q.Pair), strconv.Itoa(q.CPU), ""
		if q.Pair < len(s.r.slots) {
			slot = s.r.slots[q.Pair].id
		}
		s.cpus = append(s.cpus, q.CPU)
		s.queues = append(s.queues, []*dto.LabelPair{s.labels[0], {Name: &lQueue, Value: &pair}, {Name: &lSlot, Value: &slot},
			{Name: &lCPU, Value: &cpu}, s.labels[1], s.labels[2]})
	}
	s.walk(g, ps, true)
	g.added = append(g.added, s.series...)
}

// limited says which directions of the port have a rate limit.
func limited(ps *dataplane.PortStats) [2]bool {
	return [2]bool{ps.Bandwidth.Ingress.BitsPerSecond != 0, ps.Bandwidth.Egress.BitsPerSecond != 0}
}

// walk sets the port's series from its reading, in one fixed order; with
// build it appends them first. Building and setting walk the same code, so
// they cannot disagree on which value goes where; and a reading that has
// series the port's do not (by family and extra label) is not set: walk
// reports false, and the port's series are built again.
func (s *portSeries) walk(g *portMetrics, ps *dataplane.PortStats, build bool) bool {
	i, fit := 0, true
	add := func(f *portFamily, base []*dto.LabelPair, extra string, v float64) {
		if build {
			s.series = append(s.series, g.newSeries(f, base, extra))
		}
		if !fit || i >= len(s.series) || s.series[i].fam != f || s.series[i].extra != extra {
			fit = false
			return
		}
		*s.series[i].v = v
		i++
	}
	l := s.labels
	add(famConnected, l, "", b2f(ps.Connected))
	if d := ps.DHCP; d != nil {
		for _, m := range []struct {
			typ string
			v   uint64
		}{{"discover", d.Discovers}, {"request", d.Requests}, {"decline", d.Declines}, {"release", d.Releases},
			{"inform", d.Informs}, {"offer", d.Offers}, {"ack", d.Acks}, {"nak", d.Naks},
			{"malformed", d.Malformed}, {"ignored", d.Ignored}} {
			add(famDHCP, l, m.typ, float64(m.v))
		}
	}
	add(famConnects, l, "", float64(ps.Connects))
	if b := ps.Bandwidth.Ingress.BitsPerSecond; b != 0 {
		add(famLimit, l, "ingress", float64(b))
	}
	if b := ps.Bandwidth.Egress.BitsPerSecond; b != 0 {
		add(famLimit, l, "egress", float64(b))
	}
	add(famFaults, l, string(netdev.FaultGuestMemory), float64(ps.Faults.GuestMemory))
	add(famFaults, l, string(netdev.FaultDirtyLog), float64(ps.Faults.DirtyLog))
	if ps.Connected {
		add(famSealed, l, "", b2f(ps.Memory.Sealed()))
	}
	for qi, q := range ps.Queues {
		l := s.queues[qi]
		add(famPackets, l, "rx", float64(q.RxPackets))
		add(famPackets, l, "tx", float64(q.TxPackets))
		add(famBytes, l, "rx", float64(q.RxBytes))
		add(famBytes, l, "tx", float64(q.TxBytes))
		d := q.Drops
		for _, r := range []struct {
			reason string
			v      uint64
		}{{"rx_no_buffer", d.RxNoBuffer}, {"rx_disabled", d.RxDisabled}, {"tx_disabled", d.TxDisabled},
			{"bad_chain", d.BadChain}, {"mtu", d.MTU}, {"runt", d.Runt}, {"no_destination", d.NoDestination}, {"spoofed", d.Spoofed},
			{"bad_offload", d.BadOffload}, {"rate_limited", d.RateLimited}} {
			add(famDrops, l, r.reason, float64(r.v))
		}
		for _, k := range []struct {
			kind string
			v    uint64
		}{{"gso_whole", q.Offload.GSOWhole}, {"gso_segmented", q.Offload.GSOSegmented}, {"csum_software", q.Offload.CsumSoftware}} {
			add(famOffload, l, k.kind, float64(k.v))
		}
		add(famKicks, l, "", float64(q.Kicks))
		add(famCalls, l, "", float64(q.Calls))
		add(famQBusy, l, "", float64(q.BusyNs)/1e9)
		add(famQBursts, l, "", float64(q.Bursts))
		add(famStalls, l, "", float64(q.Stalls))
		add(famHeld, l, "", float64(q.Held))
		add(famHoldExp, l, "", float64(d.RxHoldExpired))
		add(famShaped, l, "", float64(q.Shaped))
		add(famEnabled, l, "", b2f(q.RxEnabled && q.TxEnabled))
	}
	return fit && i == len(s.series)
}

// newSeries makes one series of f: base's labels and f's extra, sorted by
// name as the registry sorts them.
func (g *portMetrics) newSeries(f *portFamily, base []*dto.LabelPair, extra string) series {
	labels := make([]*dto.LabelPair, len(base), len(base)+1)
	copy(labels, base)
	if f.extra != "" {
		k := [2]string{f.extra, extra}
		p := g.extras[k]
		if p == nil {
			p = &dto.LabelPair{Name: proto.String(f.extra), Value: proto.String(extra)}
			g.extras[k] = p
		}
		labels = append(labels, p)
	}
	slices.SortFunc(labels, func(x, y *dto.LabelPair) int { return cmp.Compare(x.GetName(), y.GetName()) })
	v := new(float64)
	m := &dto.Metric{Label: labels}
	if f.typ == dto.MetricType_GAUGE {
		m.Gauge = &dto.Gauge{Value: v}
	} else {
		m.Counter = &dto.Counter{Value: v}
	}
	return series{fam: f, extra: extra, m: m, v: v}
}
