package metricsauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	stdlog "log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA issues certificates for the tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns PEM certificate and key for cn (a server for 127.0.0.1,
// or a client).
func (ca *testCA) issue(t *testing.T, cn string, serial int64, client bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// serve runs the metrics mux the way the agent does: /metrics guarded,
// /healthz open, over cfg.
func serve(t *testing.T, cfg *tls.Config, guard func(http.Handler) http.Handler) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/metrics", guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "vhostmq_slots 8\n") })))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, TLSConfig: cfg, ErrorLog: stdlog.New(io.Discard, "", 0)}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// get fetches path on a new connection; it returns the status and the
// server certificate's common name.
func get(addr, path string, roots *x509.CertPool, client *tls.Certificate) (int, string, error) {
	cfg := &tls.Config{RootCAs: roots}
	if roots == nil {
		cfg.InsecureSkipVerify = true
	}
	if client != nil { // sent whatever CAs the server names
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return client, nil }
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := c.Get("https://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.TLS.PeerCertificates[0].Subject.CommonName, nil
}

func TestFileTLSClientCA(t *testing.T) {
	dir := t.TempDir()
	serverCA, clientCA, otherCA := newCA(t, "server-ca"), newCA(t, "client-ca"), newCA(t, "other-ca")
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	crt, key := serverCA.issue(t, "metrics-1", 10, false)
	crtFile, keyFile, caFile := write("tls.crt", crt), write("tls.key", key), write("ca.crt", clientCA.pem)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg, err := FileTLS(crtFile, keyFile, caFile, log)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, cfg, RequireClientCert)
	roots := x509.NewCertPool()
	roots.AddCert(serverCA.cert)
	pair := func(ca *testCA, cn string) *tls.Certificate {
		c, k := ca.issue(t, cn, 20, true)
		p, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return &p
	}

	if code, cn, err := get(addr, "/healthz", roots, nil); err != nil || code != 200 || cn != "metrics-1" {
		t.Errorf("/healthz without a client certificate: %d %q %v; want 200 from metrics-1 (probes carry none)", code, cn, err)
	}
	if code, _, err := get(addr, "/metrics", roots, nil); err != nil || code != http.StatusUnauthorized {
		t.Errorf("/metrics without a client certificate: %d %v; want 401", code, err)
	}
	if code, _, err := get(addr, "/metrics", roots, pair(clientCA, "prometheus")); err != nil || code != 200 {
		t.Errorf("/metrics with a client CA's certificate: %d %v; want 200", code, err)
	}
	if code, _, err := get(addr, "/metrics", roots, pair(otherCA, "intruder")); err == nil {
		t.Errorf("/metrics with another CA's client certificate: %d; want a failed handshake", code)
	}

	// the Secret is updated: the next handshake serves the new certificate
	crt2, key2 := serverCA.issue(t, "metrics-2", 11, false)
	write("tls.crt", crt2)
	write("tls.key", key2)
	later := time.Now().Add(time.Minute)
	os.Chtimes(crtFile, later, later)
	os.Chtimes(keyFile, later, later)
	if _, cn, err := get(addr, "/healthz", roots, nil); err != nil || cn != "metrics-2" {
		t.Errorf("after the update: served %q, %v; want metrics-2", cn, err)
	}
	// a broken update keeps the last good pair
	write("tls.crt", []byte("not a certificate"))
	later = later.Add(time.Minute)
	os.Chtimes(crtFile, later, later)
	if _, cn, err := get(addr, "/healthz", roots, nil); err != nil || cn != "metrics-2" {
		t.Errorf("after a broken update: served %q, %v; want metrics-2 kept", cn, err)
	}
}

func TestFileTLSErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, err := FileTLS(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), "", log); err == nil {
		t.Error("missing files accepted")
	}
	ca := newCA(t, "ca")
	crt, key := ca.issue(t, "m", 2, false)
	os.WriteFile(filepath.Join(dir, "tls.crt"), crt, 0o600)
	os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600)
	os.WriteFile(filepath.Join(dir, "ca.crt"), []byte("junk"), 0o600)
	_, err := FileTLS(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt"), log)
	if err == nil || !strings.Contains(err.Error(), "metricsTLS.clientCAFile") {
		t.Errorf("a client CA file without PEM: %v; want an error naming metricsTLS.clientCAFile", err)
	}
}

func TestSelfSigned(t *testing.T) {
	cfg, err := SelfSigned("127.0.0.1", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(cfg.Certificates[0].Certificate[0])
	if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "node-1" {
		t.Errorf("SANs %v %v", leaf.IPAddresses, leaf.DNSNames)
	}
	addr := serve(t, cfg, func(h http.Handler) http.Handler { return h })
	if code, cn, err := get(addr, "/metrics", nil, nil); err != nil || code != 200 || cn != "vhostmq-metrics" {
		t.Errorf("over the self-signed certificate: %d %q %v", code, cn, err)
	}
	// a verifying client refuses it: it is not a trust anchor anywhere
	if _, _, err := get(addr, "/metrics", x509.NewCertPool(), nil); err == nil {
		t.Error("a verifying client accepted the self-signed certificate")
	}
}
