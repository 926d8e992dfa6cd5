package bandwidth

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

func TestParseQuantity(t *testing.T) {
	for _, c := range []struct {
		s    string
		want uint64
		err  string
	}{
		{"0", 0, ""},
		{"100M", 100_000_000, ""},
		{"1G", 1_000_000_000, ""},
		{"1Gi", 1 << 30, ""},
		{"64Ki", 64 << 10, ""},
		{"1500k", 1_500_000, ""},
		{"1.5k", 1500, ""},
		{"1.5e9", 1_500_000_000, ""},
		{"0.5", 1, ""},  // rounds up, as Quantity.Value does
		{"100m", 1, ""}, // milli
		{"1E", 1e18, ""},
		{"", 0, `"" is not a quantity like 100M, 1G or 1500k`},
		{"fast", 0, `"fast" is not a quantity`},
		{"100 M", 0, `"100 M" is not a quantity`},
		{"100Mbit", 0, `"100Mbit" is not a quantity`},
		{"-1M", 0, `"-1M" is negative`},
		{"2E", 0, `"2E" is more than 1E`},
	} {
		got, err := ParseQuantity(c.s)
		if c.err == "" && (err != nil || got != c.want) {
			t.Errorf("ParseQuantity(%q) = %d, %v; want %d", c.s, got, err, c.want)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseQuantity(%q) = %d, %v; want an error %q", c.s, got, err, c.err)
		}
	}
}

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		s    string
		want uint64
		err  string
	}{
		{"0", 0, ""}, // no limit
		{"8k", 8000, ""},
		{"1T", 1e12, ""},
		{"7999", 0, `"7999": 7999 bits/s is outside the dataplane's 8000..1000000000000 (8 kbit/s..1 Tbit/s)`},
		{"1001G", 0, `"1001G": 1001000000000 bits/s is outside`},
		{"100m", 0, `"100m": 1 bits/s is outside the dataplane's 8000..1000000000000 (8 kbit/s..1 Tbit/s) (m is milli: M is mega)`},
		{"x", 0, `"x" is not a quantity`},
	} {
		got, err := ParseRate(c.s)
		if c.err == "" && (err != nil || got != c.want) {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", c.s, got, err, c.want)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("ParseRate(%q) = %d, %v; want an error %q", c.s, got, err, c.err)
		}
	}
}

// The annotations as Kubernetes reads them (1k..1P), then the
// dataplane's bounds; errors begin with the annotation.
func TestFromAnnotations(t *testing.T) {
	r := func(bps uint64) *agentv1.Rate { return &agentv1.Rate{BitsPerSecond: bps} }
	for _, c := range []struct {
		name string
		a    map[string]string
		want *agentv1.Bandwidth
		err  string
	}{
		{"none", map[string]string{"vhostmq.io/queues": "4"}, nil, ""},
		{"nil", nil, nil, ""},
		{"ingress", map[string]string{AnnotationIngress: "100M"}, &agentv1.Bandwidth{Ingress: r(100e6)}, ""},
		{"both", map[string]string{AnnotationIngress: "1G", AnnotationEgress: "10Mi"}, &agentv1.Bandwidth{Ingress: r(1e9), Egress: r(10 << 20)}, ""},
		{"not a quantity", map[string]string{AnnotationIngress: "fast"},
			nil, `kubernetes.io/ingress-bandwidth: "fast" is not a quantity like 100M, 1G or 1500k (bits per second)`},
		{"empty", map[string]string{AnnotationEgress: ""}, nil, `kubernetes.io/egress-bandwidth: "" is not a quantity`},
		{"negative", map[string]string{AnnotationEgress: "-10M"}, nil, `kubernetes.io/egress-bandwidth: "-10M" is negative`},
		{"below Kubernetes' 1k", map[string]string{AnnotationEgress: "999"}, nil, `kubernetes.io/egress-bandwidth: "999" is outside Kubernetes' 1k..1P bits per second`},
		{"milli", map[string]string{AnnotationEgress: "10m"}, nil, `kubernetes.io/egress-bandwidth: "10m" is outside Kubernetes' 1k..1P bits per second (m is milli: M is mega)`},
		{"above Kubernetes' 1P", map[string]string{AnnotationIngress: "2P"}, nil, `kubernetes.io/ingress-bandwidth: "2P" is outside Kubernetes' 1k..1P`},
		{"Kubernetes' but below the dataplane's", map[string]string{AnnotationIngress: "2k"},
			nil, `kubernetes.io/ingress-bandwidth: "2k": 2000 bits/s is outside the dataplane's 8000..1000000000000`},
		{"Kubernetes' but above the dataplane's", map[string]string{AnnotationEgress: "5T"},
			nil, `kubernetes.io/egress-bandwidth: "5T": 5000000000000 bits/s is outside the dataplane's`},
	} {
		got, err := FromAnnotations(c.a)
		if c.err == "" && (err != nil || !proto.Equal(got, c.want)) {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || got != nil) {
			t.Errorf("%s: %v, %v; want an error %q", c.name, got, err, c.err)
		}
	}
}
