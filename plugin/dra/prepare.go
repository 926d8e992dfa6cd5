package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/internal/atomicfile"
	"github.com/vhostmq/vhostmq/plugin"
)

// Names a prepared claim gives its container.
const (
	// EnvSocket carries the socket's path in the container.
	EnvSocket = "VHOSTMQ_SOCKET"
	// AttrVhostUserPath and AttrMTU are the device metadata attributes a
	// DRA network binding reads (the names of KubeVirt's vhost-user
	// binding plugin and dra-driver-ovsdpdk).
	AttrVhostUserPath = "vhost-user-path"
	AttrMTU           = "mtu"
)

// Config configures the claim preparation.
type Config struct {
	Agent              agentv1.AgentClient
	Kube               kubernetes.Interface // the claims' status is written through it; nil: not written
	NodeName           string               // the pool: one per node
	SocketRoot         string               // host directory of the claims' socket directories
	ContainerSocketDir string               // under which a container sees its claims' directories
	CDIDir             string               // where CDI spec files go (the runtime reads them)
	MTU                int                  // the ports' MTU, for the metadata; 0: not said
	SocketUID          int
	SocketGID          int
	SocketMode         os.FileMode
	Logger             *slog.Logger
}

// Driver prepares and unprepares claims (kubeletplugin.DRAPlugin).
type Driver struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	pending map[types.UID]pendingStatus // prepared claims whose status awaits their port
}

