package dra

import (
	"context"
	"fmt"
	"os"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// RunConfig adds what the kubelet plugin needs to the driver's Config.
type RunConfig struct {
	Config
	KubeletDir string // the kubelet's root: plugins/ and plugins_registry/ are under it
	// PollCapacity: how often the slice is checked against the agent
	// (a local call); default 1 s. A slot the device plugin's side took
	// stays in the slice until then, and a claim the scheduler gives it
	// waits (its prepare is refused and retried) until that slot is free.
	PollCapacity time.Duration
	// PerNUMA publishes one device per NUMA node with consumable capacity
	// queuePairs (DevicesPerNUMA) instead of one device per slot (Devices).
	PerNUMA bool
	// PodUID (the driver's pod) gives this instance its own sockets, so
	// that a DaemonSet's surge update has old and new registered at once
	// (kubeletplugin.RollingUpdate, kubelet >= 1.33); "": one instance.
	PodUID string
}

// Run registers the driver with the kubelet, publishes the node's slots as
// its ResourceSlice (again whenever the agent's slots change) and prepares
// claims until ctx ends.
func Run(ctx context.Context, rc RunConfig) error {
	d, err := New(rc.Config)
	if err != nil {
		return err
	}
	if rc.KubeletDir == "" {
		rc.KubeletDir = "/var/lib/kubelet"
	}
	if rc.PollCapacity == 0 {
		rc.PollCapacity = time.Second
	}
	// the kubelet does not make the plugin's directory; the helper
	// listens there (dra.sock) and keeps the metadata files under it
	pluginDir := rc.KubeletDir + "/plugins/" + DriverName
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return fmt.Errorf("--kubelet-dir: the plugin directory: %w", err)
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(rc.NodeName),
		kubeletplugin.KubeClient(rc.Kube),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(rc.KubeletDir+"/plugins_registry"),
		kubeletplugin.CDIDirectory(rc.CDIDir),
		// the metadata file's newest version (the only one so far); a
		// consumer picks the first version it knows from the file's stream
		kubeletplugin.RollingUpdate(types.UID(rc.PodUID)),
		kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}),
	)
	if err != nil {
		return fmt.Errorf("starting the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	d.log.Info("DRA driver registered", "driver", DriverName, "node", rc.NodeName)
	var published []resourceapi.Device
	t := time.NewTicker(rc.PollCapacity)
	defer t.Stop()
	for {
		c, err := rc.Agent.GetCapacity(ctx, &agentv1.GetCapacityRequest{})
		if err != nil {
			d.log.Warn("node agent unavailable; the published slice stays", "err", err)
		} else if devs := devicesOf(c, rc.PerNUMA); published == nil || !equality.Semantic.DeepEqual(devs, published) {
			res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
				rc.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
			}}
			if err := helper.PublishResources(ctx, res); err != nil {
				d.log.Error("publishing the ResourceSlice", "err", err)
			} else {
				published = devs
				d.log.Info("ResourceSlice published", "devices", len(devs))
			}
		}
		d.describePorts(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func devicesOf(c *agentv1.Capacity, perNUMA bool) []resourceapi.Device {
	if perNUMA {
		return DevicesPerNUMA(c)
	}
	return Devices(c)
}
