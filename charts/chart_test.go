package charts

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/vhostmq/vhostmq/dataplane/config"
)

// The chart's exposure rules, checked on `helm template` output: where
// the metrics listen, what the CNI's host token may do, which pods the
// webhook sees and that it survives a drain. hack/manifests.sh builds
// helm (make verify runs it before these tests).

const (
	release   = "vhostmq"
	namespace = "vhostmq-system"
	cniSA     = "vhostmq-cni"
	nodeSA    = "vhostmq-node"
)

func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("VHOSTMQ_HELM"); h != "" {
		return h
	}
	tools := os.Getenv("VHOSTMQ_TOOLS")
	if tools == "" {
		tools = "/var/cache/vhostmq/tools"
	}
	if h := filepath.Join(tools, "helm-v3.22.0"); fileExists(h) {
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	t.Skip("no helm: hack/manifests.sh builds it (make verify runs before these tests)")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// rendered is one helm template run.
type rendered struct {
	t    *testing.T
	text string
	objs []map[string]any
}

// render runs helm template with the --set values; err is helm's output
// when it refuses.
func render(t *testing.T, sets ...string) (*rendered, error) {
	t.Helper()
	args := []string{"template", release, "vhostmq", "--namespace", namespace, "--kube-version", "1.37.2"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, errors.New(errb.String())
	}
	r := &rendered{t: t, text: out.String()}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out.Bytes()), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("helm template %v: output does not parse: %v", sets, err)
		}
		if m != nil {
			r.objs = append(r.objs, m)
		}
	}
	return r, nil
}

func mustRender(t *testing.T, sets ...string) *rendered {
	t.Helper()
	r, err := render(t, sets...)
	if err != nil {
		t.Fatalf("helm template %v: %v", sets, err)
	}
	return r
}

// get decodes the object of kind and name into out; false if absent.
func (r *rendered) get(kind, name string, out any) bool {
	r.t.Helper()
	for _, m := range r.objs {
		md, _ := m["metadata"].(map[string]any)
		if m["kind"] == kind && md["name"] == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, out); err != nil {
				r.t.Fatalf("%s %s: %v", kind, name, err)
			}
			return true
		}
	}
	return false
}

func (r *rendered) must(kind, name string, out any) {
	r.t.Helper()
	if !r.get(kind, name, out) {
		r.t.Fatalf("no %s %s rendered", kind, name)
	}
}

// dataplaneConfig is the node agent's config as the dataplane reads it.
func (r *rendered) dataplaneConfig() *config.Config {
	r.t.Helper()
	var cm corev1.ConfigMap
	r.must("ConfigMap", release+"-dataplane", &cm)
	c, err := config.Parse([]byte(cm.Data["dataplane.yaml"]))
	if err != nil {
		r.t.Fatalf("the dataplane refuses the chart's config: %v\n%s", err, cm.Data["dataplane.yaml"])
	}
	return c
}

func (r *rendered) container(name string) corev1.Container {
	r.t.Helper()
	var ds appsv1.DaemonSet
	r.must("DaemonSet", release, &ds)
	for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
		if c.Name == name {
			return c
		}
	}
	r.t.Fatalf("no container %s in the DaemonSet", name)
	return corev1.Container{}
}

// rulesOf collects the rules of every role bound to the service account.
func (r *rendered) rulesOf(sa string) []rbacv1.PolicyRule {
	r.t.Helper()
	var rules []rbacv1.PolicyRule
	for _, m := range r.objs {
		var roleRef rbacv1.RoleRef
		var subjects []rbacv1.Subject
		switch m["kind"] {
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			runtime.DefaultUnstructuredConverter.FromUnstructured(m, &b)
			roleRef, subjects = b.RoleRef, b.Subjects
		case "RoleBinding":
			var b rbacv1.RoleBinding
			runtime.DefaultUnstructuredConverter.FromUnstructured(m, &b)
			roleRef, subjects = b.RoleRef, b.Subjects
		default:
			continue
		}
		if !slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == namespace
		}) {
			continue
		}
		if roleRef.Kind == "ClusterRole" {
			var cr rbacv1.ClusterRole
			r.must("ClusterRole", roleRef.Name, &cr)
			rules = append(rules, cr.Rules...)
		} else {
			var ro rbacv1.Role
			r.must("Role", roleRef.Name, &ro)
			rules = append(rules, ro.Rules...)
		}
	}
	return rules
}

