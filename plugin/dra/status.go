package dra

import (
	"context"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	metav1apply "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
)

// StatusData is what a prepared device says in the claim's status
// (status.devices[].data, KEP-4817), for tools and controllers that read
// the claim rather than the pod's metadata file.
type StatusData struct {
	// VhostUserPath is the socket as the pod's containers see it.
	VhostUserPath string `json:"vhostUserPath"`
	// Mode is QEMU's side of the socket: "server" (QEMU listens, the
	// dataplane dials and reconnects).
	Mode string `json:"mode"`
	// Slots are the claim's queue slots, one queue pair each.
	Slots []string `json:"slots"`
	// MTU is the ports' MTU when the driver was told it.
	MTU int `json:"mtu,omitempty"`
}

// publishStatus writes the claim's device status: one entry per
// allocated device, Ready, with StatusData. Server-side apply with the
// driver as field manager, so other drivers' entries stay.
func (d *Driver) publishStatus(ctx context.Context, c *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult, sd StatusData) error {
	if d.cfg.Kube == nil {
		return nil
	}
	raw, err := json.Marshal(sd)
	if err != nil {
		return err
	}
	now := metav1.Now()
	status := resourceapply.ResourceClaimStatus()
	for _, r := range results {
		ds := resourceapply.AllocatedDeviceStatus().WithDriver(r.Driver).WithPool(r.Pool).WithDevice(r.Device)
		if r.ShareID != nil { // a share of a NUMA node's device
			ds.WithShareID(string(*r.ShareID))
		}
		status.WithDevices(ds.
			WithData(runtime.RawExtension{Raw: raw}).
			WithConditions(metav1apply.Condition().WithType("Ready").WithStatus(metav1.ConditionTrue).
				WithReason("Prepared").WithMessage(fmt.Sprintf("queue slot %s of vhost-user socket %s", r.Device, sd.VhostUserPath)).
				WithLastTransitionTime(now).WithObservedGeneration(c.Generation)))
	}
	claim := resourceapply.ResourceClaim(c.Name, c.Namespace).WithStatus(status)
	_, err = d.cfg.Kube.ResourceV1().ResourceClaims(c.Namespace).ApplyStatus(ctx, claim, metav1.ApplyOptions{FieldManager: DriverName, Force: true})
	return err
}
