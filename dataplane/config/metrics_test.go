package config

import (
	"strings"
	"testing"
)

func TestMetricsFields(t *testing.T) {
	t.Setenv("VMQ_TEST_POD_IP", "10.1.2.3")
	t.Setenv("VMQ_TEST_POD_IP6", "fd00::7")
	t.Setenv("VMQ_TEST_BAD_IP", "node-1")
	for _, c := range []struct {
		name   string
		yaml   string
		field  string // what the error must name; "" means valid
		listen string // with field "": the resolved address
	}{
		{"localhost", `metricsAddress: "127.0.0.1:9474"`, "", "127.0.0.1:9474"},
		{"pod IP from env", "metricsAddress: \":9474\"\nmetricsHostEnv: VMQ_TEST_POD_IP", "", "10.1.2.3:9474"},
		{"pod IPv6 from env", "metricsAddress: \":9474\"\nmetricsHostEnv: VMQ_TEST_POD_IP6", "", "[fd00::7]:9474"},
		{"env unset", "metricsAddress: \":9474\"\nmetricsHostEnv: VMQ_TEST_UNSET", "metricsHostEnv", ""},
		{"env not an IP", "metricsAddress: \":9474\"\nmetricsHostEnv: VMQ_TEST_BAD_IP", "metricsHostEnv", ""},
		{"env bad name", "metricsAddress: \":9474\"\nmetricsHostEnv: POD-IP", "metricsHostEnv", ""},
		{"env without address", "metricsHostEnv: VMQ_TEST_POD_IP", "metricsHostEnv", ""},
		{"env and a host", "metricsAddress: \"0.0.0.0:9474\"\nmetricsHostEnv: VMQ_TEST_POD_IP", "metricsAddress", ""},
		{"auth bogus", "metricsAddress: \":9474\"\nmetricsAuth: token", "metricsAuth", ""},
		{"auth without address", "metricsAuth: kubernetes", "metricsAuth", ""},
		{"kubernetes self-signed", "metricsAddress: \":9474\"\nmetricsAuth: kubernetes", "", ":9474"},
		{"kubernetes with a cert", "metricsAddress: \":9474\"\nmetricsAuth: kubernetes\nmetricsTLS: {certFile: /m/tls.crt, keyFile: /m/tls.key}", "", ":9474"},
		{"kubernetes with a client CA", "metricsAddress: \":9474\"\nmetricsAuth: kubernetes\nmetricsTLS: {clientCAFile: /m/ca.crt}", "metricsTLS.clientCAFile", ""},
		{"tls without cert", "metricsAddress: \":9474\"\nmetricsAuth: tls", "metricsTLS.certFile", ""},
		{"tls without key", "metricsAddress: \":9474\"\nmetricsAuth: tls\nmetricsTLS: {certFile: /m/tls.crt}", "metricsTLS.keyFile", ""},
		{"tls relative", "metricsAddress: \":9474\"\nmetricsAuth: tls\nmetricsTLS: {certFile: m/tls.crt, keyFile: /m/tls.key}", "metricsTLS.certFile", ""},
		{"tls with client CA", "metricsAddress: \":9474\"\nmetricsAuth: tls\nmetricsTLS: {certFile: /m/tls.crt, keyFile: /m/tls.key, clientCAFile: /c/ca.crt}", "", ":9474"},
		{"tls files without auth", "metricsAddress: \":9474\"\nmetricsTLS: {certFile: /m/tls.crt, keyFile: /m/tls.key}", "metricsTLS", ""},
	} {
		cfg, err := Parse([]byte(c.yaml))
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.field != "" && err == nil:
			t.Errorf("%s: accepted\n%s", c.name, c.yaml)
		case c.field != "" && !strings.Contains(err.Error(), c.field+":"):
			t.Errorf("%s: error %q does not name %s", c.name, err, c.field)
		case c.field == "":
			if got, err := cfg.MetricsListen(); err != nil || got != c.listen {
				t.Errorf("%s: MetricsListen() = %q, %v; want %q", c.name, got, err, c.listen)
			}
		}
	}
}