func rule(groups, resources, verbs, names []string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{APIGroups: groups, Resources: resources, Verbs: verbs, ResourceNames: names}
}

func s(v ...string) []string { return v }

// The NAD declares the CNI bandwidth capability (so that Multus hands the
// runtime's runtimeConfig.bandwidth to the plugin) unless told not to.
func TestNADBandwidthCapability(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want bool
	}{{"", true}, {"networkAttachmentDefinition.bandwidthCapability=false", false}} {
		var sets []string
		if tc.set != "" {
			sets = append(sets, tc.set)
		}
		r := mustRender(t, sets...)
		var conf struct {
			Capabilities map[string]bool `json:"capabilities"`
		}
		found := false
		for _, m := range r.objs {
			if m["kind"] != "NetworkAttachmentDefinition" {
				continue
			}
			spec, _ := m["spec"].(map[string]any)
			s, _ := spec["config"].(string)
			if err := json.Unmarshal([]byte(s), &conf); err != nil {
				t.Fatalf("%q: the NAD's config: %v\n%s", tc.set, err, s)
			}
			found = true
		}
		if !found || conf.Capabilities["bandwidth"] != tc.want || !conf.Capabilities["deviceID"] || !conf.Capabilities["CNIDeviceInfoFile"] {
			t.Errorf("%q: NAD rendered %v, capabilities %v; want bandwidth %v beside deviceID and CNIDeviceInfoFile", tc.set, found, conf.Capabilities, tc.want)
		}
	}
}

func TestCNITokenRights(t *testing.T) {
	r := mustRender(t)
	// the host file's service account: get, by name, exactly these
	want := []rbacv1.PolicyRule{
		rule(s(""), s("pods"), s("get"), nil),
		rule(s("k8s.cni.cncf.io"), s("network-attachment-definitions"), s("get"), nil),
		rule(s("kubevirt.io"), s("virtualmachineinstances"), s("get"), nil),
		rule(s("kubevirt.io"), s("virtualmachineinstancemigrations"), s("get"), nil),
	}
	if got := r.rulesOf(cniSA); !reflect.DeepEqual(got, want) {
		t.Errorf("the CNI's service account may do\n%+v\nwant exactly\n%+v", got, want)
	}
	var sa corev1.ServiceAccount
	r.must("ServiceAccount", cniSA, &sa)
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Error("the CNI's service account mounts its token into pods: no pod should run as it")
	}
	// the node pod: its own DaemonSet, and minting the CNI's tokens;
	// nothing the CNI reads (so its token on the host is not the CNI's)
	want = []rbacv1.PolicyRule{
		rule(s("apps"), s("daemonsets"), s("get"), s(release)),
		rule(s(""), s("serviceaccounts/token"), s("create"), s(cniSA)),
	}
	if got := r.rulesOf(nodeSA); !reflect.DeepEqual(got, want) {
		t.Errorf("the node pod's service account may do\n%+v\nwant exactly\n%+v", got, want)
	}
	for _, c := range []string{"install-cni", "cni"} {
		if args := r.container(c).Command; !slices.Contains(args, "--service-account="+cniSA) {
			t.Errorf("container %s: %v does not mint the CNI's own tokens (--service-account=%s)", c, args, cniSA)
		}
	}
	if strings.Contains(r.text, "kubernetes.io/service-account-token") {
		t.Error("a long-lived service account token Secret is rendered")
	}
	// with DRA the driver's rights go to the node pod, never to the CNI
	r = mustRender(t, "dra.enabled=true")
	for _, ru := range r.rulesOf(cniSA) {
		if slices.ContainsFunc(ru.Verbs, func(v string) bool { return v != "get" }) || len(ru.Resources) != 1 {
			t.Errorf("with dra.enabled the CNI's service account gets %+v", ru)
		}
	}
}

