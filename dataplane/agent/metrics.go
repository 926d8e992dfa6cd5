package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// Metric label names; pod labels come from the port's k8s.pod.* labels.
var (
	queueLabels = []string{"port", "queue", "slot", "cpu", "namespace", "pod"}
	portLabels  = []string{"port", "namespace", "pod"}
)

func desc(name, help string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc("vhostmq_"+name, help, labels, nil)
}

var (
	descPackets   = desc("queue_packets_total", "Frames through a queue pair; direction rx is toward the guest, tx from it.", append(queueLabels, "direction"))
	descBytes     = desc("queue_bytes_total", "Frame bytes through a queue pair.", append(queueLabels, "direction"))
	descDrops     = desc("queue_drops_total", "Frames dropped, by reason.", append(queueLabels, "reason"))
	descKicks     = desc("queue_kicks_total", "Guest notifications (kick eventfd wake-ups) received.", queueLabels)
	descCalls     = desc("queue_calls_total", "Guest interrupts (call eventfd writes) sent.", queueLabels)
	descQBusy     = desc("queue_busy_seconds_total", "Worker time spent moving this pair's guest TX.", queueLabels)
	descQBursts   = desc("queue_bursts_total", "Bursts that moved this pair's guest TX; busy seconds over bursts is the cost per burst.", queueLabels)
	descStalls    = desc("queue_stalls_total", "Times the stall watchdog found this pair's guest TX ring with entries its worker could have taken and did not, and served it again.", queueLabels)
	descHeld      = desc("queue_held_total", "Frames for this pair's guest that found its RX ring full and waited at their source instead of being dropped.", queueLabels)
	descHoldExp   = desc("queue_hold_expired_total", "Held frames for this pair's guest dropped after the hold bound (also counted as drops, reason rx_no_buffer).", queueLabels)
	descMoves     = desc("rebalance_moves_total", "Queue pairs the rebalancer moved to another worker.", nil)
	descEnabled   = desc("queue_enabled", "1 when both rings of the pair can carry traffic.", queueLabels)
	descConnected = desc("port_connected", "1 while a vhost-user frontend is attached.", portLabels)
	descConnects  = desc("port_connects_total", "vhost-user sessions since the port was created (reconnects + 1).", portLabels)
	descFaults    = desc("port_faults_total", "Sessions ended because the frontend took back memory it shared (a fault in guest_memory or the dirty_log); the port serves its next frontend.", append(portLabels, "reason"))
	descSealed    = desc("port_memory_sealed", "1 when the session's memory and dirty log are sealed against shrinking (F_SEAL_SHRINK): the frontend cannot take them back.", portLabels)
	descWBusy     = desc("worker_busy_seconds_total", "Time the worker spent moving frames; its rate is the busy ratio.", []string{"cpu"})
	descWHealthy  = desc("worker_healthy", "1 when the worker is running and its CPU usable.", []string{"cpu"})
	descSlots     = desc("slots", "Queue slots on this node, by state.", []string{"state"})
	uplinkLabels  = []string{"uplink", "kind"}
	descUpPackets = desc("uplink_packets_total", "Frames through the uplink; direction rx is from it, tx toward it.", append(uplinkLabels, "direction"))
	descUpBytes   = desc("uplink_bytes_total", "Frame bytes through the uplink.", append(uplinkLabels, "direction"))
	descUpDrops   = desc("uplink_drops_total", "Uplink frames dropped, by reason.", append(uplinkLabels, "reason"))
	descDHCP      = desc("dhcp_messages_total", "DHCP messages of a port's guest answered by the dataplane, by type (malformed: dropped; ignored: not ours to answer).", append(portLabels, "type"))
	descOffload   = desc("queue_offload_frames_total", "Frames with offload metadata delivered to the pair's guest: gso_whole (a GSO frame passed whole), gso_segmented (a GSO frame segmented in software), csum_software (a partial checksum completed in software).", append(queueLabels, "offload"))
	descUpOffload = desc("uplink_offload_frames_total", "Guest frames with offload metadata sent to the uplink: gso_whole (into the tap whole), gso_segmented and csum_software (done in software, af_xdp).", append(uplinkLabels, "offload"))
	descUpHealthy = desc("uplink_healthy", "1 when the uplink can carry traffic (tap: its tap and bridge exist and are up; af_xdp: its NIC is up and runs the XDP program).", uplinkLabels)
)

