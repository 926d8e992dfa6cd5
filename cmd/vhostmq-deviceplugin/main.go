// Command vhostmq-deviceplugin advertises the node agent's queue slots to
// the kubelet as an extended resource (vhostmq.io/queue-pairs).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/vhostmq/vhostmq/plugin"
	"github.com/vhostmq/vhostmq/plugin/flags"
)

func main() {
	var cfg plugin.Config
	var owner, mode, level string
	flag.StringVar(&cfg.ResourceName, "resource", plugin.DefaultResource, "extended resource name")
	flag.StringVar(&cfg.AgentSocket, "agent-socket", "/run/vhostmq/api.sock", "the node agent's API socket")
	flag.StringVar(&cfg.KubeletDir, "kubelet-dir", plugin.DefaultKubeletDir, "the kubelet's root directory")
	flag.StringVar(&cfg.SocketRoot, "socket-root", plugin.DefaultSocketRoot, "host directory for per-allocation socket directories")
	flag.StringVar(&cfg.ContainerSocketDir, "container-socket-dir", plugin.DefaultContainerSocketDir, "where containers see their socket directory")
	flag.StringVar(&cfg.DevInfoDir, "devinfo-dir", plugin.DefaultDevInfoDir, "device-info directory (device-info spec 1.1.0)")
	flag.StringVar(&owner, "socket-owner", "107:107", "uid:gid owning allocation directories (qemu in KubeVirt is 107)")
	flag.StringVar(&mode, "socket-mode", "0770", "mode of allocation directories, at most 0770")
	flag.StringVar(&cfg.Instance, "instance", os.Getenv("POD_UID"), "tells this plugin's socket from another instance's during an upgrade (default $POD_UID, else the process ID)")
	flag.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	flag.Parse()
	if err := parse(&cfg, owner, mode, level); err != nil {
		fmt.Fprintln(os.Stderr, "vhostmq-deviceplugin:", err)
		os.Exit(2)
	}
	p, err := plugin.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vhostmq-deviceplugin:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := p.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "vhostmq-deviceplugin:", err)
		os.Exit(1)
	}
}

func parse(cfg *plugin.Config, owner, mode, level string) error {
	var err error
	if cfg.SocketUID, cfg.SocketGID, err = flags.Owner(owner); err != nil {
		return err
	}
	if cfg.SocketMode, err = flags.Mode(mode); err != nil {
		return err
	}
	cfg.Logger, err = flags.Logger(level)
	return err
}
