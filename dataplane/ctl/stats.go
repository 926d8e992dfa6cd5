package ctl

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/spf13/pflag"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// dropReasons names the Drops fields, in proto order (rx_hold_expired is
// left out: those drops are counted in rx_no_buffer too); counters.drops
// is indexed the same way.
var dropReasons = [10]string{"rx_no_buffer", "rx_disabled", "tx_disabled", "bad_chain", "mtu", "runt", "no_destination", "bad_offload", "spoofed", "rate_limited"}

// offloadKinds names the Offload fields, in proto order; counters.offload
// is indexed the same way.
var offloadKinds = [3]string{"gso_whole", "gso_segmented", "csum_software"}

// counters are one queue pair's (or a sum of pairs') counters.
type counters struct {
	rxPkts, rxBytes, txPkts, txBytes uint64
	kicks, calls, busyNs, bursts     uint64
	stalls, held                     uint64
	shaped                           uint64 // egress bursts the port's limit cut short
	drops                            [len(dropReasons)]uint64
	offload                          [len(offloadKinds)]uint64
}

func queueCounters(q *agentv1.QueueStats) counters {
	d, o := q.GetDrops(), q.GetOffload()
	return counters{
		rxPkts: q.GetRx().GetPackets(), rxBytes: q.GetRx().GetBytes(),
		txPkts: q.GetTx().GetPackets(), txBytes: q.GetTx().GetBytes(),
		kicks: q.GetKicks(), calls: q.GetCalls(), busyNs: q.GetBusyNs(), bursts: q.GetBursts(),
		stalls: q.GetStalls(), held: q.GetHeld(), shaped: q.GetShaped(),
		drops: [...]uint64{d.GetRxNoBuffer(), d.GetRxDisabled(), d.GetTxDisabled(), d.GetBadChain(), d.GetMtu(), d.GetRunt(), d.GetNoDestination(),
			d.GetBadOffload(), d.GetSpoofed(), d.GetRateLimited()},
		offload: [...]uint64{o.GetGsoWhole(), o.GetGsoSegmented(), o.GetCsumSoftware()},
	}
}

func (c *counters) add(o counters) {
	c.rxPkts += o.rxPkts
	c.rxBytes += o.rxBytes
	c.txPkts += o.txPkts
	c.txBytes += o.txBytes
	c.kicks += o.kicks
	c.calls += o.calls
	c.busyNs += o.busyNs
	c.bursts += o.bursts
	c.stalls += o.stalls
	c.held += o.held
	c.shaped += o.shaped
	for i := range c.drops {
		c.drops[i] += o.drops[i]
	}
	for i := range c.offload {
		c.offload[i] += o.offload[i]
	}
}

// since returns the growth from prev to c. A counter that went down was
// reset (the port was re-created): its growth is its current value.
func (c counters) since(prev counters) counters {
	d := func(cur, old uint64) uint64 {
		if cur < old {
			return cur
		}
		return cur - old
	}
	out := counters{
		rxPkts: d(c.rxPkts, prev.rxPkts), rxBytes: d(c.rxBytes, prev.rxBytes),
		txPkts: d(c.txPkts, prev.txPkts), txBytes: d(c.txBytes, prev.txBytes),
		kicks: d(c.kicks, prev.kicks), calls: d(c.calls, prev.calls), busyNs: d(c.busyNs, prev.busyNs),
		bursts: d(c.bursts, prev.bursts), stalls: d(c.stalls, prev.stalls), held: d(c.held, prev.held),
		shaped: d(c.shaped, prev.shaped),
	}
	for i := range c.drops {
		out.drops[i] = d(c.drops[i], prev.drops[i])
	}
	for i := range c.offload {
		out.offload[i] = d(c.offload[i], prev.offload[i])
	}
	return out
}

func (c counters) dropTotal() uint64 {
	var n uint64
	for _, v := range c.drops {
		n += v
	}
	return n
}

