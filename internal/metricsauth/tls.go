package metricsauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"sync"
	"time"
)

// FileTLS serves the certificate in certFile and keyFile; with clientCA,
// client certificates are verified against it (and asked for, not
// required: RequireClientCert guards the paths that need one). The files
// are stat'ed at each handshake and re-read when they changed (a mounted
// Secret is updated in place); a broken update keeps the last good one.
func FileTLS(certFile, keyFile, clientCA string, log *slog.Logger) (*tls.Config, error) {
	f := &files{cert: certFile, key: keyFile, ca: clientCA, log: log}
	if _, err := f.load(); err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return f.load()
	}}, nil
}

type files struct {
	cert, key, ca string
	log           *slog.Logger

	mu    sync.Mutex
	stamp string
	cfg   *tls.Config
}

// load returns the config of the files as they are now.
func (f *files) load() (*tls.Config, error) {
	stamp, err := f.stampNow()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil && stamp == f.stamp {
		return f.cfg, nil
	}
	cfg, lerr := f.read()
	if err == nil {
		err = lerr
	}
	if err != nil {
		if f.cfg != nil {
			if f.stamp != "broken:"+stamp {
				f.log.Error("metrics: the TLS files changed and cannot be used; serving the previous ones", "err", err)
				f.stamp = "broken:" + stamp
			}
			return f.cfg, nil
		}
		return nil, err
	}
	f.stamp, f.cfg = stamp, cfg
	return cfg, nil
}

func (f *files) stampNow() (string, error) {
	s := ""
	for _, p := range []string{f.cert, f.key, f.ca} {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%s:%d:%d;", p, fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}

func (f *files) read() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("metricsTLS.certFile %s, keyFile %s: %w", f.cert, f.key, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if f.ca != "" {
		b, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, fmt.Errorf("metricsTLS.clientCAFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("metricsTLS.clientCAFile: %s holds no PEM certificate", f.ca)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// SelfSigned makes a certificate at start for hosts (IPs or names): the
// connection is encrypted, so a bearer token is not sent in the clear,
// but scrapers cannot verify it (insecureSkipVerify).
func SelfSigned(hosts ...string) (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "vhostmq-metrics"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, nil
}
