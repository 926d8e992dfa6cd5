package metricsauth

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const prometheus = "system:serviceaccount:monitoring:prometheus"

// fakeAPI answers TokenReviews for the tokens it knows and allows GET
// /metrics to prometheus only; it counts the reviews.
type fakeAPI struct {
	tokens   map[string]authnv1.UserInfo
	fail     atomic.Bool
	tr, sar  atomic.Int32
	lastSpec authzv1.SubjectAccessReviewSpec
}

func (f *fakeAPI) client() *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.tr.Add(1)
		if f.fail.Load() {
			return true, nil, errors.New("connection refused")
		}
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if u, ok := f.tokens[tr.Spec.Token]; ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: u}
		}
		return true, tr, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.sar.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		f.lastSpec = sar.Spec
		na := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == prometheus && sar.Spec.ResourceAttributes == nil &&
			na != nil && na.Path == "/metrics" && na.Verb == "get"
		return true, sar, nil
	})
	return cs
}

func TestReviewer(t *testing.T) {
	api := &fakeAPI{tokens: map[string]authnv1.UserInfo{
		"prom-token":  {Username: prometheus, UID: "u1", Groups: []string{"system:serviceaccounts"}, Extra: map[string]authnv1.ExtraValue{"k": {"v"}}},
		"other-token": {Username: "system:serviceaccount:default:other"},
	}}
	r := NewReviewer(api.client(), "/metrics", slog.New(slog.NewTextHandler(io.Discard, nil)))
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	h := r.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "vhostmq_slots 8\n") }))
	get := func(auth string) (int, string) {
		req := httptest.NewRequest("GET", "/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	reviews := func() (int32, int32) { return api.tr.Load(), api.sar.Load() }

	if code, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	if code, _ := get("Basic cHJvbTpwcm9t"); code != http.StatusUnauthorized {
		t.Errorf("basic auth: %d, want 401", code)
	}
	if tr, sar := reviews(); tr != 0 || sar != 0 {
		t.Errorf("requests without a token made %d TokenReviews, %d SubjectAccessReviews", tr, sar)
	}

	code, body := get("Bearer prom-token")
	if code != http.StatusOK || !strings.Contains(body, "vhostmq_slots") {
		t.Fatalf("prometheus: %d %q, want 200 and the metrics", code, body)
	}
	s := api.lastSpec
	if s.User != prometheus || s.UID != "u1" || len(s.Groups) != 1 || s.Extra["k"][0] != "v" ||
		s.NonResourceAttributes == nil || s.NonResourceAttributes.Path != "/metrics" || s.NonResourceAttributes.Verb != "get" {
		t.Errorf("SubjectAccessReview spec %+v: want prometheus' user, uid, groups and extra, GET /metrics", s)
	}
	// cached: no more reviews until AllowTTL passed
	now = now.Add(AllowTTL - time.Second)
	if code, _ := get("bearer prom-token"); code != http.StatusOK {
		t.Errorf("prometheus again: %d", code)
	}
	if tr, sar := reviews(); tr != 1 || sar != 1 {
		t.Errorf("a cached token was reviewed again: %d TokenReviews, %d SubjectAccessReviews", tr, sar)
	}
	now = now.Add(2 * time.Second)
	get("Bearer prom-token")
	if tr, sar := reviews(); tr != 2 || sar != 2 {
		t.Errorf("after AllowTTL: %d TokenReviews, %d SubjectAccessReviews; want 2, 2", tr, sar)
	}

	// authenticated but not allowed: 403 naming the user, cached DenyTTL
	if code, body := get("Bearer other-token"); code != http.StatusForbidden || !strings.Contains(body, "system:serviceaccount:default:other") {
		t.Errorf("other: %d %q, want 403 naming the user", code, body)
	}
	get("Bearer other-token")
	if tr, _ := reviews(); tr != 3 {
		t.Errorf("a denied token was reviewed again within DenyTTL (%d TokenReviews)", tr)
	}
	// unknown token: 401, and no SubjectAccessReview
	if code, _ := get("Bearer forged"); code != http.StatusUnauthorized {
		t.Errorf("forged: %d, want 401", code)
	}
	if _, sar := reviews(); sar != 3 {
		t.Errorf("an unauthenticated token got a SubjectAccessReview (%d)", sar)
	}
	now = now.Add(DenyTTL + time.Second)
	get("Bearer forged")
	if tr, _ := reviews(); tr != 5 {
		t.Errorf("after DenyTTL the forged token was not reviewed again (%d TokenReviews, want 5)", tr)
	}

	// the API server away: 503, and not cached
	api.fail.Store(true)
	if code, _ := get("Bearer new-token"); code != http.StatusServiceUnavailable {
		t.Errorf("API server away: %d, want 503", code)
	}
	api.fail.Store(false)
	api.tokens["new-token"] = api.tokens["prom-token"]
	if code, _ := get("Bearer new-token"); code != http.StatusOK {
		t.Errorf("API server back: %d, want 200 (a failed review must not be cached)", code)
	}
}

func TestReviewerCacheBounded(t *testing.T) {
	api := &fakeAPI{tokens: map[string]authnv1.UserInfo{}}
	r := NewReviewer(api.client(), "/metrics", slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := r.Wrap(http.NotFoundHandler())
	for i := range maxEntries + 10 {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.Header.Set("Authorization", "Bearer t"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+time.Duration(i).String())
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	if n := len(r.cache); n > maxEntries {
		t.Errorf("cache holds %d verdicts, bound %d", n, maxEntries)
	}
}
