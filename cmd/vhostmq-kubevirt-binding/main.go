// Command vhostmq-kubevirt-binding is vhostmq's KubeVirt network binding
// sidecar (see package binding). KubeVirt starts it in the virt-launcher
// pod without arguments, and (v1.7) without the binding's name: the
// registration in the KubeVirt CR must use the default name "vhostmq",
// or NETWORK_BINDING_PLUGIN_NAME / --binding must say the other one.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/vhostmq/vhostmq/cni/kubevirt/binding"
)

func main() {
	plugin := os.Getenv("NETWORK_BINDING_PLUGIN_NAME")
	if plugin == "" {
		plugin = binding.DefaultPluginName
	}
	cfg := binding.Config{}
	flag.StringVar(&cfg.HookName, "hook-name", binding.DefaultHookName, "name reported to virt-launcher; the socket is <hooks-dir>/<name>.sock")
	flag.StringVar(&cfg.PluginName, "binding", plugin, "binding plugin name VMI interfaces use (default from NETWORK_BINDING_PLUGIN_NAME)")
	flag.StringVar(&cfg.NetworkInfo, "network-info", binding.DefaultNetworkInfo, "KubeVirt's downward-API network-info file")
	flag.DurationVar(&cfg.DeviceInfoWait, "device-info-wait", binding.DefaultDeviceInfoWait, "how long OnDefineDomain waits for network-info to carry a vhostmq interface's device-info (a migration target's file is written late); 0 waits not at all")
	hooksDir := flag.String("hooks-dir", binding.DefaultHooksDir, "KubeVirt's hook socket directory")
	level := flag.String("log-level", "info", "debug, info, warn or error")
	// KubeVirt's generic sidecar-shim passes --version; accept and ignore it.
	flag.String("version", "v1alpha3", "hook API version (only v1alpha3)")
	flag.Parse()
	if cfg.DeviceInfoWait == 0 {
		cfg.DeviceInfoWait = -1 // Config's 0 is the default
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(os.Stderr, "--log-level: %v\n", err)
		os.Exit(2)
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	cfg.Socket = *hooksDir + "/" + cfg.HookName + ".sock"
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := binding.NewServer(cfg).Serve(ctx); err != nil {
		cfg.Logger.Error("sidecar failed", "err", err)
		os.Exit(1)
	}
}
