package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const res = "vhostmq.io/queue-pairs"

// lookup is an in-memory API server for the rule: NADs and VMIs.
type lookup struct {
	nads map[string]string // ns/name -> resourceName
	vmis map[string]string // ns/name -> JSON
}

func (l *lookup) NADResourceName(_ context.Context, ns, name string) (string, bool, error) {
	r, ok := l.nads[ns+"/"+name]
	return r, ok, nil
}

func (l *lookup) VMI(_ context.Context, ns, name string) ([]byte, error) {
	v, ok := l.vmis[ns+"/"+name]
	if !ok {
		return nil, errors.New("not found")
	}
	return []byte(v), nil
}

func newLookup() *lookup {
	return &lookup{
		nads: map[string]string{"ns1/vhu-net": res, "ns1/vhu-net2": res, "other/vhu-net": res, "ns1/bridge": "", "ns1/sriov": "intel.com/sriov"},
		vmis: map[string]string{
			"ns1/vm4": `{"metadata":{"name":"vm4"},"spec":{"domain":{"cpu":{"cores":4},"devices":{"networkInterfaceMultiqueue":true}}}}`,
			"ns1/vm2": `{"metadata":{"name":"vm2"},"spec":{"domain":{"cpu":{"sockets":2},"devices":{"networkInterfaceMultiqueue":true}}}}`,
			"ns1/vmq": `{"metadata":{"name":"vmq","annotations":{"vhostmq.io/queues":"3"}},"spec":{"domain":{"cpu":{"cores":4},"devices":{"networkInterfaceMultiqueue":true}}}}`,
			"ns1/bad": `{"metadata":{"name":"bad","annotations":{"vhostmq.io/queues":"x"}},"spec":{}}`,
		},
	}
}

// launcher is a pod shaped like KubeVirt's virt-launcher pod: compute
// container with the one unit per network KubeVirt adds, a sidecar.
func launcher(vmiName, networks string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", GenerateName: "virt-launcher-" + vmiName + "-",
			Annotations:     map[string]string{AnnotationNetworks: networks, "kubevirt.io/domain": vmiName},
			Labels:          map[string]string{"kubevirt.io": "virt-launcher"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmiName, UID: "u"}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "compute", Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{"devices.kubevirt.io/kvm": resource.MustParse("1"), res: resource.MustParse("2")},
				Requests: corev1.ResourceList{"memory": resource.MustParse("512Mi"), res: resource.MustParse("2")}}},
			{Name: "hook-sidecar-0"},
		}},
	}
}

func apply(t *testing.T, pod *corev1.Pod, d *Decision) *corev1.Pod {
	t.Helper()
	doc, _ := json.Marshal(pod)
	p, _ := json.Marshal(d.Patch)
	patch, err := jsonpatch.DecodePatch(p)
	if err != nil {
		t.Fatal(err)
	}
	out, err := patch.Apply(doc)
	if err != nil {
		t.Fatalf("patch %s does not apply: %v", p, err)
	}
	var got corev1.Pod
	json.Unmarshal(out, &got)
	return &got
}

func qty(l corev1.ResourceList) int64 { q := l[res]; return q.Value() }

