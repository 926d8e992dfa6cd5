package config

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
)

// Metrics authentication modes (metricsAuth).
const (
	MetricsAuthNone       = "none"
	MetricsAuthKubernetes = "kubernetes"
	MetricsAuthTLS        = "tls"
)

// MetricsTLS names the metrics server's certificate files (a mounted
// Secret: they are re-read when they change).
type MetricsTLS struct {
	CertFile string `yaml:"certFile,omitempty"`
	KeyFile  string `yaml:"keyFile,omitempty"`
	// ClientCAFile: with metricsAuth tls, /metrics needs a client
	// certificate signed by one of these CAs.
	ClientCAFile string `yaml:"clientCAFile,omitempty"`
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// MetricsAuthMode is metricsAuth with its default.
func (c *Config) MetricsAuthMode() string {
	if c.MetricsAuth == "" {
		return MetricsAuthNone
	}
	return c.MetricsAuth
}

// MetricsListen is the address the metrics server binds: metricsAddress,
// its host taken from metricsHostEnv when that is set.
func (c *Config) MetricsListen() (string, error) {
	if c.MetricsHostEnv == "" {
		return c.MetricsAddress, nil
	}
	_, port, err := net.SplitHostPort(c.MetricsAddress)
	if err != nil {
		return "", fmt.Errorf("metricsAddress: %q is not host:port or :port", c.MetricsAddress)
	}
	v := os.Getenv(c.MetricsHostEnv)
	if v == "" {
		return "", fmt.Errorf("metricsHostEnv: %s is not set (give the container the pod's IP: env %s from fieldRef status.podIP)", c.MetricsHostEnv, c.MetricsHostEnv)
	}
	ip, err := netip.ParseAddr(v)
	if err != nil || ip.Zone() != "" {
		return "", fmt.Errorf("metricsHostEnv: %s=%q is not an IP address", c.MetricsHostEnv, v)
	}
	return net.JoinHostPort(ip.String(), port), nil
}

// validateMetrics checks the metrics server's fields.
func (c *Config) validateMetrics() []error {
	var errs []error
	if c.MetricsAddress != "" {
		if host, port, err := net.SplitHostPort(c.MetricsAddress); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("metricsAddress: %q is not host:port or :port", c.MetricsAddress))
		} else if c.MetricsHostEnv != "" && host != "" {
			errs = append(errs, fmt.Errorf("metricsAddress: %q names a host, and metricsHostEnv %s names it too; write :%s", c.MetricsAddress, c.MetricsHostEnv, port))
		}
	}
	if c.MetricsHostEnv != "" {
		switch {
		case !envName.MatchString(c.MetricsHostEnv):
			errs = append(errs, fmt.Errorf("metricsHostEnv: %q is not an environment variable name", c.MetricsHostEnv))
		case c.MetricsAddress == "":
			errs = append(errs, fmt.Errorf("metricsHostEnv: %s needs metricsAddress (:port)", c.MetricsHostEnv))
		default:
			if _, err := c.MetricsListen(); err != nil && len(errs) == 0 {
				errs = append(errs, err)
			}
		}
	}
	mode := c.MetricsAuthMode()
	switch mode {
	case MetricsAuthNone, MetricsAuthKubernetes, MetricsAuthTLS:
	default:
		errs = append(errs, fmt.Errorf("metricsAuth: %q is not none, kubernetes or tls", c.MetricsAuth))
	}
	if mode != MetricsAuthNone && c.MetricsAddress == "" {
		errs = append(errs, fmt.Errorf("metricsAuth: %s needs metricsAddress", mode))
	}
	t := c.MetricsTLS
	if t == nil {
		if mode == MetricsAuthTLS {
			errs = append(errs, fmt.Errorf("metricsTLS.certFile: required with metricsAuth tls"))
		}
		return errs
	}
	if mode == MetricsAuthNone {
		errs = append(errs, fmt.Errorf("metricsTLS: needs metricsAuth tls or kubernetes (metricsAuth is %q)", c.MetricsAuth))
	}
	for _, f := range []struct{ name, path string }{{"certFile", t.CertFile}, {"keyFile", t.KeyFile}, {"clientCAFile", t.ClientCAFile}} {
		if f.path != "" && (!filepath.IsAbs(f.path) || filepath.Clean(f.path) != f.path) {
			errs = append(errs, fmt.Errorf("metricsTLS.%s: %q must be an absolute, clean path", f.name, f.path))
		}
	}
	switch {
	case mode == MetricsAuthTLS && t.CertFile == "":
		errs = append(errs, fmt.Errorf("metricsTLS.certFile: required with metricsAuth tls"))
	case (t.CertFile == "") != (t.KeyFile == ""):
		errs = append(errs, fmt.Errorf("metricsTLS.keyFile: %q and certFile %q go together", t.KeyFile, t.CertFile))
	}
	if t.ClientCAFile != "" && mode != MetricsAuthTLS {
		errs = append(errs, fmt.Errorf("metricsTLS.clientCAFile: only with metricsAuth tls (metricsAuth is %q)", c.MetricsAuth))
	}
	return errs
}
