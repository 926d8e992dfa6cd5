// Command vhostmq-dataplane runs the vhost-user dataplane from a YAML
// config: one port per vhost-user socket, joined by an L2 switch.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/config"
)

func main() {
	path := flag.String("config", "", "path of the YAML config file (required)")
	flag.Parse()
	if *path == "" {
		fmt.Fprintln(os.Stderr, "vhostmq-dataplane: --config FILE is required")
		flag.Usage()
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
	dp, err := dataplane.New(dataplane.Config{CPUs: cfg.CPUs, MACAge: time.Duration(cfg.MACAgeSeconds) * time.Second, Logger: log})
	if err != nil {
		return err
	}
	defer dp.Close()
	for i := range cfg.Ports {
		nc, _ := cfg.Ports[i].NetdevConfig() // validated by Load
		if err := dp.AddPort(nc); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var tick <-chan time.Time
	if cfg.StatsFile != "" {
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down")
			if cfg.StatsFile != "" {
				dp.WriteStatsFile(cfg.StatsFile)
			}
			return nil
		case <-tick:
			if err := dp.WriteStatsFile(cfg.StatsFile); err != nil {
				log.Warn("cannot write stats file", "path", cfg.StatsFile, "err", err)
			}
		}
	}
}
