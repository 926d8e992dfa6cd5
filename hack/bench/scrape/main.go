// Command scrape measures what the node agent's /metrics costs at each
// number N of idle ports (one queue pair each), in-process: a dataplane
// and its agent on a temporary directory, the agent serving its metrics
// on a loopback port, scraped there as Prometheus 2 scrapes (the text
// format, gzipped). For each N, with no frontend and with a Go test
// frontend (dataplane/frontend) attached to every port:
//
//   - the series of the ports and the node (vhostmq_*), and the gzipped
//     body's size;
//   - ten scrapes back to back: the first, the median and the slowest of
//     the next five (the agent builds its ports' series before it listens:
//     a port's series are built once, and its scrapes set their values);
//   - the process's RSS before the first scrape, after it and after the
//     tenth: a scrape's garbage shows as growth.
//
// The agent's ports are the density of the neighbours issue (#27), whose
// baseline was 131-566 ms a scrape at 1024 ports and RSS growing from 73
// to 102 MiB; hack/bench/density measures what they cost the dataplane. It
// measures and prints (TSV); it asserts nothing. `make bench` runs it.
package main

import (
	"bufio"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/agent"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/hack/bench/inproc"
)

// accept is Prometheus 2's Accept header: this handler serves it the text
// format 0.0.4.
const accept = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"

func main() {
	portsFlag := flag.String("ports", "64,256,1024", "numbers of idle ports (comma-separated)")
	frontendsFlag := flag.String("frontends", "none,all", "frontends attached to the ports (comma-separated: none, all)")
	flag.Parse()
	var counts []int
	for _, s := range strings.Split(*portsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fail(fmt.Errorf("-ports: %q is not a number of ports", s))
		}
		counts = append(counts, n)
	}
	var attach []bool
	for _, s := range strings.Split(*frontendsFlag, ",") {
		switch strings.TrimSpace(s) {
		case "none":
			attach = append(attach, false)
		case "all":
			attach = append(attach, true)
		default:
			fail(fmt.Errorf("-frontends: %q is not none or all", s))
		}
	}
	fmt.Printf("# %s, %d CPUs, one queue pair a port, text format 0.0.4 gzipped, 10 scrapes a row; %s\n",
		time.Now().UTC().Format(time.RFC3339), runtime.NumCPU(), inproc.Pressure())
	fmt.Println("ports\tfrontends\tseries\tgzip_kib\tfirst_ms\tscrape_ms\tscrape_ms_max\trss_mib_before\trss_mib_first\trss_mib_after")
	for _, n := range counts {
		for _, fe := range attach {
			res, err := run(n, fe)
			if err != nil {
				fail(fmt.Errorf("%d ports: %w", n, err))
			}
			fes := 0
			if fe {
				fes = n
			}
			fmt.Printf("%d\t%d\t%d\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\n", n, fes, res.series, float64(res.bytes)/1024, ms(res.first), ms(res.median), ms(res.max),
				res.rssBefore, res.rssFirst, res.rssAfter)
		}
	}
	fmt.Printf("# after: %s\n", inproc.Pressure())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "scrape:", err)
	os.Exit(1)
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

type result struct {
	series, bytes                 int
	first, median, max            time.Duration
	rssBefore, rssFirst, rssAfter float64
}

func run(n int, attach bool) (result, error) {
	var res result
	dir, err := os.MkdirTemp("", "vmq-scrape")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := dataplane.New(dataplane.Config{Logger: log})
	if err != nil {
		return res, err
	}
	defer d.Close()
	root := filepath.Join(dir, "s")
	a, err := agent.New(agent.Config{SlotsPerCPU: n, SocketRoot: root, StateDir: filepath.Join(dir, "state"), APISocket: filepath.Join(dir, "api.sock"),
		Logger: log, Asked: true}, d)
	if err != nil {
		return res, err
	}
	var slots []string
	for _, c := range a.Capacity().Cpus {
		for _, s := range c.Slots {
			slots = append(slots, s.Id)
		}
	}
	var fes []*frontend.Frontend
	defer func() {
		for _, f := range fes {
			f.Close()
		}
	}()
	// Static ports (from the config file) are not saved: creating a
	// thousand through the API would write the state file a thousand times.
	for i := range n {
		id := fmt.Sprintf("vm%04d", i)
		spec := &agentv1.PortSpec{Id: id, SocketPath: filepath.Join(root, id, "vhu.sock"), Role: agentv1.Role_ROLE_SERVER, QueuePairs: 1,
			Slots: []string{slots[i]}, Labels: map[string]string{"k8s.pod.namespace": "vms", "k8s.pod.name": "virt-launcher-" + id + "-x7k2p"}}
		if err := a.CreateStatic(spec); err != nil {
			return res, err
		}
		if !attach {
			continue
		}
		f, err := frontend.Dial(spec.SocketPath, frontend.Config{QueueSize: 64, MemSize: 2 << 20})
		if err != nil {
			return res, fmt.Errorf("dialling port %s: %w", id, err)
		}
		fes = append(fes, f)
	}
	for deadline := time.Now().Add(30 * time.Second); attach; time.Sleep(20 * time.Millisecond) {
		up := 0
		for _, p := range d.Stats() {
			if p.EnabledPairs == 1 {
				up++
			}
		}
		if up == n {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%d of %d frontends attached", up, n)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 2)
	go func() { served <- a.Serve(ctx) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	addr := ln.Addr().String()
	ln.Close()
	go func() { served <- a.ServeMetrics(ctx, addr) }()
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableCompression: true}}
	scrape := func() ([]byte, time.Duration, error) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
		req.Header.Set("Accept", accept)
		req.Header.Set("Accept-Encoding", "gzip")
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return nil, 0, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("/metrics: %s", resp.Status)
		}
		return body, time.Since(t0), err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			break
		}
		select {
		case err := <-served:
			return res, fmt.Errorf("the agent stopped serving: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("the metrics address did not answer: %w", err)
		}
	}
	time.Sleep(500 * time.Millisecond) // setup done
	res.rssBefore = inproc.RSSMiB()
	var times []time.Duration
	var body []byte
	for i := range 10 {
		b, el, err := scrape()
		if err != nil {
			return res, err
		}
		body = b
		times = append(times, el)
		if i == 0 {
			res.rssFirst = inproc.RSSMiB()
		}
	}
	res.rssAfter = inproc.RSSMiB()
	res.first = times[0]
	next := slices.Clone(times[1:6])
	slices.Sort(next)
	res.median, res.max = next[len(next)/2], next[len(next)-1]
	res.bytes = len(body)
	res.series, err = series(body)
	return res, err
}

// series counts the vhostmq_ samples of a gzipped text body.
func series(body []byte) (int, error) {
	zr, err := gzip.NewReader(strings.NewReader(string(body)))
	if err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "vhostmq_") {
			n++
		}
	}
	return n, sc.Err()
}