// rates are counters' growth per second over an interval.
type rates struct {
	rxPps, rxBps, txPps, txBps float64
	kicks, calls               float64
	busyPct                    float64
	drops                      [len(dropReasons)]float64
	dropTotal                  float64
	held                       float64 // frames held back for a full RX ring
	shaped                     float64 // egress bursts cut short by the port's limit
	offload                    [len(offloadKinds)]float64
}

func (c counters) per(seconds float64) rates {
	f := func(n uint64) float64 { return float64(n) / seconds }
	r := rates{
		rxPps: f(c.rxPkts), rxBps: 8 * f(c.rxBytes),
		txPps: f(c.txPkts), txBps: 8 * f(c.txBytes),
		kicks: f(c.kicks), calls: f(c.calls),
		busyPct:   100 * f(c.busyNs) / 1e9,
		dropTotal: f(c.dropTotal()),
		held:      f(c.held),
		shaped:    f(c.shaped),
	}
	for i, v := range c.drops {
		r.drops[i] = f(v)
	}
	for i, v := range c.offload {
		r.offload[i] = f(v)
	}
	return r
}

// statsSample is the outcome of sampling: the latest counters and, when
// sampling over an interval, the growth during it.
type statsSample struct {
	cur     *agentv1.GetStatsResponse
	prev    *agentv1.GetStatsResponse // nil for absolute counters
	seconds float64                   // length of the interval
}

// sampleStats gets the stats once (interval 0) or twice, interval apart.
// The interval is measured with the agent's timestamps when it sets them.
func (c *cli) sampleStats(ctx context.Context, ids []string, interval time.Duration) (statsSample, error) {
	req := &agentv1.GetStatsRequest{Ids: ids}
	first, err := call(ctx, c, agentv1.AgentClient.GetStats, req)
	if err != nil {
		return statsSample{}, err
	}
	t0 := c.now()
	if interval <= 0 {
		return statsSample{cur: first}, nil
	}
	if err := c.sleep(ctx, interval); err != nil {
		return statsSample{}, err
	}
	second, err := call(ctx, c, agentv1.AgentClient.GetStats, req)
	if err != nil {
		return statsSample{}, err
	}
	return statsSample{cur: second, prev: first, seconds: sampleSeconds(first, second, t0, c.now(), interval)}, nil
}

// sampleSeconds is the time between two stats samples: by the agent's
// timestamps when it sets them, else by ours (t0, t1), else the interval
// asked for.
func sampleSeconds(first, second *agentv1.GetStatsResponse, t0, t1 time.Time, interval time.Duration) float64 {
	switch a, b := first.GetTimeUnixNano(), second.GetTimeUnixNano(); {
	case a > 0 && b > a:
		return float64(b-a) / 1e9
	case t1.After(t0):
		return t1.Sub(t0).Seconds()
	}
	return interval.Seconds()
}

// queueRow is one queue pair's latest counters and, over an interval, its
// growth (nil when the first sample did not have the pair).
type queueRow struct {
	port  *agentv1.PortStats
	q     *agentv1.QueueStats
	cur   counters
	delta *counters
}

type portRow struct {
	ps     *agentv1.PortStats
	queues []queueRow
	total  counters
	delta  *counters // sum of the pairs' growth; nil without an interval
}

// rows joins the two samples per port and pair. order, when not empty,
// is the order of the ports; otherwise they are sorted by ID.
func (s statsSample) rows(order []string) []portRow {
	prev := map[string]map[uint32]counters{}
	if s.prev != nil {
		for _, ps := range s.prev.GetPorts() {
			m := map[uint32]counters{}
			for _, q := range ps.GetQueues() {
				m[q.GetPair()] = queueCounters(q)
			}
			prev[ps.GetId()] = m
		}
	}
	var out []portRow
	for _, ps := range s.cur.GetPorts() {
		pr := portRow{ps: ps}
		old, hadPort := prev[ps.GetId()]
		if hadPort {
			pr.delta = &counters{}
		}
		queues := slices.Clone(ps.GetQueues())
		sort.SliceStable(queues, func(i, j int) bool { return queues[i].GetPair() < queues[j].GetPair() })
		for _, q := range queues {
			qr := queueRow{port: ps, q: q, cur: queueCounters(q)}
			if o, ok := old[q.GetPair()]; ok {
				d := qr.cur.since(o)
				qr.delta = &d
				pr.delta.add(d)
			}
			pr.total.add(qr.cur)
			pr.queues = append(pr.queues, qr)
		}
		out = append(out, pr)
	}
	rank := func(id string) int {
		if i := slices.Index(order, id); i >= 0 {
			return i
		}
		return len(order)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].ps.GetId(), out[j].ps.GetId()
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra < rb
		}
		return a < b
	})
	return out
}

