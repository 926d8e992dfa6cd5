// Package plugin is vhostmq's kubelet device plugin: it advertises the node
// agent's queue slots as one extended-resource device each
// (vhostmq.io/queue-pairs), keeps their health and NUMA node current, picks
// slots on distinct CPUs for a request, and on Allocate hands the container
// a per-allocation socket directory that the CNI plugin finds again from the
// same slot IDs.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// Config configures the plugin.
type Config struct {
	ResourceName       string // default vhostmq.io/queue-pairs
	AgentSocket        string // the node agent's API socket
	KubeletDir         string // default /var/lib/kubelet
	SocketRoot         string // host directory for per-allocation socket directories
	ContainerSocketDir string // where the container sees its directory; default /var/run/vhostmq
	DevInfoDir         string // device-info files (spec 1.1.0); default /var/run/k8s.cni.cncf.io/devinfo/dp
	SocketUID          int    // owner of allocation directories; default 107 (qemu in KubeVirt)
	SocketGID          int
	SocketMode         os.FileMode // default 0770, never wider
	// Instance tells this plugin's socket from another instance's of the
	// same resource (the pod's UID): during an upgrade the new pod's
	// plugin registers while the old one still runs, and the kubelet
	// keeps them apart by socket. Default: the process ID.
	Instance string
	Logger   *slog.Logger
}

// Defaults.
const (
	DefaultResource           = "vhostmq.io/queue-pairs"
	DefaultKubeletDir         = "/var/lib/kubelet"
	DefaultSocketRoot         = "/var/run/vhostmq"
	DefaultContainerSocketDir = "/var/run/vhostmq"
	DefaultDevInfoDir         = "/var/run/k8s.cni.cncf.io/devinfo/dp"
	DefaultOwner              = 107
	// EnvSlots names the environment variable that carries the allocated
	// slot IDs into the container.
	EnvSlots = "VHOSTMQ_QUEUE_SLOTS"
)

// Plugin is one resource's device plugin.
type Plugin struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	slots   map[string]slotRef
	order   []string        // slot IDs in a stable order
	healthy map[string]bool // by slot ID
	reason  string          // why devices are unhealthy, for logs
	changed chan struct{}   // closed and replaced on every change
	gone    bool            // shutting down: report no devices
	// successor: when this one stopped, another instance served the
	// resource (set by serveOnce, read by Run after it)
	successor bool

	pluginapi.UnimplementedDevicePluginServer
	registerapi.UnimplementedRegistrationServer
	registered chan error // plugin-watcher mode: NotifyRegistrationStatus
}

// New validates the configuration and fills in defaults.
func New(cfg Config) (*Plugin, error) {
	if cfg.ResourceName == "" {
		cfg.ResourceName = DefaultResource
	}
	if cfg.KubeletDir == "" {
		cfg.KubeletDir = DefaultKubeletDir
	}
	if cfg.SocketRoot == "" {
		cfg.SocketRoot = DefaultSocketRoot
	}
	if cfg.ContainerSocketDir == "" {
		cfg.ContainerSocketDir = DefaultContainerSocketDir
	}
	if cfg.DevInfoDir == "" {
		cfg.DevInfoDir = DefaultDevInfoDir
	}
	if cfg.SocketMode == 0 {
		cfg.SocketMode = 0o770
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Instance == "" {
		cfg.Instance = fmt.Sprintf("pid%d", os.Getpid())
	}
	switch {
	case !instanceRE.MatchString(cfg.Instance):
		return nil, fmt.Errorf("instance: %q must be 1..64 of [a-zA-Z0-9-]", cfg.Instance)
	case strings.Count(cfg.ResourceName, "/") != 1 || strings.HasPrefix(cfg.ResourceName, "/") || strings.HasSuffix(cfg.ResourceName, "/"):
		return nil, fmt.Errorf("resource: %q is not a domain-qualified name like vhostmq.io/queue-pairs", cfg.ResourceName)
	case cfg.AgentSocket == "":
		return nil, errors.New("agent-socket: must not be empty")
	case cfg.SocketMode&^0o770 != 0:
		return nil, fmt.Errorf("socket-mode: %#o is wider than 0770", cfg.SocketMode)
	case !filepath.IsAbs(cfg.SocketRoot) || !filepath.IsAbs(cfg.ContainerSocketDir) || !filepath.IsAbs(cfg.DevInfoDir) || !filepath.IsAbs(cfg.KubeletDir):
		return nil, errors.New("socket-root, container-socket-dir, devinfo-dir, kubelet-dir: must be absolute paths")
	}
	return &Plugin{cfg: cfg, log: cfg.Logger.With("resource", cfg.ResourceName), slots: map[string]slotRef{},
		healthy: map[string]bool{}, changed: make(chan struct{})}, nil
}

var instanceRE = regexp.MustCompile(`^[a-zA-Z0-9-]{1,64}$`)

// socketPrefix starts the socket name of every instance of the resource.
func (p *Plugin) socketPrefix() string {
	return strings.ReplaceAll(p.cfg.ResourceName, "/", "_") + "-"
}

// socketName is the plugin's socket file name, unique per resource and
// instance.
func (p *Plugin) socketName() string {
	return p.socketPrefix() + p.cfg.Instance + ".sock"
}

// notify wakes every ListAndWatch stream. Caller holds mu.
func (p *Plugin) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// snapshot returns the device list to send and the channel that closes on
// the next change.
func (p *Plugin) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return []*pluginapi.Device{}, p.changed
	}
	out := make([]*pluginapi.Device, 0, len(p.order))
	for _, id := range p.order {
		d := &pluginapi.Device{ID: id, Health: pluginapi.Unhealthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(p.slots[id].numa)}}}}
		if p.healthy[id] {
			d.Health = pluginapi.Healthy
		}
		out = append(out, d)
	}
	return out, p.changed
}

