// Package metricsauth guards the dataplane's /metrics the way
// kube-rbac-proxy does, in process (no proxy image): a bearer token is
// authenticated by a TokenReview and authorized by a SubjectAccessReview
// for GET on the non-resource URL, results cached briefly; or a TLS
// client certificate is required. The certificates come from files (a
// mounted Secret, re-read when it changes) or are made at start.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
)

// Cache lifetimes of a review's verdict: a revoked token or binding stops
// working within AllowTTL; a denied one is asked again after DenyTTL.
const (
	AllowTTL   = time.Minute
	DenyTTL    = 10 * time.Second
	maxEntries = 1024
	timeout    = 5 * time.Second
)

// Client makes the reviews: a kubernetes.Interface (or its fake), or
// NewClient's two typed clients, which keep the rest of client-go out of
// the dataplane's binary.
type Client interface {
	AuthenticationV1() authnclient.AuthenticationV1Interface
	AuthorizationV1() authzclient.AuthorizationV1Interface
}

type reviewClient struct {
	authn *authnclient.AuthenticationV1Client
	authz *authzclient.AuthorizationV1Client
}

func (c reviewClient) AuthenticationV1() authnclient.AuthenticationV1Interface { return c.authn }
func (c reviewClient) AuthorizationV1() authzclient.AuthorizationV1Interface   { return c.authz }

// NewClient makes the review clients for rc (the pod's service account).
func NewClient(rc *rest.Config) (Client, error) {
	authn, err := authnclient.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	authz, err := authzclient.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return reviewClient{authn, authz}, nil
}

// Reviewer checks bearer tokens against the API server.
type Reviewer struct {
	client Client
	path   string
	log    *slog.Logger
	now    func() time.Time

	mu    sync.Mutex
	cache map[[sha256.Size]byte]verdict
}

// verdict is a review's outcome: the HTTP status to answer with.
type verdict struct {
	code  int // 200, 401 or 403
	user  string
	until time.Time
}

// NewReviewer checks tokens for GET on path (the non-resource URL the
// SubjectAccessReview names, e.g. /metrics).
func NewReviewer(client Client, path string, log *slog.Logger) *Reviewer {
	return &Reviewer{client: client, path: path, log: log, now: time.Now, cache: map[[sha256.Size]byte]verdict{}}
}

// Wrap serves next only to requests whose token may GET the path.
func (r *Reviewer) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		tok, ok := bearer(req)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="vhostmq"`)
			http.Error(w, "Unauthorized: send a service account token (Authorization: Bearer)", http.StatusUnauthorized)
			return
		}
		v, err := r.review(req.Context(), tok)
		if err != nil {
			// not cached: the next scrape asks again
			r.log.Warn("metrics: cannot review a token", "remote", req.RemoteAddr, "err", err)
			http.Error(w, "cannot review the token now", http.StatusServiceUnavailable)
			return
		}
		switch v.code {
		case http.StatusOK:
			next.ServeHTTP(w, req)
		case http.StatusUnauthorized:
			w.Header().Set("WWW-Authenticate", `Bearer realm="vhostmq"`)
			http.Error(w, "Unauthorized: the token is not valid", http.StatusUnauthorized)
		default:
			http.Error(w, fmt.Sprintf("Forbidden: %s may not get %s", v.user, r.path), http.StatusForbidden)
		}
	})
}

func bearer(req *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(req.Header.Get("Authorization"), " ")
	tok = strings.TrimSpace(tok)
	return tok, ok && strings.EqualFold(scheme, "Bearer") && tok != ""
}

// review returns the cached verdict on tok or asks the API server.
func (r *Reviewer) review(ctx context.Context, tok string) (verdict, error) {
	key := sha256.Sum256([]byte(tok))
	now := r.now()
	r.mu.Lock()
	v, ok := r.cache[key]
	r.mu.Unlock()
	if ok && now.Before(v.until) {
		return v, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, err := r.ask(ctx, tok)
	if err != nil {
		return v, err
	}
	v.until = now.Add(DenyTTL)
	if v.code == http.StatusOK {
		v.until = now.Add(AllowTTL)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.cache) >= maxEntries {
		for k, e := range r.cache {
			if !now.Before(e.until) {
				delete(r.cache, k)
			}
		}
		if len(r.cache) >= maxEntries {
			clear(r.cache) // many live tokens: start over rather than grow
		}
	}
	r.cache[key] = v
	return v, nil
}

// ask makes the TokenReview and the SubjectAccessReview.
func (r *Reviewer) ask(ctx context.Context, tok string) (verdict, error) {
	tr, err := r.client.AuthenticationV1().TokenReviews().Create(ctx,
		&authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: tok}}, metav1.CreateOptions{})
	if err != nil {
		return verdict{}, fmt.Errorf("TokenReview: %w", err)
	}
	if !tr.Status.Authenticated {
		return verdict{code: http.StatusUnauthorized}, nil
	}
	u := tr.Status.User
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := r.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{
			User: u.Username, Groups: u.Groups, UID: u.UID, Extra: extra,
			NonResourceAttributes: &authzv1.NonResourceAttributes{Path: r.path, Verb: "get"},
		}}, metav1.CreateOptions{})
	if err != nil {
		return verdict{}, fmt.Errorf("SubjectAccessReview of %s: %w", u.Username, err)
	}
	if !sar.Status.Allowed {
		r.log.Info("metrics: scrape denied", "user", u.Username, "reason", sar.Status.Reason)
		return verdict{code: http.StatusForbidden, user: u.Username}, nil
	}
	return verdict{code: http.StatusOK, user: u.Username}, nil
}

// RequireClientCert serves next only to requests that presented a client
// certificate the server verified (tls.Config.ClientCAs): the handshake
// lets clients without one in, so that probes reach /healthz.
func RequireClientCert(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.TLS == nil || len(req.TLS.VerifiedChains) == 0 {
			http.Error(w, "Unauthorized: a client certificate signed by the metrics client CA is needed", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, req)
	})
}
