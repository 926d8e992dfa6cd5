// Command vhostmq-dataplane runs the node dataplane and its agent: the
// vhost-user ports and L2 switch, the control API on a unix socket, the
// stored ports (restored before the API answers), metrics and health.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/agent"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/dataplane/config"
	"github.com/vhostmq/vhostmq/dataplane/vteps"
)

func main() {
	path := flag.String("config", "", "path of the YAML config file (required)")
	probe := flag.String("probe", "", `"ready": exit 0 if the dataplane answering on the config's API socket runs in this pod ($POD_UID), else 1 (the node pod's readiness probe: during an upgrade both pods share the socket); "live": exit 0 if the config's metrics address answers /healthz (the liveness probe: it reaches a localhost address and HTTPS, which an httpGet probe cannot)`)
	flag.Parse()
	if *path == "" {
		fmt.Fprintln(os.Stderr, "vhostmq-dataplane: --config FILE is required")
		flag.Usage()
		os.Exit(2)
	}
	switch *probe {
	case "":
	case "ready":
		if err := probeReady(*path); err != nil {
			fmt.Fprintln(os.Stderr, "not ready:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		return
	case "live":
		if err := probeLive(*path); err != nil {
			fmt.Fprintln(os.Stderr, "not live:", err)
			os.Exit(1)
		}
		fmt.Println("live")
		return
	default:
		fmt.Fprintf(os.Stderr, "vhostmq-dataplane: --probe: %q is not \"ready\" or \"live\"\n", *probe)
		os.Exit(2)
	}
	if err := run(*path); err != nil {
		fmt.Fprintln(os.Stderr, "vhostmq-dataplane:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	var level slog.Level // info
	if cfg.LogLevel != "" {
		level.UnmarshalText([]byte(cfg.LogLevel)) // validated by Load
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// before a predecessor is asked: a bad metrics setup refuses nothing
	metricsAddr, metricsTLS, metricsGuard, err := metricsSetup(cfg, log)
	if err != nil {
		return err
	}
	// A dataplane still running on the state directory (an upgrade) hands
	// its ports and tap uplink over: asked before the uplink is opened.
	vc, err := cfg.VXLANConfig(os.Getenv)
	if err != nil {
		return err
	}
	var nodes kubernetes.Interface // the vxlan uplink's VTEPs come from the Node objects
	if vc != nil && cfg.Uplink.VXLAN.Nodes {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return fmt.Errorf("uplink.vxlan.nodes: %w", err)
		}
		if nodes, err = kubernetes.NewForConfig(rc); err != nil {
			return fmt.Errorf("uplink.vxlan.nodes: %w", err)
		}
	}
	take, err := agent.AskPredecessor(cfg.StateDir, log)
	if err != nil {
		return err
	}
	dp, err := dataplane.New(dataplane.Config{CPUs: cfg.CPUs, MACAge: time.Duration(cfg.MACAgeSeconds) * time.Second, Logger: log,
		Uplink: cfg.TapConfig(), AFXDP: cfg.AFXDPConfig(), VXLAN: vc, Rebalance: cfg.RebalanceConfig(), Watchdog: cfg.WatchdogConfig(),
		RequireSealedMemory: cfg.RequireSealedMemory, MaxGuestMemory: cfg.MaxGuestMemory(),
		UplinkMACs: cfg.UplinkMACs(), Handed: take.Uplink()})
	if err != nil {
		if take != nil {
			take.Refuse(nil, err)
		}
		return err
	}
	defer dp.Close()
	ag, err := agent.New(agent.Config{SlotsPerCPU: cfg.SlotsPerCPU, SocketRoot: cfg.SocketRoot, StateDir: cfg.StateDir,
		APISocket: cfg.APISocket, MetricsAddress: metricsAddr, MetricsTLS: metricsTLS, MetricsGuard: metricsGuard,
		Logger: log, Asked: true, Takeover: take}, dp)
	if err != nil {
		return err
	}
	for i := range cfg.Ports {
		if err := ag.CreateStatic(staticSpec(&cfg.Ports[i])); err != nil {
			return fmt.Errorf("ports[%d]: %w", i, err)
		}
	}
	// Signals stay caught until the process exits: a second SIGTERM (the
	// timeout command sends two) must not kill it halfway through closing
	// the ports and saving state.
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		s := <-sigc
		log.Info("shutting down", "signal", s.String())
		cancel()
	}()
	errc := make(chan error, 2)
	go func() { errc <- ag.Serve(ctx) }()
	if nodes != nil {
		go func() {
			if err := vteps.Watch(ctx, nodes, dp.SetVTEPs, log); err != nil && ctx.Err() == nil {
				log.Error("watching the nodes for the VTEPs stopped", "err", err)
			}
		}()
	}
	if metricsAddr != "" {
		go func() { errc <- ag.ServeMetrics(ctx, metricsAddr) }()
	}
	var tick <-chan time.Time
	if cfg.StatsFile != "" {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case err := <-errc:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			log.Info("shutting down")
			if cfg.StatsFile != "" && !ag.HandedOver() {
				dp.WriteStatsFile(cfg.StatsFile)
			}
			return nil
		case <-tick:
			if ag.HandedOver() {
				continue // the successor writes it
			}
			if err := dp.WriteStatsFile(cfg.StatsFile); err != nil {
				log.Warn("cannot write stats file", "path", cfg.StatsFile, "err", err)
			}
		}
	}
}

func staticSpec(p *config.Port) *agentv1.PortSpec {
	s := &agentv1.PortSpec{Id: p.Name, SocketPath: p.Socket, QueuePairs: uint32(p.QueuePairs), Mtu: uint32(p.MTU), Mac: p.MAC,
		Role: agentv1.Role_ROLE_CLIENT}
	if p.Role == "server" {
		s.Role = agentv1.Role_ROLE_SERVER
	}
	switch p.Polling {
	case "interrupt":
		s.Polling = agentv1.PollingMode_POLLING_INTERRUPT
	case "busy":
		s.Polling = agentv1.PollingMode_POLLING_BUSY
	}
	// Port security: the agent takes the allowed IPs from ip.addresses,
	// host prefixes here (no DHCP for static ports).
	s.PortSecurity = p.PortSecurity
	bw, _ := p.Limits() // validated by config.Load
	s.Bandwidth = agent.BandwidthSpec(bw)
	addrs, _ := p.Addrs() // validated by config.Load
	if len(addrs) > 0 {
		s.Ip = &agentv1.IPConfig{}
		for _, a := range addrs {
			s.Ip.Addresses = append(s.Ip.Addresses, netip.PrefixFrom(a, a.BitLen()).String())
		}
	}
	return s
}

// probeReady asks the agent on the config's API socket which pod it runs
// in: this pod's dataplane is ready once it serves the API (after a
// takeover, once it serves the ports), not while its predecessor still
// does.
func probeReady(path string) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+cfg.APISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	h, err := agentv1.NewAgentClient(conn).GetHandoff(ctx, &agentv1.GetHandoffRequest{})
	if err != nil {
		return fmt.Errorf("the API on %s: %w", cfg.APISocket, err)
	}
	if pod := os.Getenv(agent.PodEnv); pod != "" && h.GetPod() != pod {
		return fmt.Errorf("the API on %s is served by pod %q (build %s), this is pod %q", cfg.APISocket, h.GetPod(), h.GetBuild(), pod)
	}
	return nil
}
