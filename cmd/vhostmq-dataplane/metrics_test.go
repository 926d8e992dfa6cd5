package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProbeLive: the liveness probe reaches /healthz on the config's
// metrics address over plain HTTP and over HTTPS with a client CA (it
// carries no client certificate: /healthz needs none, /metrics does).
func TestProbeLive(t *testing.T) {
	dir := t.TempDir()
	crt, key := selfSignedFiles(t, dir)
	for _, c := range []struct{ name, extra string }{
		{"plain", ""},
		{"tls with a client CA", fmt.Sprintf("metricsAuth: tls\nmetricsTLS: {certFile: %s, keyFile: %s, clientCAFile: %s}\n", crt, key, crt)},
	} {
		t.Run(c.name, func(t *testing.T) {
			sub := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			os.MkdirAll(sub, 0o700)
			addr := freePort(t)
			cfg := filepath.Join(sub, "dataplane.yaml")
			yaml := fmt.Sprintf("cpus: [0]\napiSocket: %s\nstateDir: %s\nmetricsAddress: %q\n%s",
				filepath.Join(sub, "api.sock"), filepath.Join(sub, "state"), addr, c.extra)
			if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			probe := func() error {
				cmd := exec.Command(os.Args[0], "--config", cfg, "--probe", "live")
				cmd.Env = append(os.Environ(), "VHOSTMQ_TEST_AS_DATAPLANE=1")
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
				}
				return nil
			}
			if err := probe(); err == nil {
				t.Fatal("live with no dataplane running")
			}
			cmd := exec.Command(os.Args[0], "--config", cfg)
			cmd.Env = append(os.Environ(), "VHOSTMQ_TEST_AS_DATAPLANE=1")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			var err error
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if err = probe(); err == nil {
					break
				}
			}
			if err != nil {
				t.Fatalf("the probe against the running dataplane: %v", err)
			}
			if c.extra == "" {
				return
			}
			hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			if resp, err := hc.Get("http://" + addr + "/metrics"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Error("metrics over plain HTTP with metricsAuth tls")
				}
			}
			resp, err := hc.Get("https://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("/metrics without a client certificate: %s, want 401", resp.Status)
			}
		})
	}
}

// TestMetricsAuthKubernetesOutsideAPod: the dataplane refuses to start,
// naming metricsAuth, rather than serve unguarded metrics.
func TestMetricsAuthKubernetesOutsideAPod(t *testing.T) {
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		t.Skip("running in a pod")
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "dataplane.yaml")
	yaml := fmt.Sprintf("cpus: [0]\napiSocket: %s\nstateDir: %s\nmetricsAddress: %q\nmetricsAuth: kubernetes\n",
		filepath.Join(dir, "api.sock"), filepath.Join(dir, "state"), freePort(t))
	os.WriteFile(cfg, []byte(yaml), 0o600)
	cmd := exec.Command(os.Args[0], "--config", cfg)
	cmd.Env = append(os.Environ(), "VHOSTMQ_TEST_AS_DATAPLANE=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "metricsAuth: kubernetes") {
		t.Errorf("started outside a pod: %v: %s; want an error naming metricsAuth", err, out)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// selfSignedFiles writes a CA-capable certificate for 127.0.0.1 and its
// key (server certificate and client CA of the test at once).
func selfSignedFiles(t *testing.T, dir string) (crt, key string) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	crt, key = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return crt, key
}
