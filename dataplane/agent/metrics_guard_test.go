package agent

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/internal/metricsauth"
)

// TestMetricsGuardAndTLS: with MetricsTLS the address serves HTTPS only,
// and MetricsGuard decides /metrics alone: probes reach /healthz and
// /readyz without a credential.
func TestMetricsGuardAndTLS(t *testing.T) {
	e := start(t, shortDir(t), []int{0}, 2)
	tc, err := metricsauth.SelfSigned("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	e.ag.cfg.MetricsTLS = tc
	e.ag.cfg.MetricsGuard = func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer let-me-in" {
				http.Error(w, "no", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := serveMetrics(ctx, t, e)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(url, auth string) (int, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	var code int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if code, err = get("https://"+addr+"/healthz", ""); err == nil {
			break
		}
	}
	if err != nil || code != http.StatusOK {
		t.Fatalf("/healthz over HTTPS without a credential: %d %v", code, err)
	}
	if code, err := get("https://"+addr+"/readyz", ""); err != nil || code != http.StatusOK {
		t.Errorf("/readyz without a credential: %d %v", code, err)
	}
	if code, err := get("https://"+addr+"/metrics", ""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("/metrics without a credential: %d %v; want 401", code, err)
	}
	if code, err := get("https://"+addr+"/metrics", "Bearer let-me-in"); err != nil || code != http.StatusOK {
		t.Errorf("/metrics with the credential: %d %v; want 200", code, err)
	}
	if code, err := get("http://"+addr+"/metrics", "Bearer let-me-in"); err == nil && code == http.StatusOK {
		t.Error("/metrics over plain HTTP with MetricsTLS set")
	}
}
