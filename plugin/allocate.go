package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// AllocationDir is the host directory name of an allocation: derived from
// its slot IDs alone (sorted), so the CNI plugin computes the same name
// from the device IDs Multus or the pod-resources API give it. A hash keeps
// it short: unix socket paths must stay under 108 bytes.
func AllocationDir(ids []string) string {
	s := append([]string(nil), ids...)
	sort.Strings(s)
	sum := sha256.Sum256([]byte(strings.Join(s, ",")))
	return "qp-" + hex.EncodeToString(sum[:8])
}

// slotsFile sits beside an allocation directory (not in it: the container
// sees the directory) and records its slot IDs, so that a freed
// allocation can be found and removed.
func slotsFile(root, dir string) string { return filepath.Join(root, "."+dir+".slots") }

// DeviceInfo is a device-info file (k8snetworkplumbingwg device-info spec
// 1.1.0) of type vhost-user.
type DeviceInfo struct {
	Type      string         `json:"type"`
	Version   string         `json:"version"`
	VhostUser *VhostUserInfo `json:"vhost-user,omitempty"`
}

// VhostUserInfo is the vhost-user part of a device-info file. Mode is seen
// from the container application: "server" means the application (QEMU)
// creates the socket.
type VhostUserInfo struct {
	Mode string `json:"mode"`
	Path string `json:"path"`
}

// devInfoPath is the device plugin's device-info file for one device, as
// Multus looks it up: <dir>/<resource with / as ->-<deviceID>-device.json.
func (p *Plugin) devInfoPath(id string) string {
	return filepath.Join(p.cfg.DevInfoDir, fmt.Sprintf("%s-%s-device.json", strings.ReplaceAll(p.cfg.ResourceName, "/", "-"), id))
}

// Allocate gives each container its socket directory, mounted at the same
// path on every node (so a migrated VM finds it), and the slot IDs.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		ids := c.GetDevicesIds()
		if len(ids) == 0 {
			return nil, status.Error(codes.InvalidArgument, "devices_ids: empty")
		}
		p.mu.Lock()
		for _, id := range ids {
			if _, ok := p.slots[id]; !ok {
				p.mu.Unlock()
				return nil, status.Errorf(codes.InvalidArgument, "devices_ids: %q is not a queue slot of this node", id)
			}
		}
		p.mu.Unlock()
		dir := AllocationDir(ids)
		host := filepath.Join(p.cfg.SocketRoot, dir)
		if err := p.makeAllocation(host, dir, ids); err != nil {
			return nil, status.Errorf(codes.Internal, "allocation directory %s: %v", host, err)
		}
		// The agent arbitrates with the DRA driver: a slot a claim holds is
		// refused here, and the allocation's slots are the DRA path's no
		// more (idempotent: the kubelet may allocate again for a restart).
		// The directory comes first: the agent drops an allocation's
		// reservation once its directory is gone. A refused allocation's
		// directory is reclaimed like any freed one.
		if err := p.reserve(dir, ids); err != nil {
			return nil, err
		}
		for _, id := range ids {
			if err := p.writeDevInfo(id); err != nil {
				return nil, status.Errorf(codes.Internal, "device-info for %s: %v", id, err)
			}
		}
		sorted := append([]string(nil), ids...)
		sort.Slice(sorted, func(i, j int) bool { return slotLess(sorted[i], sorted[j]) })
		p.log.Info("allocated", "slots", strings.Join(sorted, ","), "hostDir", host)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs:   map[string]string{EnvSlots: strings.Join(sorted, ",")},
			Mounts: []*pluginapi.Mount{{ContainerPath: p.cfg.ContainerSocketDir, HostPath: host}},
		})
	}
	return resp, nil
}

// reserve reserves the allocation's slots in the node agent
// ("alloc/<dir>").
func (p *Plugin) reserve(dir string, ids []string) error {
	return p.withAgent(func(ctx context.Context, c agentv1.AgentClient) error {
		_, err := c.Reserve(ctx, &agentv1.ReserveRequest{Owner: agentv1.OwnerAllocation + dir, Slots: ids}, grpc.WaitForReady(true))
		// An agent handing its ports to a successor answers Unavailable for
		// a few milliseconds: asked again until the deadline.
		for status.Code(err) == codes.Unavailable && ctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
			_, err = c.Reserve(ctx, &agentv1.ReserveRequest{Owner: agentv1.OwnerAllocation + dir, Slots: ids}, grpc.WaitForReady(true))
		}
		if err != nil {
			return status.Errorf(status.Code(err), "devices_ids: reserving %s in the node agent: %s", strings.Join(ids, ","), status.Convert(err).Message())
		}
		return nil
	})
}

// release gives a freed allocation's slots back in the node agent.
func (p *Plugin) release(dir string) error {
	return p.withAgent(func(ctx context.Context, c agentv1.AgentClient) error {
		_, err := c.Release(ctx, &agentv1.ReleaseRequest{Owner: agentv1.OwnerAllocation + dir})
		return err
	})
}

// withAgent calls the node agent over a fresh connection (a unix socket:
// cheap), with a deadline.
func (p *Plugin) withAgent(call func(context.Context, agentv1.AgentClient) error) error {
	conn, err := grpc.NewClient("unix://"+p.cfg.AgentSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return status.Errorf(codes.Unavailable, "node agent: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return call(ctx, agentv1.NewAgentClient(conn))
}

func (p *Plugin) makeAllocation(host, dir string, ids []string) error {
	if err := os.MkdirAll(p.cfg.SocketRoot, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(host, p.cfg.SocketMode); err != nil && !os.IsExist(err) {
		return err
	}
	if err := os.Chmod(host, p.cfg.SocketMode); err != nil {
		return err
	}
	if err := os.Chown(host, p.cfg.SocketUID, p.cfg.SocketGID); err != nil {
		return err
	}
	return os.WriteFile(slotsFile(p.cfg.SocketRoot, dir), []byte(strings.Join(ids, ",")+"\n"), 0o600)
}

// writeDevInfo replaces the device's device-info file (Multus' helpers
// refuse to overwrite, hence remove first; the file is read-only, 0444).
func (p *Plugin) writeDevInfo(id string) error {
	if err := os.MkdirAll(p.cfg.DevInfoDir, 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(DeviceInfo{Type: "vhost-user", Version: "1.1.0",
		VhostUser: &VhostUserInfo{Mode: "server", Path: p.cfg.ContainerSocketDir}})
	if err != nil {
		return err
	}
	path := p.devInfoPath(id)
	os.Remove(path)
	return os.WriteFile(path, b, 0o444)
}