// New fills in defaults.
func New(cfg Config) (*Driver, error) {
	if cfg.Agent == nil || cfg.NodeName == "" || cfg.SocketRoot == "" || cfg.CDIDir == "" {
		return nil, errors.New("dra: Agent, NodeName, SocketRoot and CDIDir are required")
	}
	if cfg.ContainerSocketDir == "" {
		cfg.ContainerSocketDir = plugin.DefaultContainerSocketDir
	}
	if cfg.SocketMode == 0 {
		cfg.SocketMode = 0o770
	}
	if cfg.SocketMode&^0o770 != 0 {
		return nil, fmt.Errorf("dra: socket mode %o is wider than 0770", cfg.SocketMode)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Driver{cfg: cfg, log: cfg.Logger, pending: map[types.UID]pendingStatus{}}, nil
}

// ContainerDir is where a container sees a claim's directory: named by the
// pod's name for the claim (the same in a migration's source and target
// pods, whose claims differ: the domain XML names the socket), else the
// claim's name.
func (d *Driver) ContainerDir(c *resourceapi.ResourceClaim) string {
	name := c.Name
	if n := c.Annotations[resourceapi.PodResourceClaimAnnotation]; n != "" {
		name = n
	}
	return filepath.Join(d.cfg.ContainerSocketDir, name)
}

func cdiName(claim types.UID) string { return "claim-" + string(claim) }

// CDIDeviceID is the CDI device of a claim: its socket directory mounted.
func CDIDeviceID(claim types.UID) string { return cdiKind + "=" + cdiName(claim) }

// PrepareResourceClaims reserves every claim's slots in the agent, makes
// its socket directory and CDI spec, and returns its devices with the
// socket's path in their metadata. Idempotent.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devices, err := d.prepare(ctx, c)
		out[c.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devices}
		if err != nil {
			d.log.Error("claim not prepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "err", err)
		}
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s: status.allocation: not allocated", c.Namespace, c.Name)
	}
	var results []resourceapi.DeviceRequestAllocationResult
	req := &agentv1.ReserveRequest{Owner: plugin.ClaimOwner(string(c.UID))}
	for i, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		field := fmt.Sprintf("claim %s/%s: status.allocation.devices.results[%d]", c.Namespace, c.Name, i)
		if r.Pool != d.cfg.NodeName {
			return nil, fmt.Errorf("%s.pool: %q is not this node's pool %q", field, r.Pool, d.cfg.NodeName)
		}
		results = append(results, r)
		n, perNUMA := numaOfDevice(r.Device)
		if !perNUMA { // one device per slot: exactly these slots
			req.Slots = append(req.Slots, r.Device)
			continue
		}
		// a NUMA node's device: its consumed queuePairs, slots picked here
		q, ok := r.ConsumedCapacity[CapQueuePairs]
		switch {
		case !ok || q.Value() < 1:
			return nil, fmt.Errorf("%s.consumedCapacity: no %s of device %s", field, CapQueuePairs, r.Device)
		case req.NumaNode != nil && *req.NumaNode != n:
			return nil, fmt.Errorf("%s.device: %s is on another NUMA node than the claim's other queue pairs (one claim, one NUMA node)", field, r.Device)
		}
		req.NumaNode = ptr.To(n)
		req.Count += uint32(q.Value())
	}
	if len(results) == 0 {
		return nil, nil
	}
	if len(req.Slots) > 0 && req.Count > 0 {
		return nil, fmt.Errorf("claim %s/%s: status.allocation.devices.results: both slot devices and NUMA node devices (one device mode per driver)", c.Namespace, c.Name)
	}
	var pods []string
	for _, ref := range c.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			pods = append(pods, string(ref.UID))
		}
	}
	cdir := d.ContainerDir(c)
	if errs := validation.IsDNS1123Subdomain(filepath.Base(cdir)); len(errs) > 0 {
		return nil, fmt.Errorf("claim %s/%s: its directory name %q: %s", c.Namespace, c.Name, filepath.Base(cdir), strings.Join(errs, "; "))
	}
	req.Pods = pods
	res, err := d.cfg.Agent.Reserve(ctx, req)
	if err != nil {
		what := "slots " + strings.Join(req.Slots, ",")
		if req.Count > 0 {
			what = fmt.Sprintf("%d slots on NUMA node %d", req.Count, req.GetNumaNode())
		}
		return nil, fmt.Errorf("claim %s/%s: reserving %s in the node agent: %w", c.Namespace, c.Name, what, err)
	}
	host := filepath.Join(d.cfg.SocketRoot, plugin.ClaimDir(string(c.UID)))
	socket := filepath.Join(cdir, plugin.ClaimSocketName)
	env := []string{plugin.EnvSlots + "=" + strings.Join(res.GetSlots(), ","), EnvSocket + "=" + socket}
	if err := d.makeDir(host); err != nil {
		err = fmt.Errorf("claim %s/%s: socket directory %s: %w", c.Namespace, c.Name, host, err)
		return nil, errors.Join(err, d.unprepare(ctx, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}))
	}
	if err := writeCDISpec(d.cfg.CDIDir, cdiName(c.UID), host, cdir, env); err != nil {
		err = fmt.Errorf("claim %s/%s: CDI spec: %w", c.Namespace, c.Name, err)
		return nil, errors.Join(err, d.unprepare(ctx, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}))
	}
	rec, _ := json.Marshal(plugin.ClaimRecord{Claim: string(c.UID), Namespace: c.Namespace, Name: c.Name, Slots: res.GetSlots(), ContainerDir: cdir})
	if err := atomicfile.WriteBytes(plugin.ClaimRecordFile(d.cfg.SocketRoot, string(c.UID)), append(rec, '\n'), 0o600, false); err != nil {
		err = fmt.Errorf("claim %s/%s: its record for the CNI plugin: %w", c.Namespace, c.Name, err)
		return nil, errors.Join(err, d.unprepare(ctx, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}))
	}
	// A claim whose status cannot be written is still prepared (the pod
	// needs only the files): logged, and written again on the next prepare.
	sd := StatusData{VhostUserPath: socket, Mode: "server", Slots: res.GetSlots(), MTU: d.cfg.MTU}
	if d.cfg.Kube != nil {
		port := d.claimPorts(ctx)[req.Owner]
		if err := d.publishStatus(ctx, c, results, sd, port); err != nil {
			d.log.Warn("claim prepared, but its device status was not written", "claim", c.Namespace+"/"+c.Name, "err", err)
		}
		if port == nil { // the port's network data follows
			d.mu.Lock()
			d.pending[c.UID] = pendingStatus{claim: c.DeepCopy(), results: results, data: sd}
			d.mu.Unlock()
		}
	}
	devices := make([]kubeletplugin.Device, 0, len(results))
	for i, r := range results {
		// the slice's attributes of the device, and the socket
		attrs := map[string]resourceapi.DeviceAttribute{
			AttrVhostUserPath: {StringValue: ptr.To(socket)},
			AttrSlots:         {StringValue: ptr.To(strings.Join(res.GetSlots(), ","))},
			AttrNUMANode:      {IntValue: ptr.To(int64(res.GetNumaNode()))},
		}
		if req.Count == 0 {
			attrs[AttrSlot] = resourceapi.DeviceAttribute{StringValue: ptr.To(r.Device)}
		}
		if d.cfg.MTU > 0 {
			attrs[AttrMTU] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.cfg.MTU))}
		}
		dev := kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, ShareID: r.ShareID,
			Metadata: &kubeletplugin.DeviceMetadata{Attributes: attrs}}
		if i == 0 { // one mount per claim, however many slots it has
			dev.CDIDeviceIDs = []string{CDIDeviceID(c.UID)}
		}
		devices = append(devices, dev)
	}
	d.log.Info("claim prepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "slots", res.GetSlots(), "pods", pods, "hostDir", host, "socket", socket)
	return devices, nil
}

