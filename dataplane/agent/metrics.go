package agent

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The node's metrics, read at scrape time by collector. The ports' are in
// portmetrics.go.
var (
	descMoves     = desc("rebalance_moves_total", "Queue pairs the rebalancer moved to another worker.", nil)
	descWBusy     = desc("worker_busy_seconds_total", "Time the worker spent moving frames; its rate is the busy ratio.", []string{"cpu"})
	descWHealthy  = desc("worker_healthy", "1 when the worker is running and its CPU usable.", []string{"cpu"})
	descSlots     = desc("slots", "Queue slots on this node, by state.", []string{"state"})
	uplinkLabels  = []string{"uplink", "kind"}
	descUpPackets = desc("uplink_packets_total", "Frames through the uplink; direction rx is from it, tx toward it.", append(uplinkLabels, "direction"))
	descUpBytes   = desc("uplink_bytes_total", "Frame bytes through the uplink.", append(uplinkLabels, "direction"))
	descUpDrops   = desc("uplink_drops_total", "Uplink frames dropped, by reason.", append(uplinkLabels, "reason"))
	descUpOffload = desc("uplink_offload_frames_total", "Guest frames with offload metadata sent to the uplink: gso_whole (into the tap whole), gso_segmented and csum_software (done in software, af_xdp).", append(uplinkLabels, "offload"))
	descUpHealthy = desc("uplink_healthy", "1 when the uplink can carry traffic (tap: its tap and bridge exist and are up; af_xdp: its NIC is up and runs the XDP program; vxlan: its local address is on an interface).", uplinkLabels)
	// the vxlan uplink's VTEPs (the other nodes)
	descVTEPPackets = desc("vtep_packets_total", "VXLAN datagrams to (tx) and from (rx) a VTEP.", []string{"vtep", "direction"})
	descVTEPBytes   = desc("vtep_bytes_total", "Inner frame bytes to (tx) and from (rx) a VTEP.", []string{"vtep", "direction"})
	descVTEPDrops   = desc("vtep_drops_total", "Datagrams to a VTEP dropped: tx_errors (the kernel refused it: no route, or over the path's MTU, never fragmented), tx_dropped (the socket's send buffer was full).", []string{"vtep", "reason"})
	descVTEPMACs    = desc("vtep_macs", "Addresses learned behind a VTEP, all networks.", []string{"vtep"})
)

func desc(name, help string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc("vhostmq_"+name, help, labels, nil)
}

// collector reads the node's counters at scrape time; nothing is kept
// twice. Their number does not grow with the ports.
type collector struct{ a *Agent }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMoves, descWBusy, descWHealthy, descSlots, descUpPackets, descUpBytes, descUpDrops, descUpHealthy, descUpOffload,
		descVTEPPackets, descVTEPBytes, descVTEPDrops, descVTEPMACs} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
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
			{"mac_table_full", u.MACTableFull}, {"rx_unknown_vtep", u.RxUnknownVTEP}, {"rx_invalid", u.RxInvalid}, {"tx_no_vtep", u.TxNoVTEP}} {
			counter(descUpDrops, float64(r.v), append(l, r.reason)...)
		}
		for _, k := range []struct {
			kind string
			v    uint64
		}{{"gso_whole", u.TxGSOWhole}, {"gso_segmented", u.TxGSOSegmented}, {"csum_software", u.TxCsumSoftware}} {
			counter(descUpOffload, float64(k.v), append(l, k.kind)...)
		}
		gauge(descUpHealthy, b2f(u.Healthy), l...)
		for _, v := range u.VTEPs {
			counter(descVTEPPackets, float64(v.RxPackets), v.Address, "rx")
			counter(descVTEPPackets, float64(v.TxPackets), v.Address, "tx")
			counter(descVTEPBytes, float64(v.RxBytes), v.Address, "rx")
			counter(descVTEPBytes, float64(v.TxBytes), v.Address, "tx")
			counter(descVTEPDrops, float64(v.TxErrors), v.Address, "tx_errors")
			counter(descVTEPDrops, float64(v.TxDropped), v.Address, "tx_dropped")
			gauge(descVTEPMACs, float64(v.MACs), v.Address)
		}
	}
	used, total := a.slotsUsed()
	gauge(descSlots, float64(used), "used")
	gauge(descSlots, float64(total-used), "free")
}

