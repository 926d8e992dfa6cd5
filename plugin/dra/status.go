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

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/plugin"
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

// claimPorts maps reservation owners ("claim/<uid>") to the ports the
// CNI made on them (empty if the agent did not answer).
func (d *Driver) claimPorts(ctx context.Context) map[string]*agentv1.Port {
	out := map[string]*agentv1.Port{}
	l, err := d.cfg.Agent.ListPorts(ctx, &agentv1.ListPortsRequest{})
	if err != nil {
		return out
	}
	for _, p := range l.GetPorts() {
		if r := p.GetSpec().GetReservation(); r != "" {
			out[r] = p
		}
	}
	return out
}

// networkData is a port's network data for the claim's status: the pod's
// interface name for it and its MAC (a vhost-user port has no address).
func networkData(p *agentv1.Port) *resourceapply.NetworkDeviceDataApplyConfiguration {
	if p == nil {
		return nil
	}
	nd := resourceapply.NetworkDeviceData()
	if ifname := p.GetSpec().GetLabels()[agentv1.LabelInterface]; ifname != "" {
		nd.WithInterfaceName(ifname)
	}
	if mac := p.GetSpec().GetMac(); mac != "" {
		nd.WithHardwareAddress(mac)
	}
	return nd
}

// pendingStatus is a prepared claim whose status does not describe its
// port yet (the CNI makes it after the claim is prepared).
type pendingStatus struct {
	claim   *resourceapi.ResourceClaim
	results []resourceapi.DeviceRequestAllocationResult
	data    StatusData
}

// describePorts writes the network data of ports made since their claims
// were prepared (Run calls it on every capacity poll).
func (d *Driver) describePorts(ctx context.Context) {
	d.mu.Lock()
	todo := make([]pendingStatus, 0, len(d.pending))
	for _, p := range d.pending {
		todo = append(todo, p)
	}
	d.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	ports := d.claimPorts(ctx)
	for _, p := range todo {
		port := ports[plugin.ClaimOwner(string(p.claim.UID))]
		if port == nil {
			continue
		}
		if err := d.publishStatus(ctx, p.claim, p.results, p.data, port); err != nil {
			d.log.Warn("the claim's network data was not written", "claim", p.claim.Namespace+"/"+p.claim.Name, "err", err)
			continue
		}
		d.mu.Lock()
		delete(d.pending, p.claim.UID)
		d.mu.Unlock()
		d.log.Info("claim status: its port's network data", "claim", p.claim.Namespace+"/"+p.claim.Name, "port", port.GetSpec().GetId(), "mac", port.GetSpec().GetMac())
	}
}

// publishStatus writes the claim's device status: one entry per
// allocated device, Ready, with StatusData, and with the network data of
// the claim's port (nil: the CNI has not made it yet). Server-side apply
// with the driver as field manager, so other drivers' entries stay.
func (d *Driver) publishStatus(ctx context.Context, c *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult, sd StatusData, port *agentv1.Port) error {
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
		if nd := networkData(port); nd != nil {
			ds.WithNetworkData(nd)
		}
		status.WithDevices(ds. // (copied: complete it first)
					WithData(runtime.RawExtension{Raw: raw}).
					WithConditions(metav1apply.Condition().WithType("Ready").WithStatus(metav1.ConditionTrue).
						WithReason("Prepared").WithMessage(fmt.Sprintf("queue slot %s of vhost-user socket %s", r.Device, sd.VhostUserPath)).
						WithLastTransitionTime(now).WithObservedGeneration(c.Generation)))
	}
	claim := resourceapply.ResourceClaim(c.Name, c.Namespace).WithStatus(status)
	_, err = d.cfg.Kube.ResourceV1().ResourceClaims(c.Namespace).ApplyStatus(ctx, claim, metav1.ApplyOptions{FieldManager: DriverName, Force: true})
	return err
}