// setCapacity replaces the slot set (from GetCapacity).
func (p *Plugin) setCapacity(c *agentv1.Capacity) {
	p.mu.Lock()
	defer p.mu.Unlock()
	slots := map[string]slotRef{}
	var order []string
	for _, cpu := range c.GetCpus() {
		for _, s := range cpu.GetSlots() {
			slots[s.GetId()] = slotRef{id: s.GetId(), cpu: int(cpu.GetId()), numa: int(cpu.GetNumaNode())}
			order = append(order, s.GetId())
		}
	}
	sort.Slice(order, func(i, j int) bool { return slotLess(order[i], order[j]) })
	if strings.Join(order, ",") != strings.Join(p.order, ",") {
		p.log.Info("queue slots from the node agent", "slots", len(order))
	}
	p.slots, p.order = slots, order
	p.notify()
}

// setHealth applies the agent's health; nil means the agent is unreachable
// and every slot is unhealthy.
func (p *Plugin) setHealth(h *agentv1.Health, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := map[string]bool{}
	if h != nil && h.GetHealthy() {
		for _, s := range h.GetSlots() {
			next[s.GetId()] = s.GetHealthy()
		}
	}
	same := len(next) == len(p.healthy)
	for k, v := range next {
		if p.healthy[k] != v {
			same = false
		}
	}
	if same && why == p.reason {
		return
	}
	n := 0
	for _, v := range next {
		if v {
			n++
		}
	}
	if why != p.reason || !same {
		p.log.Info("device health", "healthy", n, "of", len(p.order), "reason", why)
	}
	p.healthy, p.reason = next, why
	p.notify()
}

// routineAgent follows the node agent: capacity, then a health stream;
// while it is unreachable every device is unhealthy. It re-dials with a
// backoff capped at 1 s.
func (p *Plugin) routineAgent(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := p.followAgent(ctx)
		if ctx.Err() != nil {
			return
		}
		p.setHealth(nil, fmt.Sprintf("node agent unreachable: %v", err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (p *Plugin) followAgent(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+p.cfg.AgentSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := agentv1.NewAgentClient(conn)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	capa, err := client.GetCapacity(cctx, &agentv1.GetCapacityRequest{}, grpc.WaitForReady(false))
	cancel()
	if err != nil {
		return err
	}
	p.setCapacity(capa)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	stream, err := client.WatchHealth(sctx, &agentv1.WatchHealthRequest{})
	if err != nil {
		return err
	}
	for {
		h, err := stream.Recv()
		if err != nil {
			return err
		}
		why := "ok"
		if !h.GetHealthy() {
			why = h.GetReason()
		}
		p.setHealth(h, why)
	}
}

// GetDevicePluginOptions implements the device plugin API.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch streams the device list on every change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		devs, changed := p.snapshot()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation spreads each request over distinct CPUs of one
// NUMA node (see Prefer).
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	p.mu.Lock()
	slots := p.slots
	p.mu.Unlock()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.GetContainerRequests() {
		ids := Prefer(slots, c.GetAvailableDeviceIDs(), c.GetMustIncludeDeviceIDs(), int(c.GetAllocationSize()))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// PreStartContainer is not used (PreStartRequired is false).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// listen creates the plugin's socket in dir.
func listenSocket(dir, name string) (net.Listener, string, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, name)
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	return ln, path, err
}
