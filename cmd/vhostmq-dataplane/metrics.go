package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/vhostmq/vhostmq/dataplane/config"
	"github.com/vhostmq/vhostmq/internal/metricsauth"
)

// metricsSetup resolves the metrics server's address (the pod IP from
// metricsHostEnv), its TLS and who may read /metrics (metricsAuth).
func metricsSetup(cfg *config.Config, log *slog.Logger) (string, *tls.Config, func(http.Handler) http.Handler, error) {
	addr, err := cfg.MetricsListen()
	if err != nil || addr == "" {
		return addr, nil, nil, err
	}
	t := cfg.MetricsTLS
	if t == nil {
		t = &config.MetricsTLS{}
	}
	switch cfg.MetricsAuthMode() {
	case config.MetricsAuthKubernetes:
		rc, err := rest.InClusterConfig()
		if err != nil {
			return "", nil, nil, fmt.Errorf("metricsAuth: kubernetes needs the pod's service account: %w", err)
		}
		rc.UserAgent = "vhostmq-dataplane"
		cs, err := metricsauth.NewClient(rc)
		if err != nil {
			return "", nil, nil, fmt.Errorf("metricsAuth: kubernetes: %w", err)
		}
		tc, err := serverTLS(t, addr, log)
		if err != nil {
			return "", nil, nil, err
		}
		return addr, tc, metricsauth.NewReviewer(cs, "/metrics", log).Wrap, nil
	case config.MetricsAuthTLS:
		tc, err := metricsauth.FileTLS(t.CertFile, t.KeyFile, t.ClientCAFile, log)
		if err != nil {
			return "", nil, nil, err
		}
		if t.ClientCAFile == "" {
			return addr, tc, nil, nil
		}
		return addr, tc, metricsauth.RequireClientCert, nil
	}
	return addr, nil, nil, nil
}

// serverTLS is the certificate files' config, or a self-signed one for
// the address' host: bearer tokens never cross the network in the clear.
func serverTLS(t *config.MetricsTLS, addr string, log *slog.Logger) (*tls.Config, error) {
	if t.CertFile != "" {
		return metricsauth.FileTLS(t.CertFile, t.KeyFile, "", log)
	}
	host, _, _ := net.SplitHostPort(addr)
	name, _ := os.Hostname()
	return metricsauth.SelfSigned(host, name)
}

// probeLive asks the config's metrics address for /healthz, as the
// kubelet's httpGet would but from inside the pod: a localhost address
// and a self-signed HTTPS certificate are reachable, and no credential is
// sent (the health paths need none).
func probeLive(path string) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	addr, err := cfg.MetricsListen()
	if err != nil {
		return err
	}
	if addr == "" {
		return fmt.Errorf("metricsAddress: not set; there is no /healthz to probe")
	}
	host, port, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	scheme := "http"
	tr := &http.Transport{DisableKeepAlives: true}
	if cfg.MetricsAuthMode() != config.MetricsAuthNone {
		// our own process: its certificate is not what is being checked
		scheme, tr.TLSClientConfig = "https", &tls.Config{InsecureSkipVerify: true}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	url := scheme + "://" + net.JoinHostPort(host, port) + "/healthz"
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}