func TestNoWildcardsOrListsForNodeIdentities(t *testing.T) {
	r := mustRender(t, "dra.enabled=true", "metrics.enabled=true", "metrics.auth=kubernetes")
	for _, sa := range []string{cniSA, nodeSA} {
		for _, ru := range r.rulesOf(sa) {
			if slices.Contains(ru.Verbs, "*") || slices.Contains(ru.Resources, "*") || slices.Contains(ru.APIGroups, "*") {
				t.Errorf("%s: wildcard rule %+v", sa, ru)
			}
			if sa == cniSA && (slices.Contains(ru.Verbs, "list") || slices.Contains(ru.Verbs, "watch")) {
				t.Errorf("%s: may list or watch: %+v", sa, ru)
			}
		}
	}
	want := []rbacv1.PolicyRule{
		rule(s("authentication.k8s.io"), s("tokenreviews"), s("create"), nil),
		rule(s("authorization.k8s.io"), s("subjectaccessreviews"), s("create"), nil),
	}
	var cr rbacv1.ClusterRole
	r.must("ClusterRole", release+"-metrics-auth", &cr)
	if !reflect.DeepEqual(cr.Rules, want) {
		t.Errorf("metrics-auth rules %+v, want exactly %+v", cr.Rules, want)
	}
	r.must("ClusterRole", release+"-metrics-reader", &cr)
	if len(cr.Rules) != 1 || !reflect.DeepEqual(cr.Rules[0].NonResourceURLs, s("/metrics")) || !reflect.DeepEqual(cr.Rules[0].Verbs, s("get")) {
		t.Errorf("metrics-reader rules %+v, want get /metrics", cr.Rules)
	}
	if r := mustRender(t, "metrics.enabled=true"); r.get("ClusterRole", release+"-metrics-auth", &cr) {
		t.Error("metrics.auth=none renders the TokenReview/SubjectAccessReview role")
	}
}

func TestMetricsExposure(t *testing.T) {
	t.Setenv("POD_IP", "10.244.0.7")
	tap := s("uplink.mode=tap", "networkAttachmentDefinition.uplink=tap")
	for _, c := range []struct {
		name    string
		sets    []string
		listen  string // the address the dataplane binds
		service bool   // a metrics Service and containerPort
		auth    string
	}{
		{"default: pod IP", s("metrics.enabled=true"), "10.244.0.7:9474", true, "none"},
		{"host network: localhost", append(tap, "metrics.enabled=true"), "127.0.0.1:9474", false, "none"},
		{"localhost asked", s("metrics.enabled=true", "metrics.bind=localhost"), "127.0.0.1:9474", false, "none"},
		{"all asked", s("metrics.enabled=true", "metrics.bind=all"), "0.0.0.0:9474", true, "none"},
		{"host network, pod IP with tokens", append(tap, "metrics.enabled=true", "metrics.bind=podIP", "metrics.auth=kubernetes",
			"metrics.serviceMonitor.enabled=true"), "10.244.0.7:9474", true, "kubernetes"},
		{"tls with a client CA", s("metrics.enabled=true", "metrics.auth=tls", "metrics.tls.secretName=m-tls",
			"metrics.tls.clientCASecretName=m-ca", "metrics.podMonitor.enabled=true"), "10.244.0.7:9474", true, "tls"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := mustRender(t, c.sets...)
			cfg := r.dataplaneConfig()
			if got, err := cfg.MetricsListen(); err != nil || got != c.listen {
				t.Errorf("metrics listen on %q (%v), want %q", got, err, c.listen)
			}
			if bindAll := strings.Contains(r.text, `"0.0.0.0:`); bindAll != slices.Contains(c.sets, "metrics.bind=all") {
				t.Errorf("0.0.0.0 in the rendering: %v; want it only with metrics.bind=all", bindAll)
			}
			if cfg.MetricsAuthMode() != c.auth {
				t.Errorf("metricsAuth %q, want %q", cfg.MetricsAuthMode(), c.auth)
			}
			dp := r.container("dataplane")
			hasPort := slices.ContainsFunc(dp.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" })
			var svc corev1.Service
			if hasSvc := r.get("Service", release+"-metrics", &svc); hasSvc != c.service || hasPort != c.service {
				t.Errorf("metrics Service %v, containerPort %v; want %v", hasSvc, hasPort, c.service)
			}
			podIP := slices.ContainsFunc(dp.Env, func(e corev1.EnvVar) bool {
				return e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
			})
			if podIP != strings.HasPrefix(c.listen, "10.") {
				t.Errorf("env POD_IP from status.podIP: %v", podIP)
			}
			if p := dp.LivenessProbe; p == nil || p.Exec == nil || !slices.Contains(p.Exec.Command, "live") {
				t.Errorf("liveness probe %+v, want the exec probe --probe live (reaches localhost and HTTPS)", p)
			}
			switch c.auth {
			case "kubernetes":
				if !strings.Contains(r.text, "scheme: https") || !strings.Contains(r.text, "bearerTokenFile:") {
					t.Error("the ServiceMonitor does not scrape over HTTPS with Prometheus' token")
				}
			case "tls":
				if cfg.MetricsTLS == nil || cfg.MetricsTLS.ClientCAFile == "" || !slices.ContainsFunc(dp.VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.Name == "metrics-client-ca" && filepath.Dir(cfg.MetricsTLS.ClientCAFile) == m.MountPath
				}) {
					t.Errorf("metricsTLS %+v and the mounts %+v do not agree", cfg.MetricsTLS, dp.VolumeMounts)
				}
			}
		})
	}
	// off by default: no address at all
	if cfg := mustRender(t).dataplaneConfig(); cfg.MetricsAddress != "" {
		t.Errorf("metrics off, yet metricsAddress %q", cfg.MetricsAddress)
	}
}