// collector reads the counters at scrape time; nothing is kept twice.
type collector struct{ a *Agent }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPackets, descBytes, descDrops, descKicks, descCalls, descQBusy, descQBursts, descStalls, descHeld, descHoldExp, descMoves, descEnabled,
		descConnected, descConnects, descFaults, descSealed, descWBusy, descWHealthy, descSlots, descUpPackets, descUpBytes, descUpDrops, descUpHealthy, descDHCP, descOffload, descUpOffload} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	resp, err := a.Stats(nil)
	if err != nil {
		return
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	for _, p := range resp.Ports {
		ns, pod := p.Labels["k8s.pod.namespace"], p.Labels["k8s.pod.name"]
		gauge(descConnected, b2f(p.Connected), p.Id, ns, pod)
		ps, psOK := a.dp.PortStats(p.Id)
		if psOK && ps.DHCP != nil {
			d := ps.DHCP
			for _, m := range []struct {
				typ string
				v   uint64
			}{{"discover", d.Discovers}, {"request", d.Requests}, {"decline", d.Declines}, {"release", d.Releases},
				{"inform", d.Informs}, {"offer", d.Offers}, {"ack", d.Acks}, {"nak", d.Naks},
				{"malformed", d.Malformed}, {"ignored", d.Ignored}} {
				counter(descDHCP, float64(m.v), p.Id, ns, pod, m.typ)
			}
		}
		counter(descConnects, float64(p.Connects), p.Id, ns, pod)
		if psOK {
			counter(descFaults, float64(ps.Faults.GuestMemory), p.Id, ns, pod, string(netdev.FaultGuestMemory))
			counter(descFaults, float64(ps.Faults.DirtyLog), p.Id, ns, pod, string(netdev.FaultDirtyLog))
			if p.Connected {
				gauge(descSealed, b2f(ps.Memory.Sealed()), p.Id, ns, pod)
			}
		}
		for _, q := range p.Queues {
			l := []string{p.Id, strconv.Itoa(int(q.Pair)), q.Slot, strconv.Itoa(int(q.Cpu)), ns, pod}
			counter(descPackets, float64(q.Rx.Packets), append(l, "rx")...)
			counter(descPackets, float64(q.Tx.Packets), append(l, "tx")...)
			counter(descBytes, float64(q.Rx.Bytes), append(l, "rx")...)
			counter(descBytes, float64(q.Tx.Bytes), append(l, "tx")...)
			d := q.Drops
			for _, r := range []struct {
				reason string
				v      uint64
			}{{"rx_no_buffer", d.RxNoBuffer}, {"rx_disabled", d.RxDisabled}, {"tx_disabled", d.TxDisabled},
				{"bad_chain", d.BadChain}, {"mtu", d.Mtu}, {"runt", d.Runt}, {"no_destination", d.NoDestination}, {"spoofed", d.Spoofed}} {
				counter(descDrops, float64(r.v), append(l, r.reason)...)
			}
			if psOK && int(q.Pair) < len(ps.Queues) { // offloads: from the dataplane's stats
				qs := ps.Queues[q.Pair]
				counter(descDrops, float64(qs.Drops.BadOffload), append(l, "bad_offload")...)
				for _, k := range []struct {
					kind string
					v    uint64
				}{{"gso_whole", qs.Offload.GSOWhole}, {"gso_segmented", qs.Offload.GSOSegmented}, {"csum_software", qs.Offload.CsumSoftware}} {
					counter(descOffload, float64(k.v), append(l, k.kind)...)
				}
			}
			counter(descKicks, float64(q.Kicks), l...)
			counter(descCalls, float64(q.Calls), l...)
			counter(descQBusy, float64(q.BusyNs)/1e9, l...)
			counter(descQBursts, float64(q.Bursts), l...)
			counter(descStalls, float64(q.Stalls), l...)
			counter(descHeld, float64(q.Held), l...)
			counter(descHoldExp, float64(q.GetDrops().GetRxHoldExpired()), l...)
			gauge(descEnabled, b2f(q.RxEnabled && q.TxEnabled), l...)
		}
	}
	for _, w := range a.dp.WorkerStats() {
		counter(descWBusy, float64(w.BusyNs)/1e9, strconv.Itoa(w.CPU))
	}
	counter(descMoves, float64(a.dp.RebalanceStatus().Moved))
	for _, w := range a.health.workers() {
		gauge(descWHealthy, b2f(w.Healthy), strconv.Itoa(w.CPU))
	}
	if u, ok := a.dp.UplinkStats(); ok {
		l := []string{u.Name, u.Kind}
		counter(descUpPackets, float64(u.RxPackets), append(l, "rx")...)
		counter(descUpPackets, float64(u.TxPackets), append(l, "tx")...)
		counter(descUpBytes, float64(u.RxBytes), append(l, "rx")...)
		counter(descUpBytes, float64(u.TxBytes), append(l, "tx")...)
		for _, r := range []struct {
			reason string
			v      uint64
		}{{"rx_no_network", u.RxNoNetwork}, {"rx_runt", u.RxRunt}, {"rx_no_destination", u.RxNoDestination},
			{"tx_dropped", u.TxDropped}, {"tx_oversize", u.TxOversize}, {"mac_map_full", u.MACErrors}, {"rx_bad_offload", u.RxBadOffload},
			{"mac_table_full", u.MACTableFull}} {
			counter(descUpDrops, float64(r.v), append(l, r.reason)...)
		}
		for _, k := range []struct {
			kind string
			v    uint64
		}{{"gso_whole", u.TxGSOWhole}, {"gso_segmented", u.TxGSOSegmented}, {"csum_software", u.TxCsumSoftware}} {
			counter(descUpOffload, float64(k.v), append(l, k.kind)...)
		}
		gauge(descUpHealthy, b2f(u.Healthy), l...)
	}
	capa := a.Capacity()
	gauge(descSlots, float64(capa.SlotsUsed), "used")
	gauge(descSlots, float64(capa.SlotsTotal-capa.SlotsUsed), "free")
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ServeMetrics serves /metrics, /healthz and /readyz on addr until ctx
// ends. An address without a host binds to localhost only. With
// Config.MetricsTLS it serves HTTPS, and Config.MetricsGuard decides who
// reads /metrics.
func (a *Agent) ServeMetrics(ctx context.Context, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metricsAddress: %q: %w", addr, err)
	}
	if host == "" {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{a}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	var metrics http.Handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	if a.cfg.MetricsGuard != nil {
		metrics = a.cfg.MetricsGuard(metrics)
	}
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		h := a.Health()
		if !h.Healthy {
			http.Error(w, "unhealthy: "+h.Reason, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.ready.Load() {
			http.Error(w, "not ready: the API is not serving yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	// A predecessor handing its ports over still listens on the address
	// until it lets go: bind once Serve answers.
	select {
	case <-a.served:
	case <-ctx.Done():
		return nil
	}
	listen := func() (net.Listener, error) { return net.Listen("tcp", addr) }
	ln, err := listen()
	if h, ok := a.LastHandoff(); ok && h.Role == "adopted" {
		ln, err = retryInUse(ln, err, listen) // the predecessor lets go of it after its API
	}
	if err != nil {
		return fmt.Errorf("metricsAddress: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, TLSConfig: a.cfg.MetricsTLS}
	a.onStop(func() { srv.Close() })
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	a.log.Info("metrics listening", "address", ln.Addr().String(), "https", a.cfg.MetricsTLS != nil, "guarded", a.cfg.MetricsGuard != nil)
	if a.cfg.MetricsTLS != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