func (d *Driver) makeDir(host string) error {
	if err := os.MkdirAll(d.cfg.SocketRoot, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(host, d.cfg.SocketMode); err != nil && !os.IsExist(err) {
		return err
	}
	if err := os.Chmod(host, d.cfg.SocketMode); err != nil {
		return err
	}
	return os.Chown(host, d.cfg.SocketUID, d.cfg.SocketGID)
}

// UnprepareResourceClaims releases the claims' slots and removes their
// CDI specs and socket directories. A claim not prepared is no error. A
// directory that still holds a socket (a port not deleted yet) is left to
// the next call.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.unprepare(ctx, c)
	}
	return out, nil
}

func (d *Driver) unprepare(ctx context.Context, c kubeletplugin.NamespacedObject) error {
	// Every step is tried, whatever failed before: what can go, goes.
	d.mu.Lock()
	delete(d.pending, c.UID)
	d.mu.Unlock()
	var errs []error
	host := filepath.Join(d.cfg.SocketRoot, plugin.ClaimDir(string(c.UID)))
	if err := os.Remove(filepath.Join(host, plugin.ClaimSocketName)); err != nil && !gone(err) {
		errs = append(errs, err)
	}
	if err := os.Remove(host); err != nil && !gone(err) {
		errs = append(errs, fmt.Errorf("socket directory %s: %w", host, err))
	}
	if err := os.Remove(plugin.ClaimRecordFile(d.cfg.SocketRoot, string(c.UID))); err != nil && !gone(err) {
		errs = append(errs, err)
	}
	if err := removeCDISpec(d.cfg.CDIDir, cdiName(c.UID)); err != nil {
		errs = append(errs, fmt.Errorf("CDI spec: %w", err))
	}
	if _, err := d.cfg.Agent.Release(ctx, &agentv1.ReleaseRequest{Owner: plugin.ClaimOwner(string(c.UID))}); err != nil {
		errs = append(errs, fmt.Errorf("releasing its slots in the node agent: %w", err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("claim %s: %w", c.NamespacedName, errors.Join(errs...))
	}
	d.log.Info("claim unprepared", "claim", c.NamespacedName.String(), "uid", c.UID)
	return nil
}

// gone: removing found nothing to remove (a missing parent included).
func gone(err error) bool { return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) }

// HandleError logs background errors (ResourceSlice publishing); they are
// retried by the helper.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	d.log.Error(msg, "err", err, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
}

// WatchHealthStatus: the driver does not report device health to the
// kubelet (the device plugin path does).
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
