package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxBody bounds an AdmissionReview (the API server sends at most ~3 MiB
// objects).
const maxBody = 8 << 20

// Handler serves /mutate.
type Handler struct {
	Rule *Rule
	Log  *slog.Logger
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		http.Error(w, "request body unreadable or too large", http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	resp := h.admit(req.Context(), review.Request)
	resp.UID = review.Request.UID
	review.Response, review.Request = resp, nil
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(&review)
}

func (h *Handler) admit(ctx context.Context, r *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	deny := func(err error) *admissionv1.AdmissionResponse {
		h.Log.Warn("pod denied", "namespace", r.Namespace, "name", r.Name, "err", err)
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
			Status: metav1.StatusFailure, Reason: metav1.StatusReasonInvalid, Code: http.StatusUnprocessableEntity,
			Message: "vhostmq: " + err.Error()}}
	}
	if r.Kind.Kind != "Pod" || r.Operation != admissionv1.Create {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(r.Object.Raw, &pod); err != nil {
		return deny(fmt.Errorf("pod: %v", err))
	}
	if pod.Namespace == "" {
		pod.Namespace = r.Namespace
	}
	d, err := h.Rule.Decide(ctx, &pod)
	if err != nil {
		return deny(err)
	}
	if d == nil || len(d.Patch) == 0 {
		return &admissionv1.AdmissionResponse{Allowed: true}
	}
	patch, _ := json.Marshal(d.Patch)
	pt := admissionv1.PatchTypeJSONPatch
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "*"
	}
	h.Log.Info("pod mutated", "namespace", pod.Namespace, "name", name, "networks", d.Networks, "queues", d.Queues,
		"from", d.Reason, "container", d.Container, "request", d.Total)
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &pt}
}

// CertReloader serves the certificate in certFile/keyFile and picks up a
// rotated pair (the chart or cert-manager rewrites the secret's files)
// without a restart.
type CertReloader struct {
	CertFile, KeyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime time.Time
	checked time.Time
}

// GetCertificate is for tls.Config.
func (c *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && time.Since(c.checked) < time.Second {
		return c.cert, nil
	}
	c.checked = time.Now()
	fi, err := os.Stat(c.CertFile)
	if err != nil {
		if c.cert != nil {
			return c.cert, nil
		}
		return nil, err
	}
	if c.cert != nil && fi.ModTime().Equal(c.modTime) {
		return c.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		if c.cert != nil {
			return c.cert, nil // half-written rotation: keep serving the old pair
		}
		return nil, err
	}
	c.cert, c.modTime = &cert, fi.ModTime()
	return c.cert, nil
}
