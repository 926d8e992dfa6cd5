package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestMinterRenewsAtHalfLife: the plugin's token is its own service
// account's, asked for the configured lifetime with no bound object, and
// renewed once half of the lifetime the API server granted has passed.
func TestMinterRenewsAtHalfLife(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	var minted []string
	cs := fake.NewClientset()
	cs.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca := a.(k8stesting.CreateActionImpl)
		tr := ca.GetObject().(*authnv1.TokenRequest).DeepCopy()
		if ca.GetSubresource() != "token" || ca.GetNamespace() != "vhostmq-system" || ca.Name != "vhostmq-cni" {
			t.Errorf("TokenRequest %s/%s/%s; want vhostmq-system/vhostmq-cni/token", ca.GetNamespace(), ca.Name, ca.GetSubresource())
		}
		if e := tr.Spec.ExpirationSeconds; e == nil || *e != 600 || tr.Spec.BoundObjectRef != nil || len(tr.Spec.Audiences) != 0 {
			t.Errorf("TokenRequest spec %+v: want 600 s, the API server's audience, no bound object", tr.Spec)
		}
		tok := "tok-" + now.Format("150405")
		minted = append(minted, tok)
		// the API server shortens it to 8 minutes (--service-account-max-token-expiration)
		tr.Status = authnv1.TokenRequestStatus{Token: tok, ExpirationTimestamp: metav1.NewTime(now.Add(8 * time.Minute))}
		return true, tr, nil
	})
	m := &minter{cs: cs, ns: "vhostmq-system", sa: "vhostmq-cni", ttl: 10 * time.Minute, now: func() time.Time { return now }}
	ctx := context.Background()
	first, err := m.token(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(3*time.Minute + 59*time.Second)
	if tok, _ := m.token(ctx); string(tok) != string(first) || len(minted) != 1 {
		t.Errorf("before half of its 8 minutes: %q, %d minted; want the first token again", tok, len(minted))
	}
	now = now.Add(2 * time.Second)
	if tok, _ := m.token(ctx); string(tok) == string(first) || len(minted) != 2 {
		t.Errorf("after half of its 8 minutes: %q, %d minted; want a new token", tok, len(minted))
	}
}

func TestMinterErrorNamesTheFlag(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, os.ErrPermission
	})
	m := &minter{cs: cs, ns: "ns", sa: "vhostmq-cni", ttl: 10 * time.Minute, now: time.Now}
	if _, err := m.token(context.Background()); err == nil || !strings.Contains(err.Error(), "--service-account vhostmq-cni") {
		t.Errorf("a refused TokenRequest: %v; want an error naming --service-account", err)
	}
	if _, err := newMinter("ns", "vhostmq-cni", 5*time.Minute); err == nil || !strings.Contains(err.Error(), "--token-ttl") {
		t.Errorf("a 5 minute TTL: %v; want an error naming --token-ttl", err)
	}
}

// TestWriteKubeconfig: the host files are root's alone and the kubeconfig
// names the token file as the host sees it.
func TestWriteKubeconfig(t *testing.T) {
	sa := t.TempDir()
	old := saDir
	saDir = sa
	t.Cleanup(func() { saDir = old })
	os.WriteFile(filepath.Join(sa, "ca.crt"), []byte("CA"), 0o644)
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	dir := filepath.Join(t.TempDir(), "vhostmq.d")
	if err := writeKubeconfig(dir, "/etc/cni/net.d/vhostmq.d", []byte("tok-1")); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"token": "tok-1", "ca.crt": "CA"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		fi, _ := os.Stat(filepath.Join(dir, name))
		if err != nil || string(b) != want || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %q %v %v; want %q, mode 0600", name, b, fi.Mode(), err, want)
		}
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %v, want 0700", fi.Mode())
	}
	kc, _ := os.ReadFile(filepath.Join(dir, "vhostmq.kubeconfig"))
	if !strings.Contains(string(kc), "tokenFile: /etc/cni/net.d/vhostmq.d/token") || !strings.Contains(string(kc), "server: https://10.96.0.1:443") {
		t.Errorf("kubeconfig:\n%s", kc)
	}
	// a renewed token replaces the file
	if err := writeKubeconfig(dir, "/etc/cni/net.d/vhostmq.d", []byte("tok-2")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "token")); string(b) != "tok-2" {
		t.Errorf("token after renewal: %q", b)
	}
}
