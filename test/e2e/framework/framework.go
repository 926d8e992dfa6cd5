//go:build e2e

package framework

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// Framework holds the clients every spec uses. One per suite (see
// e2e_suite_test.go), made in BeforeSuite.
type Framework struct {
	Config
	Rest   *rest.Config
	Client kubernetes.Interface
	// Stream is Client without the 20 s request timeout, for streams
	// (logs -f, watches) that last longer.
	Stream kubernetes.Interface
}

// New connects to the cluster of cfg. The test cluster's API server listens
// on 127.0.0.1 inside its own network namespace: connections are made from
// there (cfg.NetNS) while the test process stays on the host, where the node
// agent's socket, ctr and the node's files are.
func New(cfg Config) (*Framework, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	rc.Timeout = 20 * time.Second
	rc.QPS, rc.Burst = 50, 100
	if cfg.NetNS != "" {
		rc.Dial = dialInNetNS(cfg.NetNS)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	src := rest.CopyConfig(rc)
	src.Timeout = 0
	ss, err := kubernetes.NewForConfig(src)
	if err != nil {
		return nil, err
	}
	return &Framework{Config: cfg, Rest: rc, Client: cs, Stream: ss}, nil
}

// dialInNetNS returns a dialer whose sockets are made in the network
// namespace at path: the dialing thread enters it, makes the socket and
// goes back (a socket keeps the namespace it was made in).
func dialInNetNS(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			return nil, fmt.Errorf("current netns: %w", err)
		}
		defer orig.Close()
		target, err := netns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			return nil, fmt.Errorf("netns %s: %w", path, err)
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			return nil, fmt.Errorf("enter netns %s: %w", path, err)
		}
		var d net.Dialer
		conn, derr := d.DialContext(ctx, network, addr)
		if err := netns.Set(orig); err != nil {
			// the thread stays locked, so it ends with this goroutine
			// and no other goroutine runs in the wrong namespace
			if conn != nil {
				conn.Close()
			}
			return nil, fmt.Errorf("leave netns %s: %w", path, err)
		}
		runtime.UnlockOSThread()
		return conn, derr
	}
}

// Run runs a command on the host and returns its combined output, trimmed.
// The error names the command and holds its output.
func Run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	s := strings.TrimSpace(out.String())
	if err != nil {
		return s, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, s)
	}
	return s, nil
}

// Kubectl runs the cluster's kubectl in the API server's network namespace,
// for what client-go does not do simply (exec, apply -f, delete -f).
func (f *Framework) Kubectl(ctx context.Context, args ...string) (string, error) {
	base := []string{"env", "KUBECACHEDIR=" + f.ClusterRun + "/kube-cache", f.KubectlBin, "--kubeconfig", f.Kubeconfig, "--request-timeout", "20s"}
	if f.NetNS != "" {
		base = append([]string{"nsenter", "--net=" + f.NetNS, "--"}, base...)
	}
	base = append(base, args...)
	return Run(ctx, base[0], base[1:]...)
}

// Agent connects to the node agent's gRPC API (the dataplane's socket is a
// hostPath on the node: the test reads it from the host). Close the
// connection when done (DeferCleanup(conn.Close)).
func (f *Framework) Agent() (agentv1.AgentClient, *grpc.ClientConn, error) {
	sock := f.AgentSocket
	cc, err := grpc.NewClient("unix://"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		return nil, nil, fmt.Errorf("agent socket %s: %w", sock, err)
	}
	return agentv1.NewAgentClient(cc), cc, nil
}

// Ctr runs containerd's ctr on the node's containerd (namespace k8s.io).
func (f *Framework) Ctr(ctx context.Context, args ...string) (string, error) {
	out, err := Run(ctx, f.CtrBin, append([]string{"-a", f.CtrSocket, "-n", "k8s.io"}, args...)...)
	// containerd 2.4 warns about cgroup v1 on every call
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.Contains(l, "support for cgroup v1 is deprecated") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n"), err
}

// ContainerPID is the host PID of a container's first process, from
// `ctr tasks ls`; containerID may carry the "containerd://" prefix.
func (f *Framework) ContainerPID(ctx context.Context, containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	out, err := f.Ctr(ctx, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(out, "\n") {
		fs := strings.Fields(l)
		if len(fs) >= 2 && fs[0] == id {
			return strconv.Atoi(fs[1])
		}
	}
	return 0, fmt.Errorf("container %.12s: no task in `ctr tasks ls`", id)
}

// Comm is /proc/PID/comm (the first 15 bytes of the executable's name).
func Comm(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