func TestDecide(t *testing.T) {
	rule := &Rule{ResourceName: res, Lookup: newLookup()}
	two := `[{"name":"vhu-net","namespace":"ns1","interface":"pod1a2b3c4d5e6","mac":"ca:fe:ca:fe:42:42"},{"name":"vhu-net2","interface":"pod6f7a8b9c0d1"}]`
	plain := func(ann map[string]string, containers ...corev1.Container) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "p", Annotations: ann}, Spec: corev1.PodSpec{Containers: containers}}
	}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		total     int64 // 0: no decision
		queues    string
		container string
	}{
		{"launcher 4 vCPUs, two networks", launcher("vm4", two), 8, "4", "compute"},
		{"launcher 2 vCPUs, one network (list form)", launcher("vm2", "vhu-net,bridge@eth2"), 2, "2", "compute"},
		{"VMI annotation wins over vCPUs", launcher("vmq", "ns1/vhu-net,sriov"), 3, "3", "compute"},
		{"other namespace's NAD", launcher("vm4", "other/vhu-net"), 4, "4", "compute"},
		{"no vhostmq network", launcher("vm4", "bridge,sriov"), 0, "", ""},
		{"unknown NAD", launcher("vm4", "nope"), 0, "", ""},
		{"plain pod with queues annotation", plain(map[string]string{AnnotationNetworks: "vhu-net,vhu-net2", AnnotationQueues: "2"},
			corev1.Container{Name: "a"}, corev1.Container{Name: "qemu", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("1")}}}), 4, "2", "qemu"},
		{"plain pod default one pair", plain(map[string]string{AnnotationNetworks: "vhu-net"}, corev1.Container{Name: "a"}), 1, "1", "a"},
		{"a larger hand-written request stays", plain(map[string]string{AnnotationNetworks: "vhu-net"},
			corev1.Container{Name: "a", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("6")}, Requests: corev1.ResourceList{res: resource.MustParse("6")}}}), 6, "1", "a"},
	} {
		d, err := rule.Decide(context.Background(), tc.pod)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if tc.total == 0 {
			if d != nil {
				t.Errorf("%s: decision %+v, want none", tc.name, d)
			}
			continue
		}
		if d == nil || d.Total != tc.total || d.Container != tc.container {
			t.Errorf("%s: decision %+v, want %d on %s", tc.name, d, tc.total, tc.container)
			continue
		}
		got := apply(t, tc.pod, d)
		var c corev1.Container
		for _, x := range got.Spec.Containers {
			if x.Name == tc.container {
				c = x
			}
		}
		if qty(c.Resources.Limits) != tc.total || qty(c.Resources.Requests) != tc.total || got.Annotations[AnnotationQueues] != tc.queues {
			t.Errorf("%s: after the patch limits %v requests %v queues %q", tc.name, c.Resources.Limits, c.Resources.Requests, got.Annotations[AnnotationQueues])
		}
		// Other resources stay.
		if tc.container == "compute" && qty(c.Resources.Limits) != 0 {
			if _, ok := c.Resources.Limits["devices.kubevirt.io/kvm"]; !ok {
				t.Errorf("%s: the patch dropped other limits", tc.name)
			}
		}
	}
}

func withAnnotation(p *corev1.Pod, k, v string) *corev1.Pod {
	p.Annotations[k] = v
	return p
}

// The rate limit annotations are the CNI's only on pods with a vhostmq
// network: a good one passes, other pods keep Kubernetes' rules.
func TestDecideBandwidth(t *testing.T) {
	rule := &Rule{ResourceName: res, Lookup: newLookup()}
	ok := withAnnotation(launcher("vm4", "vhu-net"), "kubernetes.io/ingress-bandwidth", "100M")
	ok.Annotations["kubernetes.io/egress-bandwidth"] = "1G"
	if d, err := rule.Decide(context.Background(), ok); err != nil || d == nil || d.Total != 4 {
		t.Errorf("good limits: %+v, %v", d, err)
	}
	other := withAnnotation(launcher("vm4", "bridge"), "kubernetes.io/ingress-bandwidth", "2k")
	if d, err := rule.Decide(context.Background(), other); err != nil || d != nil {
		t.Errorf("no vhostmq network, 2k: %+v, %v; want no decision and no error", d, err)
	}
}