func TestWebhookAvailabilityAndScope(t *testing.T) {
	r := mustRender(t)
	name := release + "-webhook"
	var d appsv1.Deployment
	r.must("Deployment", name, &d)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("webhook replicas %v, want 2", d.Spec.Replicas)
	}
	aff := d.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 0 ||
		aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("affinity %+v: want preferred (one-node clusters) anti-affinity across kubernetes.io/hostname", aff)
	}
	var pdb policyv1.PodDisruptionBudget
	r.must("PodDisruptionBudget", name, &pdb)
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || !reflect.DeepEqual(pdb.Spec.Selector, d.Spec.Selector) {
		t.Errorf("PodDisruptionBudget %+v: want minAvailable 1 over the webhook's pods %+v", pdb.Spec, d.Spec.Selector)
	}
	if r1 := mustRender(t, "webhook.replicas=1"); r1.get("PodDisruptionBudget", name, &pdb) {
		t.Error("one replica with minAvailable 1 would block every drain")
	}

	var mwc admissionv1.MutatingWebhookConfiguration
	r.must("MutatingWebhookConfiguration", name, &mwc)
	w := mwc.Webhooks[0]
	if len(w.MatchConditions) != 1 {
		t.Fatalf("matchConditions %+v, want the one that scopes the webhook", w.MatchConditions)
	}
	expr := w.MatchConditions[0].Expression
	if !strings.Contains(expr, "c.image == 'localhost/vhostmq/kubevirt-binding:dev'") {
		t.Errorf("the condition does not let virt-launcher pods with the binding sidecar in: %s", expr)
	}
	// CEL's matches() is RE2, Go's regexp
	re := regexp.MustCompile(regexp.MustCompile(`matches\(r'([^']*)'\)`).FindStringSubmatch(expr)[1])
	for ann, want := range map[string]bool{
		"vhu-net":              true,
		"default/vhu-net@net1": true,
		"sriov-a, vhu-net":     true,
		`[{"name":"vhu-net","namespace":"ns","interface":"pod16477688c0e"}]`: true,
		`[{"name": "vhu-net"}]`: true,
		"sriov-net":             false,
		"vhu-net2,my-vhu-net":   false,
		`[{"name":"ovs-dpdk","namespace":"vhu-net-ns"}]`: false,
	} {
		if re.MatchString(ann) != want {
			t.Errorf("networks %q: sent to the webhook %v, want %v (%s)", ann, !want, want, re)
		}
	}
	// more names: escaped, any of them
	r = mustRender(t, "webhook.networkNames={dpdk.net,other}")
	r.must("MutatingWebhookConfiguration", name, &mwc)
	re = regexp.MustCompile(regexp.MustCompile(`matches\(r'([^']*)'\)`).FindStringSubmatch(mwc.Webhooks[0].MatchConditions[0].Expression)[1])
	if !re.MatchString("ns/dpdk.net") || !re.MatchString("other") || !re.MatchString("vhu-net") || re.MatchString("dpdkxnet") {
		t.Errorf("networkNames dpdk.net and other: regexp %s", re)
	}
}