func statsSetup(fs *pflag.FlagSet) runFunc {
	interval := DefaultInterval
	fs.Var(&durationValue{p: &interval}, "interval", "sample rates over `DURATION`; 0 prints the absolute counters")
	return func(ctx context.Context, c *cli, ids []string) error {
		s, err := c.sampleStats(ctx, ids, interval)
		if err != nil {
			return err
		}
		ports := s.rows(ids)
		if c.output == "json" {
			return writeJSON(c.stdout, statsToJSON(s, ports))
		}
		return c.statsTable(s, ports)
	}
}

func (c *cli) statsTable(s statsSample, ports []portRow) error {
	wide := c.output == "wide"
	rated := s.prev != nil
	t := newTable(c.stdout)
	head := []string{"PORT", "PAIR", "SLOT", "CPU"}
	if rated {
		head = append(head, "RX PPS", "RX BIT/S", "TX PPS", "TX BIT/S", "DROP PPS")
	} else {
		head = append(head, "RX PKTS", "RX BYTES", "TX PKTS", "TX BYTES", "DROPS")
	}
	if wide {
		if rated {
			head = append(head, "ENABLED", "KICKS/S", "CALLS/S", "BUSY", "OFFLOAD/S")
		} else {
			head = append(head, "ENABLED", "KICKS", "CALLS", "BUSY TIME", "OFFLOAD")
		}
	}
	t.row(head...)
	cells := func(cur counters, delta *counters) []string {
		if !rated {
			out := []string{count(cur.rxPkts), count(cur.rxBytes), count(cur.txPkts), count(cur.txBytes), count(cur.dropTotal())}
			if wide {
				out = append(out, "", count(cur.kicks), count(cur.calls), busyTime(cur.busyNs), offloadCounts(cur.offload))
			}
			return out
		}
		if delta == nil {
			n := 5
			if wide {
				n += 5
			}
			return make([]string, n) // "-": not in the first sample
		}
		r := delta.per(s.seconds)
		out := []string{pps(r.rxPps), bps(r.rxBps), pps(r.txPps), bps(r.txBps), pps(r.dropTotal)}
		if wide {
			out = append(out, "", perSecond(r.kicks), perSecond(r.calls), percent(r.busyPct), offloadRates(r.offload))
		}
		return out
	}
	for _, p := range ports {
		for _, q := range p.queues {
			row := append([]string{p.ps.GetId(), fmt.Sprint(q.q.GetPair()), q.q.GetSlot(), fmt.Sprint(q.q.GetCpu())}, cells(q.cur, q.delta)...)
			if wide {
				row[len(head)-5] = enabled(q.q)
			}
			t.row(row...)
		}
		t.row(append([]string{p.ps.GetId(), "total", "", ""}, cells(p.total, p.delta)...)...)
	}
	t.line("")
	if rated {
		t.line("Drops by reason, packets per second:")
	} else {
		t.line("Drops by reason, packets:")
	}
	head = []string{"PORT"}
	for _, r := range dropReasons {
		head = append(head, upperDash(r))
	}
	t.row(head...)
	for _, p := range ports {
		row := []string{p.ps.GetId()}
		for i := range dropReasons {
			switch {
			case !rated:
				row = append(row, count(p.total.drops[i]))
			case p.delta == nil:
				row = append(row, "")
			default:
				row = append(row, perSecond(p.delta.per(s.seconds).drops[i]))
			}
		}
		t.row(row...)
	}
	return t.flush()
}

