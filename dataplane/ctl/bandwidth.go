package ctl

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/pflag"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/internal/bandwidth"
)

// A port's rate limits: port add's flags, port bandwidth, and how port
// show prints them. Rates and bursts are Kubernetes quantities (100M, 1G,
// 64Ki), as in the pod annotations and the config file.

// quantityValue is a flag holding a quantity of bits (a burst) or, with
// rate, bits per second within the dataplane's bounds.
type quantityValue struct {
	p    *uint64
	rate bool
	set  bool
}

func (v *quantityValue) String() string {
	if v.p == nil || !v.set {
		return ""
	}
	return strconv.FormatUint(*v.p, 10)
}

func (v *quantityValue) Type() string { return "quantity" }

func (v *quantityValue) Set(s string) error {
	parse := bandwidth.ParseQuantity
	if v.rate {
		parse = bandwidth.ParseRate
	}
	n, err := parse(s)
	if err != nil {
		return err
	}
	*v.p, v.set = n, true
	return nil
}

// rateFlags are one direction's rate flag (--ingress-bandwidth in port
// add, --ingress in port bandwidth) and its burst flag.
type rateFlags struct {
	bps, burst uint64
	rate       *quantityValue
	burstV     *quantityValue
}

// apply is the direction's limit from its flags; with neither flag, cur
// (the port's, for port bandwidth).
func (f *rateFlags) apply(cur *agentv1.Rate) *agentv1.Rate {
	switch {
	case f.rate.set:
		// A new rate takes a new burst: the old one was sized for the
		// old rate.
		return &agentv1.Rate{BitsPerSecond: f.bps, BurstBits: f.burst}
	case f.burstV.set:
		return &agentv1.Rate{BitsPerSecond: cur.GetBitsPerSecond(), BurstBits: f.burst}
	}
	return cur
}

func (f *rateFlags) given() bool { return f.rate.set || f.burstV.set }

// bandwidthFlags are port add's and port bandwidth's rate limit flags.
type bandwidthFlags struct{ ingress, egress *rateFlags }

// addBandwidthFlags adds --ingress<suffix>, --egress<suffix> and the
// burst flags.
func addBandwidthFlags(fs *pflag.FlagSet, suffix string) *bandwidthFlags {
	b := &bandwidthFlags{ingress: &rateFlags{}, egress: &rateFlags{}}
	for _, d := range []struct {
		f         *rateFlags
		name, how string
	}{
		{b.ingress, "ingress", "to the guest; policed: frames above it are dropped, counted as rate_limited"},
		{b.egress, "egress", "from the guest; shaped: its frames wait in its ring"},
	} {
		d.f.rate, d.f.burstV = &quantityValue{p: &d.f.bps, rate: true}, &quantityValue{p: &d.f.burst}
		fs.Var(d.f.rate, d.name+suffix, fmt.Sprintf("%s limit, a `RATE` in bits per second like 100M or 1G (%s)", d.name, d.how))
		fs.Var(d.f.burstV, d.name+"-burst", fmt.Sprintf("%s burst, `BITS` like 1M or 64Ki (default: 10 ms of the rate, at least two MTU frames; at most 2^30)", d.name))
	}
	return b
}

func (b *bandwidthFlags) given() bool { return b.ingress.given() || b.egress.given() }

// spec is the limits the flags give over cur (nil: none).
func (b *bandwidthFlags) spec(cur *agentv1.Bandwidth) *agentv1.Bandwidth {
	out := &agentv1.Bandwidth{Ingress: b.ingress.apply(cur.GetIngress()), Egress: b.egress.apply(cur.GetEgress())}
	if out.GetIngress().GetBitsPerSecond() == 0 && out.GetIngress().GetBurstBits() == 0 {
		out.Ingress = nil
	}
	if out.GetEgress().GetBitsPerSecond() == 0 && out.GetEgress().GetBurstBits() == 0 {
		out.Egress = nil
	}
	if out.Ingress == nil && out.Egress == nil {
		return nil
	}
	return out
}

func portBandwidthSetup(fs *pflag.FlagSet) runFunc {
	bw := addBandwidthFlags(fs, "")
	var clearAll bool
	fs.BoolVar(&clearAll, "clear", false, "remove both limits")
	return func(ctx context.Context, c *cli, args []string) error {
		if clearAll == bw.given() {
			return usageErrorf("give --ingress, --egress or their bursts, or --clear (not both)")
		}
		var want *agentv1.Bandwidth
		if !clearAll {
			p, err := call(ctx, c, agentv1.AgentClient.GetPort, &agentv1.GetPortRequest{Id: args[0]})
			if err != nil {
				return err
			}
			want = bw.spec(p.GetSpec().GetBandwidth())
		}
		p, err := call(ctx, c, agentv1.AgentClient.SetPortBandwidth, &agentv1.SetPortBandwidthRequest{Id: args[0], Bandwidth: want})
		if err != nil {
			return err
		}
		return c.printPort(p)
	}
}

// bandwidthJSON is a port's rate limits in -o json; a direction without
// one is null.
type bandwidthJSON struct {
	Ingress *rateJSON `json:"ingress"` // to the guest: policed
	Egress  *rateJSON `json:"egress"`  // from the guest: shaped
}

type rateJSON struct {
	BitsPerSecond uint64 `json:"bits_per_second"`
	BurstBits     uint64 `json:"burst_bits"` // 0: 10 ms of the rate
}

func toBandwidthJSON(b *agentv1.Bandwidth) *bandwidthJSON {
	rate := func(r *agentv1.Rate) *rateJSON {
		if r.GetBitsPerSecond() == 0 && r.GetBurstBits() == 0 {
			return nil
		}
		return &rateJSON{BitsPerSecond: r.GetBitsPerSecond(), BurstBits: r.GetBurstBits()}
	}
	j := &bandwidthJSON{Ingress: rate(b.GetIngress()), Egress: rate(b.GetEgress())}
	if j.Ingress == nil && j.Egress == nil {
		return nil
	}
	return j
}

// bandwidthLine says what port show's Bandwidth: row does.
func bandwidthLine(b *bandwidthJSON) string {
	if b == nil {
		return "no limit"
	}
	dir := func(name string, r *rateJSON, how string) string {
		if r == nil || r.BitsPerSecond == 0 {
			return name + " no limit"
		}
		burst := fmt.Sprintf("burst %d ms of it", agentv1.DefaultBurstMillis)
		if r.BurstBits != 0 {
			burst = "burst " + humanRate(float64(r.BurstBits), "bit")
			if r.BurstBits > agentv1.MaxBurstBits {
				burst += " capped at " + humanRate(agentv1.MaxBurstBits, "bit")
			}
		}
		return fmt.Sprintf("%s %s, %s (%s)", name, bps(float64(r.BitsPerSecond)), burst, how)
	}
	return dir("ingress", b.Ingress, "policed") + "; " + dir("egress", b.Egress, "shaped")
}