func TestNamespacePodSecurity(t *testing.T) {
	var ns corev1.Namespace
	if mustRender(t).get("Namespace", namespace, &ns) {
		t.Error("a Namespace is rendered without namespace.create")
	}
	mustRender(t, "namespace.create=true", "namespace.labels.team=net").must("Namespace", namespace, &ns)
	for k, v := range map[string]string{"pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/warn": "privileged",
		"pod-security.kubernetes.io/audit": "privileged", "team": "net"} {
		if ns.Labels[k] != v {
			t.Errorf("namespace label %s=%q, want %q", k, ns.Labels[k], v)
		}
	}
}

func TestRefusalsNameTheValue(t *testing.T) {
	tap := "uplink.mode=tap,networkAttachmentDefinition.uplink=tap"
	for set, want := range map[string]string{
		tap + ",metrics.enabled=true,metrics.serviceMonitor.enabled=true":               "metrics.bind",
		tap + ",metrics.enabled=true,metrics.scrapeAnnotations=true":                    "metrics.bind",
		"metrics.enabled=true,metrics.bind=localhost,metrics.podMonitor.enabled=true":   "metrics.bind",
		"metrics.enabled=true,metrics.auth=tls":                                         "metrics.tls.secretName",
		"metrics.enabled=true,metrics.tls.secretName=s":                                 "metrics.tls.secretName",
		"metrics.enabled=true,metrics.auth=kubernetes,metrics.tls.clientCASecretName=c": "metrics.tls.clientCASecretName",
		"metrics.enabled=true,metrics.readers[0].kind=User,metrics.readers[0].name=u":   "metrics.readers",
		"metrics.enabled=true,metrics.auth=kubernetes,metrics.podMonitor.enabled=true":  "metrics.podMonitor.authorization",
		"metrics.bind=everywhere":                  "/metrics/bind",
		"metrics.auth=basic":                       "/metrics/auth",
		"networkAttachmentDefinition.create=false": "webhook.networkNames",
		"webhook.networkNames={Bad_Name}":          "/webhook/networkNames",
		"namespace.create=yes":                     "/namespace/create",
	} {
		_, err := render(t, set)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v; want it refused naming %s", set, err, want)
		}
	}
}