// offloadCounts and offloadRates show a pair's offload counters in one
// compact cell, whole/seg/csum: GSO frames delivered whole, GSO frames
// segmented and partial checksums completed in software for its guest.
func offloadCounts(o [len(offloadKinds)]uint64) string {
	return count(o[0]) + "/" + count(o[1]) + "/" + count(o[2])
}

func offloadRates(o [len(offloadKinds)]float64) string {
	return perSecond(o[0]) + "/" + perSecond(o[1]) + "/" + perSecond(o[2])
}

func enabled(q *agentv1.QueueStats) string {
	switch {
	case q.GetRxEnabled() && q.GetTxEnabled():
		return "rx+tx"
	case q.GetRxEnabled():
		return "rx"
	case q.GetTxEnabled():
		return "tx"
	}
	return "none"
}

func upperDash(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c == '_':
			b[i] = '-'
		case 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// stats -o json

type statsJSON struct {
	TimeUnixNano    int64           `json:"time_unix_nano"`   // of the (second) sample, by the agent's clock
	IntervalSeconds float64         `json:"interval_seconds"` // 0: counters only, no rates
	Ports           []portStatsJSON `json:"ports"`
}

type portStatsJSON struct {
	ID        string            `json:"id"`
	Pod       string            `json:"pod"`
	Labels    map[string]string `json:"labels"`
	Connected bool              `json:"connected"`
	Connects  uint64            `json:"connects"`
	Bandwidth *bandwidthJSON    `json:"bandwidth"` // the limits the dataplane enforces; null: none
	Queues    []queueStatsJSON  `json:"queues"`
	Total     countersJSON      `json:"total"` // sum over the pairs
}

type queueStatsJSON struct {
	Pair      uint32 `json:"pair"`
	Slot      string `json:"slot"`
	CPU       int32  `json:"cpu"`
	RxEnabled bool   `json:"rx_enabled"`
	TxEnabled bool   `json:"tx_enabled"`
	countersJSON
}

type countersJSON struct {
	Rx     directionJSON     `json:"rx"` // toward the guest
	Tx     directionJSON     `json:"tx"` // from the guest
	Kicks  uint64            `json:"kicks"`
	Calls  uint64            `json:"calls"`
	BusyNs uint64            `json:"busy_ns"`
	Drops  dropsJSON[uint64] `json:"drops"`
	// Offload counts what offloads did for the frames the guest received.
	Offload offloadJSON[uint64] `json:"offload"`
	// Shaped counts the guest's bursts that the port's egress limit cut
	// short (its frames waited in its ring: shaping drops nothing).
	Shaped uint64 `json:"shaped"`
	// Rates over the interval; absent with --interval 0 or when the first
	// sample did not have the pair (or port).
	Rates *ratesJSON `json:"rates,omitempty"`
}

type directionJSON struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

type dropsJSON[T uint64 | float64] struct {
	RxNoBuffer    T `json:"rx_no_buffer"`
	RxDisabled    T `json:"rx_disabled"`
	TxDisabled    T `json:"tx_disabled"`
	BadChain      T `json:"bad_chain"`
	MTU           T `json:"mtu"`
	Runt          T `json:"runt"`
	NoDestination T `json:"no_destination"`
	BadOffload    T `json:"bad_offload"`
	Spoofed       T `json:"spoofed"`      // sent from an address that is not the port's (port security)
	RateLimited   T `json:"rate_limited"` // to the guest, above the port's ingress limit (policed)
	Total         T `json:"total"`
}

func newDropsJSON[T uint64 | float64](d [len(dropReasons)]T, total T) dropsJSON[T] {
	return dropsJSON[T]{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], total}
}

