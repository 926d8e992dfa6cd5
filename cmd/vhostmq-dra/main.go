// Command vhostmq-dra hands the node agent's queue slots out through
// Kubernetes Dynamic Resource Allocation (driver queues.vhostmq.io): a
// ResourceSlice with one device per slot, claims prepared as per-claim
// socket directories mounted by CDI. It may run beside vhostmq-deviceplugin:
// the agent's reservations keep the two from giving a slot twice.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/plugin"
	"github.com/vhostmq/vhostmq/plugin/dra"
	"github.com/vhostmq/vhostmq/plugin/flags"
)

func main() {
	var rc dra.RunConfig
	var agentSocket, kubeconfig, owner, mode, level string
	flag.StringVar(&agentSocket, "agent-socket", "/run/vhostmq/api.sock", "the node agent's API socket")
	flag.StringVar(&rc.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.StringVar(&rc.PodUID, "pod-uid", os.Getenv("POD_UID"), "this pod's UID (default $POD_UID): its own kubelet sockets, so that old and new pods of a surge update both serve")
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster)")
	flag.StringVar(&rc.KubeletDir, "kubelet-dir", plugin.DefaultKubeletDir, "the kubelet's root directory")
	flag.StringVar(&rc.SocketRoot, "socket-root", plugin.DefaultSocketRoot, "host directory for per-claim socket directories")
	flag.StringVar(&rc.ContainerSocketDir, "container-socket-dir", plugin.DefaultContainerSocketDir, "under which containers see their claims' socket directories")
	flag.StringVar(&rc.CDIDir, "cdi-dir", "/var/run/cdi", "where CDI spec files go (the container runtime's CDI directory)")
	flag.IntVar(&rc.MTU, "mtu", 0, "the ports' MTU, said in the device metadata (0: not said)")
	flag.StringVar(&owner, "socket-owner", "107:107", "uid:gid owning claim directories (qemu in KubeVirt is 107)")
	flag.StringVar(&mode, "socket-mode", "0770", "mode of claim directories, at most 0770")
	var devices string
	flag.StringVar(&devices, "devices", "slot", "slot: one device per queue slot; numa: one device per NUMA node with consumable capacity queuePairs (Kubernetes >= 1.36, DRAConsumableCapacity)")
	flag.StringVar(&level, "log-level", "info", "debug, info, warn or error")
	flag.Parse()
	switch devices {
	case "slot":
	case "numa":
		rc.PerNUMA = true
	default:
		fmt.Fprintf(os.Stderr, "vhostmq-dra: --devices: %q is not slot or numa\n", devices)
		os.Exit(2)
	}
	if err := parse(&rc, owner, mode, level); err != nil {
		fmt.Fprintln(os.Stderr, "vhostmq-dra:", err)
		os.Exit(2)
	}
	if rc.NodeName == "" {
		fmt.Fprintln(os.Stderr, "vhostmq-dra: --node-name: empty (and NODE_NAME unset)")
		os.Exit(2)
	}
	kc, err := kubeClient(kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vhostmq-dra: --kubeconfig:", err)
		os.Exit(2)
	}
	rc.Kube = kc
	conn, err := grpc.NewClient("unix://"+agentSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "vhostmq-dra: --agent-socket:", err)
		os.Exit(2)
	}
	defer conn.Close()
	rc.Agent = agentv1.NewAgentClient(conn)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := dra.Run(ctx, rc); err != nil {
		fmt.Fprintln(os.Stderr, "vhostmq-dra:", err)
		os.Exit(1)
	}
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func parse(rc *dra.RunConfig, owner, mode, level string) error {
	var err error
	if rc.SocketUID, rc.SocketGID, err = flags.Owner(owner); err != nil {
		return err
	}
	if rc.SocketMode, err = flags.Mode(mode); err != nil {
		return err
	}
	if rc.MTU < 0 || rc.MTU > 65535 {
		return fmt.Errorf("--mtu: %d is not 0..65535", rc.MTU)
	}
	rc.Logger, err = flags.Logger(level)
	return err
}