// The vxlan uplink: the dataplane's config says vxlan with the node's
// address from NODE_IP (status.hostIP), the NAD carries the vni, the node
// pod gets NET_RAW and NET_ADMIN in the host network and may list and
// watch nodes (its VTEPs) and nothing more for it; values that cannot work
// are refused naming them.
func TestVXLANUplink(t *testing.T) {
	vx := "uplink.mode=vxlan,networkAttachmentDefinition.uplink=vxlan,networkAttachmentDefinition.vni=100,networkAttachmentDefinition.mtu=1450"
	r := mustRender(t, vx)
	c := r.dataplaneConfig()
	if c.Uplink == nil || c.Uplink.VXLAN == nil || !c.Uplink.VXLAN.Nodes || c.Uplink.VXLAN.Local != "" || c.Uplink.VXLAN.MTU != 1500 || c.Uplink.VXLAN.Port != 4789 {
		t.Fatalf("dataplane config uplink %+v", c.Uplink)
	}
	vc, err := c.VXLANConfig(func(k string) string { return map[string]string{config.NodeIPEnv: "10.0.0.5"}[k] })
	if err != nil || vc.Local.String() != "10.0.0.5" {
		t.Errorf("the chart's vxlan config with NODE_IP=10.0.0.5: %+v, %v", vc, err)
	}
	dp := r.container("dataplane")
	if !slices.ContainsFunc(dp.Env, func(e corev1.EnvVar) bool {
		return e.Name == config.NodeIPEnv && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
	}) {
		t.Errorf("dataplane env %+v: want NODE_IP from status.hostIP", dp.Env)
	}
	if add := dp.SecurityContext.Capabilities.Add; !slices.Contains(add, "NET_RAW") || !slices.Contains(add, "NET_ADMIN") || slices.Contains(add, "BPF") {
		t.Errorf("dataplane capabilities %v: want NET_RAW and NET_ADMIN, not BPF", add)
	}
	var ds appsv1.DaemonSet
	r.must("DaemonSet", release, &ds)
	if !ds.Spec.Template.Spec.HostNetwork {
		t.Error("the node pod is not in the host network with the vxlan uplink")
	}
	var vteps []rbacv1.PolicyRule
	for _, ru := range r.rulesOf(nodeSA) {
		if slices.Contains(ru.Resources, "nodes") {
			vteps = append(vteps, ru)
		}
	}
	if want := []rbacv1.PolicyRule{rule(s(""), s("nodes"), s("get", "list", "watch"), nil)}; !reflect.DeepEqual(vteps, want) {
		t.Errorf("the node pod's rules on nodes %+v, want exactly %+v", vteps, want)
	}
	found := false
	for _, m := range r.objs {
		if m["kind"] == "NetworkAttachmentDefinition" {
			spec, _ := m["spec"].(map[string]any)
			conf, _ := spec["config"].(string)
			found = strings.Contains(conf, `"uplink":"vxlan"`) && strings.Contains(conf, `"vni":100`) && strings.Contains(conf, `"mtu":1450`)
			if !found {
				t.Errorf("NAD config %s: want uplink vxlan, vni 100, mtu 1450", conf)
			}
		}
	}
	if !found {
		t.Error("no NAD rendered")
	}
	// static VTEPs: no role on nodes
	r = mustRender(t, vx, "uplink.vxlan.nodes=false", "uplink.vxlan.vteps={10.0.0.1,10.0.0.2}")
	if c := r.dataplaneConfig(); c.Uplink.VXLAN.Nodes || len(c.Uplink.VXLAN.VTEPs) != 2 {
		t.Errorf("static VTEPs: config %+v", c.Uplink.VXLAN)
	}
	for _, ru := range r.rulesOf(nodeSA) {
		if slices.Contains(ru.Resources, "nodes") {
			t.Errorf("static VTEPs: the node pod may still %v nodes", ru.Verbs)
		}
	}
	for set, want := range map[string]string{
		"uplink.mode=vxlan,networkAttachmentDefinition.uplink=vxlan,networkAttachmentDefinition.mtu=1450": "networkAttachmentDefinition.vni: required",
		"uplink.mode=vxlan,networkAttachmentDefinition.uplink=vxlan,networkAttachmentDefinition.vni=100":  "networkAttachmentDefinition.mtu: 1500 does not fit the vxlan uplink (uplink.vxlan.mtu 1500 less 50: at most 1450)",
		"uplink.mode=tap,networkAttachmentDefinition.uplink=tap,networkAttachmentDefinition.vni=100":      "networkAttachmentDefinition.vni: a VNI is for",
		vx + ",networkAttachmentDefinition.vlan=7":                                                        "networkAttachmentDefinition.vlan: on the vxlan uplink",
		vx + ",uplink.vxlan.nodes=false":                                                                  "uplink.vxlan.vteps: required",
		vx + ",uplink.vxlan.mtu=100":                                                                      "/uplink/vxlan/mtu",
	} {
		_, err := render(t, set)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--set %s: %v; want it refused naming %q", set, err, want)
		}
	}
}
