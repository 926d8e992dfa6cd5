package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The CNI plugin's token lives in a host file (--kubeconfig-dir): it is a
// short-lived token of its own service account (--service-account), which
// may only get pods, NADs and VMIs by name, minted with the TokenRequest
// API and renewed by this pod. It cannot be bound to this pod (the API
// server binds a token only to a pod of the same service account), so it
// dies by its expiry: at most --token-ttl after the pod stops renewing it.

// minTokenTTL is the shortest lifetime the API server issues.
const minTokenTTL = 10 * time.Minute

// minter keeps a token of one service account fresh.
type minter struct {
	cs      kubernetes.Interface
	ns, sa  string
	ttl     time.Duration
	now     func() time.Time
	tok     []byte
	renewAt time.Time
}

func newMinter(ns, sa string, ttl time.Duration) (*minter, error) {
	if ttl < minTokenTTL {
		return nil, fmt.Errorf("--token-ttl: %s is shorter than the API server issues (%s)", ttl, minTokenTTL)
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("--service-account %s: needs the pod's own service account: %w", sa, err)
	}
	rc.UserAgent = "vhostmq-install-cni"
	rc.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &minter{cs: cs, ns: ns, sa: sa, ttl: ttl, now: time.Now}, nil
}

// token returns the current token, minting a new one once half the
// current one's life has passed (the API server may shorten it).
func (m *minter) token(ctx context.Context) ([]byte, error) {
	now := m.now()
	if m.tok != nil && now.Before(m.renewAt) {
		return m.tok, nil
	}
	secs := int64(m.ttl / time.Second)
	tr, err := m.cs.CoreV1().ServiceAccounts(m.ns).CreateToken(ctx, m.sa,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("--service-account %s: TokenRequest in namespace %s (this pod's service account needs create on serviceaccounts/token for it): %w", m.sa, m.ns, err)
	}
	if tr.Status.Token == "" {
		return nil, fmt.Errorf("--service-account %s: the TokenRequest returned no token", m.sa)
	}
	life := tr.Status.ExpirationTimestamp.Sub(now)
	if life <= 0 || life > m.ttl {
		life = m.ttl
	}
	m.tok, m.renewAt = []byte(tr.Status.Token), now.Add(life/2)
	return m.tok, nil
}

// ownNamespace is this pod's namespace (its service account's).
func ownNamespace() (string, error) {
	b, err := os.ReadFile(filepath.Join(saDir, "namespace"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// ownToken is this pod's service account token, for --service-account
// unset (the plugin then has this pod's rights).
func ownToken(context.Context) ([]byte, error) {
	return os.ReadFile(filepath.Join(saDir, "token"))
}