func TestDecideRejects(t *testing.T) {
	rule := &Rule{ResourceName: res, Lookup: newLookup()}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		msg  string
	}{
		{"bad queues annotation", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationQueues: "0"}}}, `annotation vhostmq.io/queues: "0"`},
		{"bad socket mode", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationSocketMode: "both"}}}, `annotation vhostmq.io/socket-mode: "both"`},
		{"bad polling", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationPolling: "spin"}}}, `annotation vhostmq.io/polling: "spin"`},
		{"bad port security", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationPortSecurity: "off"}}}, `annotation vhostmq.io/port-security: "off" is not true or false`},
		{"bad networks JSON", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationNetworks: `[{"name":`}}}, "annotation k8s.v1.cni.cncf.io/networks"},
		{"network without name", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnotationNetworks: `[{"namespace":"x"}]`}}}, "entry 0 has no network name"},
		{"bad VMI annotation", launcher("bad", "vhu-net"), `VirtualMachineInstance ns1/bad: annotation vhostmq.io/queues: "x"`},
		{"VMI missing", launcher("gone", "vhu-net"), "reading VirtualMachineInstance ns1/gone"},
		{"bad ingress bandwidth", withAnnotation(launcher("vm4", "vhu-net"), "kubernetes.io/ingress-bandwidth", "fast"),
			`annotation kubernetes.io/ingress-bandwidth: "fast" is not a quantity like 100M, 1G or 1500k (bits per second)`},
		{"egress bandwidth below Kubernetes' 1k", withAnnotation(launcher("vm4", "vhu-net"), "kubernetes.io/egress-bandwidth", "100m"),
			`annotation kubernetes.io/egress-bandwidth: "100m" is outside Kubernetes' 1k..1P bits per second (m is milli: M is mega)`},
		{"egress bandwidth below the dataplane's", withAnnotation(launcher("vm4", "vhu-net"), "kubernetes.io/egress-bandwidth", "2k"),
			`annotation kubernetes.io/egress-bandwidth: "2k": 2000 bits/s is outside the dataplane's 8000..1000000000000`},
	} {
		d, err := rule.Decide(context.Background(), tc.pod)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v %+v, want an error naming %q", tc.name, err, d, tc.msg)
		}
	}
}

// writeCert makes a self-signed serving certificate for 127.0.0.1.
func writeCert(t *testing.T, dir, cn string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	// write key first, then cert: the reloader keys off the cert's mtime
	os.WriteFile(keyFile+".tmp", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	os.WriteFile(certFile+".tmp", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.Rename(keyFile+".tmp", keyFile)
	os.Rename(certFile+".tmp", certFile)
	pool = x509.NewCertPool()
	c, _ := x509.ParseCertificate(der)
	pool.AddCert(c)
	return certFile, keyFile, pool
}

// TestAdmissionOverTLS drives the handler the way the API server does:
// an AdmissionReview POSTed over TLS; then rotates the certificate.
func TestAdmissionOverTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeCert(t, dir, "one")
	certs := &CertReloader{CertFile: certFile, KeyFile: keyFile}
	h := &Handler{Rule: &Rule{ResourceName: res, Lookup: newLookup()}, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	url := "https://" + ln.Addr().String() + "/mutate"
	post := func(pool *x509.CertPool, pod *corev1.Pod) (*admissionv1.AdmissionResponse, string, error) {
		raw, _ := json.Marshal(pod)
		review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{Kind: "AdmissionReview", APIVersion: "admission.k8s.io/v1"},
			Request: &admissionv1.AdmissionRequest{UID: "req-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Namespace: "ns1", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
		b, _ := json.Marshal(review)
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		resp, err := c.Post(url, "application/json", bytes.NewReader(b))
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		var out admissionv1.AdmissionReview
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return nil, "", err
		}
		return out.Response, resp.TLS.PeerCertificates[0].Subject.CommonName, nil
	}
	r, cn, err := post(pool, launcher("vm4", "vhu-net,vhu-net2"))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Allowed || r.UID != "req-1" || r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch || cn != "one" {
		t.Fatalf("response %+v (cert %s)", r, cn)
	}
	var ops []PatchOp
	if err := json.Unmarshal(r.Patch, &ops); err != nil || len(ops) != 3 || ops[0].Value != "8" || ops[1].Value != "8" || ops[2].Value != "4" {
		t.Errorf("patch %s: want limits and requests 8, vhostmq.io/queues 4", r.Patch)
	}
	bad := launcher("vm4", "vhu-net")
	bad.Annotations[AnnotationPolling] = "spin"
	r, _, err = post(pool, bad)
	if err != nil || r.Allowed || r.Result == nil || !strings.Contains(r.Result.Message, "annotation vhostmq.io/polling") {
		t.Errorf("bad annotation: %v %+v", err, r)
	}
	// Rotation: a new pair in the same files is served without a restart.
	time.Sleep(1100 * time.Millisecond) // a new mtime, past the reloader's 1 s check interval
	_, _, pool2 := writeCert(t, dir, "two")
	_, cn, err = post(pool2, launcher("vm2", "vhu-net"))
	if err != nil || cn != "two" {
		t.Errorf("after rotation: cert %q, %v", cn, err)
	}
}