// slotsUsed counts the slots in use and all of them, as Capacity does
// (lost allocations swept first) without building its message: that costs
// allocations per slot at every scrape.
func (a *Agent) slotsUsed() (used, total int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweepAllocationsLocked()
	for _, s := range a.slots {
		if s.owner != "" {
			used++
		}
	}
	return used, len(a.slots)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// metricsHandler is /metrics without the guard: the registry's metrics
// (the node's, Go's, the process's) and the ports' (portmetrics.go).
func (a *Agent) metricsHandler() (http.Handler, *portMetrics) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{a}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	g := newPortMetrics(a, reg)
	return buffered(promhttp.HandlerForTransactional(g, promhttp.HandlerOpts{DisableCompression: true})), g
}

// buffered answers with h's response once h has returned, from a buffer,
// gzipped at BestSpeed when the client takes gzip rather than identity
// (Prometheus does); h must not compress. h holds the ports' families
// locked while it encodes them (portMetrics): written to the client
// directly, a client that reads slowly would hold them from every other
// scrape. And promhttp's own gzip, at the default level, took 20 ms of a
// 35 ms scrape at 1024 ports for a body 5% smaller than BestSpeed's. An
// error status goes out uncompressed.
func buffered(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := bufferPool.Get().(*bytes.Buffer)
		defer bufferPool.Put(buf)
		buf.Reset()
		bw := &bufferWriter{ResponseWriter: w, buf: buf, gzip: takesGzip(r.Header), code: http.StatusOK}
		h.ServeHTTP(bw, r)
		if bw.gz != nil {
			bw.gz.Close()
			gzipPool.Put(bw.gz)
		}
		w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
		w.WriteHeader(bw.code)
		w.Write(buf.Bytes())
	})
}

var (
	bufferPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	gzipPool   = sync.Pool{New: func() any {
		w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed)
		return w
	}}
)

// bufferWriter keeps h's status and body for buffered.
type bufferWriter struct {
	http.ResponseWriter // the header only
	buf                 *bytes.Buffer
	gzip                bool
	gz                  *gzip.Writer
	code                int
	wrote               bool
}

func (b *bufferWriter) WriteHeader(code int) {
	if b.wrote {
		return
	}
	b.wrote, b.code = true, code
	if b.gzip && code < http.StatusBadRequest {
		b.Header().Set("Content-Encoding", "gzip")
		b.gz = gzipPool.Get().(*gzip.Writer)
		b.gz.Reset(b.buf)
	}
}

func (b *bufferWriter) Write(p []byte) (int, error) {
	if !b.wrote {
		b.WriteHeader(http.StatusOK)
	}
	if b.gz != nil {
		return b.gz.Write(p)
	}
	return b.buf.Write(p)
}

// takesGzip is promhttp's choice between identity and gzip: gzip when the
// client weighs it (or *) above identity, and above 0.
func takesGzip(h http.Header) bool {
	qGzip, qIdentity := -1.0, -1.0
	for _, v := range h.Values("Accept-Encoding") {
		for part := range strings.SplitSeq(v, ",") {
			name, params, _ := strings.Cut(part, ";")
			q := 1.0
			for p := range strings.SplitSeq(params, ";") {
				if k, val, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(k, "q") {
					if x, err := strconv.ParseFloat(val, 64); err == nil {
						q = x
					}
				}
			}
			switch name = strings.ToLower(strings.TrimSpace(name)); name {
			case "gzip", "*":
				qGzip = max(qGzip, q)
			}
			if name == "identity" || name == "*" {
				qIdentity = max(qIdentity, q)
			}
		}
	}
	return qGzip > 0 && qGzip > qIdentity
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
	mux := http.NewServeMux()
	metrics, ports := a.metricsHandler()
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
	// The ports' series are built before the first scrape comes, not by
	// it: at 1024 ports that doubles its time.
	ports.warm()
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
