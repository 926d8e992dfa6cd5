package agent

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/vhostmq/vhostmq/dataplane"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// A port's rate limits (dataplane/bandwidth.go) are part of its spec: the
// state file keeps them, so a restart and an upgrade's handoff (the
// successor reads the specs from the state file) give the port the same
// limits, and SetPortBandwidth changes the stored spec with the live port.

// limitsOf is the spec's bandwidth as the dataplane takes it.
func limitsOf(b *agentv1.Bandwidth) dataplane.Bandwidth {
	return dataplane.Bandwidth{
		Ingress: dataplane.Rate{BitsPerSecond: b.GetIngress().GetBitsPerSecond(), BurstBits: b.GetIngress().GetBurstBits()},
		Egress:  dataplane.Rate{BitsPerSecond: b.GetEgress().GetBitsPerSecond(), BurstBits: b.GetEgress().GetBurstBits()},
	}
}

// BandwidthSpec is the dataplane's bw as the API gives it, nil when it
// limits nothing (static ports from the config file, stats).
func BandwidthSpec(bw dataplane.Bandwidth) *agentv1.Bandwidth {
	return normalizeBandwidth(&agentv1.Bandwidth{
		Ingress: &agentv1.Rate{BitsPerSecond: bw.Ingress.BitsPerSecond, BurstBits: bw.Ingress.BurstBits},
		Egress:  &agentv1.Rate{BitsPerSecond: bw.Egress.BitsPerSecond, BurstBits: bw.Egress.BurstBits},
	})
}

// normalizeBandwidth drops a direction that says nothing (no rate, no
// burst) and a bandwidth left empty, so that unset and zero compare
// equal, and a state file without limits stays readable by older agents.
func normalizeBandwidth(b *agentv1.Bandwidth) *agentv1.Bandwidth {
	rate := func(r *agentv1.Rate) *agentv1.Rate {
		if r.GetBitsPerSecond() == 0 && r.GetBurstBits() == 0 {
			return nil
		}
		return &agentv1.Rate{BitsPerSecond: r.GetBitsPerSecond(), BurstBits: r.GetBurstBits()}
	}
	n := &agentv1.Bandwidth{Ingress: rate(b.GetIngress()), Egress: rate(b.GetEgress())}
	if n.Ingress == nil && n.Egress == nil {
		return nil
	}
	return n
}

// validateBandwidth is InvalidArgument naming the bad field below prefix
// ("spec." in a port spec): the dataplane's own check.
func validateBandwidth(prefix string, b *agentv1.Bandwidth) error {
	if err := limitsOf(b).Validate(); err != nil {
		msg := err.Error()
		if errors.Is(err, dataplane.ErrBadRate) {
			msg = strings.TrimSuffix(msg, ": "+dataplane.ErrBadRate.Error())
		}
		return status.Error(codes.InvalidArgument, prefix+msg)
	}
	return nil
}

// noteCappedBursts says when a burst is above what the dataplane
// enforces: the CRI runtimes pass 2^32-1 bits and more with every
// bandwidth annotation, and the spec keeps what was asked (a repeated
// CNI ADD then matches).
func (a *Agent) noteCappedBursts(id string, b *agentv1.Bandwidth) {
	for _, d := range []struct {
		dir string
		r   *agentv1.Rate
	}{{"ingress", b.GetIngress()}, {"egress", b.GetEgress()}} {
		if d.r.GetBurstBits() > dataplane.MaxBurstBits {
			a.log.Info("port bandwidth burst capped", "port", id, "direction", d.dir, "burstBits", d.r.GetBurstBits(), "capBits", uint64(dataplane.MaxBurstBits))
		}
	}
}

// SetBandwidth replaces a live port's rate limits and stores them with
// its spec (nil or zero: no limit).
func (a *Agent) SetBandwidth(id string, b *agentv1.Bandwidth) (*agentv1.Port, error) {
	b = normalizeBandwidth(b)
	if err := validateBandwidth("", b); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handing {
		return nil, errHanding
	}
	r, ok := a.ports[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "id: no port %q", id)
	}
	if r.static {
		return nil, status.Errorf(codes.FailedPrecondition, "id: port %q comes from the config file; set its bandwidth there", id)
	}
	old := r.spec
	if proto.Equal(old.Bandwidth, b) {
		return a.portLocked(r), nil
	}
	if err := a.dp.SetBandwidth(id, limitsOf(b)); err != nil {
		return nil, status.Errorf(codes.Internal, "setting the bandwidth of port %q: %v", id, err)
	}
	spec := clone(old)
	spec.Bandwidth = b
	r.spec = spec
	if err := a.saveLocked(); err != nil {
		// Not stored: the port keeps what the state file says.
		r.spec = old
		if rerr := a.dp.SetBandwidth(id, limitsOf(old.Bandwidth)); rerr != nil {
			a.log.Error("port bandwidth not restored after a failed save", "port", id, "err", rerr)
		}
		return nil, status.Errorf(codes.Internal, "saving state: %v", err)
	}
	a.noteCappedBursts(id, b)
	return a.portLocked(r), nil
}

// SetPortBandwidth implements the API.
func (a *Agent) SetPortBandwidth(_ context.Context, req *agentv1.SetPortBandwidthRequest) (*agentv1.Port, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id: must not be empty")
	}
	return a.SetBandwidth(req.GetId(), req.GetBandwidth())
}