type offloadJSON[T uint64 | float64] struct {
	GSOWhole     T `json:"gso_whole"`     // GSO frames delivered whole (the guest takes them)
	GSOSegmented T `json:"gso_segmented"` // GSO frames segmented in software for the guest
	CsumSoftware T `json:"csum_software"` // partial checksums completed in software for the guest
}

func newOffloadJSON[T uint64 | float64](o [len(offloadKinds)]T) offloadJSON[T] {
	return offloadJSON[T]{o[0], o[1], o[2]}
}

type ratesJSON struct {
	RxPacketsPerSecond float64              `json:"rx_packets_per_second"`
	RxBitsPerSecond    float64              `json:"rx_bits_per_second"`
	TxPacketsPerSecond float64              `json:"tx_packets_per_second"`
	TxBitsPerSecond    float64              `json:"tx_bits_per_second"`
	KicksPerSecond     float64              `json:"kicks_per_second"`
	CallsPerSecond     float64              `json:"calls_per_second"`
	BusyPercent        float64              `json:"busy_percent"` // of one CPU; summed over pairs in totals
	DropsPerSecond     dropsJSON[float64]   `json:"drops_per_second"`
	OffloadPerSecond   offloadJSON[float64] `json:"offload_per_second"`
	ShapedPerSecond    float64              `json:"shaped_per_second"`
}

func toCountersJSON(cur counters, delta *counters, seconds float64) countersJSON {
	j := countersJSON{
		Rx:      directionJSON{cur.rxPkts, cur.rxBytes},
		Tx:      directionJSON{cur.txPkts, cur.txBytes},
		Kicks:   cur.kicks,
		Calls:   cur.calls,
		BusyNs:  cur.busyNs,
		Drops:   newDropsJSON(cur.drops, cur.dropTotal()),
		Offload: newOffloadJSON(cur.offload),
		Shaped:  cur.shaped,
	}
	if delta != nil {
		r := delta.per(seconds)
		var drops [len(dropReasons)]float64
		for i, v := range r.drops {
			drops[i] = round3(v)
		}
		var off [len(offloadKinds)]float64
		for i, v := range r.offload {
			off[i] = round3(v)
		}
		j.Rates = &ratesJSON{
			RxPacketsPerSecond: round3(r.rxPps), RxBitsPerSecond: round3(r.rxBps),
			TxPacketsPerSecond: round3(r.txPps), TxBitsPerSecond: round3(r.txBps),
			KicksPerSecond: round3(r.kicks), CallsPerSecond: round3(r.calls),
			BusyPercent:      round3(r.busyPct),
			DropsPerSecond:   newDropsJSON(drops, round3(r.dropTotal)),
			OffloadPerSecond: newOffloadJSON(off),
			ShapedPerSecond:  round3(r.shaped),
		}
	}
	return j
}

func statsToJSON(s statsSample, ports []portRow) statsJSON {
	out := statsJSON{TimeUnixNano: s.cur.GetTimeUnixNano(), IntervalSeconds: round3(s.seconds), Ports: []portStatsJSON{}}
	for _, p := range ports {
		pj := portStatsJSON{
			ID:        p.ps.GetId(),
			Pod:       pod(p.ps.GetLabels()),
			Labels:    map[string]string{},
			Connected: p.ps.GetConnected(),
			Connects:  p.ps.GetConnects(),
			Bandwidth: toBandwidthJSON(p.ps.GetBandwidth()),
			Queues:    []queueStatsJSON{},
			Total:     toCountersJSON(p.total, p.delta, s.seconds),
		}
		for k, v := range p.ps.GetLabels() {
			pj.Labels[k] = v
		}
		for _, q := range p.queues {
			pj.Queues = append(pj.Queues, queueStatsJSON{
				Pair: q.q.GetPair(), Slot: q.q.GetSlot(), CPU: q.q.GetCpu(),
				RxEnabled: q.q.GetRxEnabled(), TxEnabled: q.q.GetTxEnabled(),
				countersJSON: toCountersJSON(q.cur, q.delta, s.seconds),
			})
		}
		out.Ports = append(out.Ports, pj)
	}
	return out
}
