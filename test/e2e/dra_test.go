//go:build e2e

package e2e

// Queue pairs through Dynamic Resource Allocation on the one-node test
// cluster, beside the device plugin, the way a user installs them: the Helm
// chart with dra.enabled and devicePlugin.enabled, the CNI called by
// multus-lite. Ported from hack/cluster/test-dra.sh (its checks (a)-(j),
// one It each, named as the script named them). The bring-up (cluster with
// multus-lite, the kubernetes Service routed, the image imported, the NAD
// CRD, the LAN bridge and host for the tap uplink) is bash:
// hack/cluster/test-dra.sh. The install is check (a), so the specs run helm
// themselves; they uninstall the release at the end unless
// VHOSTMQ_E2E_KEEP is set. The specs run in order and go on after a
// failure, as the script did; but for a failed install, which skips the
// rest.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/encoding/protojson"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/test/e2e/framework"
	"github.com/vhostmq/vhostmq/test/e2e/libpod"
)

const (
	draDriver  = "queues.vhostmq.io"
	draRelease = "vhostmq"
	// the chart's node pod (the webhook's pods share the name label)
	nodeSelector = "app.kubernetes.io/name=vhostmq,app.kubernetes.io/component=node"
	draNAD       = "vhu-dra"
	// the claim's socket as the pod sees it (the driver's CDI mount)
	nicSock = "/var/run/vhostmq/nic/vhost-user.sock"
	// KEP-5304's device metadata file of the pod's claim entry "nic",
	// request "queues"
	draMetadata = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/nic/queues/" + draDriver + "-metadata.json"
	metricsPort = "9474"
)

// draSettings are what test-dra.sh's bring-up made (the LAN the tap uplink
// joins: a bridge in the node's netns holding the node's LAN address, and
// another host, a netns on a veth) and the script's knobs, all with its
// defaults.
type draSettings struct {
	lanBridge, lanNetNS, lanNodeIP, lanHostIP string
	guestTimeout                              time.Duration
	rounds                                    int
	err                                       error
}

func loadDRASettings() draSettings {
	get := func(k, def string) string {
		if v := os.Getenv(k); v != "" {
			return v
		}
		return def
	}
	s := draSettings{
		lanBridge: get("VHOSTMQ_E2E_LAN_BRIDGE", "vmq-lan"),
		lanNetNS:  get("VHOSTMQ_E2E_LAN_NETNS", "vhostmq-test-lan"),
		lanNodeIP: get("VHOSTMQ_E2E_LAN_NODE_IP", "10.0.1.254"),
		lanHostIP: get("VHOSTMQ_E2E_LAN_HOST_IP", "10.0.1.100"),
	}
	secs, err := strconv.Atoi(get("VHOSTMQ_TEST_GUEST_TIMEOUT", "150"))
	if err != nil || secs <= 0 {
		s.err = fmt.Errorf("VHOSTMQ_TEST_GUEST_TIMEOUT: seconds, not %q", os.Getenv("VHOSTMQ_TEST_GUEST_TIMEOUT"))
	}
	s.guestTimeout = time.Duration(secs) * time.Second
	s.rounds, err = strconv.Atoi(get("VHOSTMQ_DRA_ROUNDS", "3"))
	if err != nil || s.rounds <= 0 {
		s.err = fmt.Errorf("VHOSTMQ_DRA_ROUNDS: a positive count, not %q", os.Getenv("VHOSTMQ_DRA_ROUNDS"))
	}
	return s
}

// the DRA pods' guests: name, claim template, queue pairs, MAC, address
type draGuest struct {
	pod, template string
	queues        int
	mac, ip, peer string
}

var draGuests = []draGuest{
	{"dra-a", "qp4", 4, "52:54:00:d4:a0:0a", "10.0.1.1", "10.0.1.2"},
	{"dra-b", "qp2", 2, "52:54:00:d4:a0:0b", "10.0.1.2", "10.0.1.1"},
}

var _ = Describe("DRA", Ordered, ContinueOnFailure, Label("dra"), func() {
	res := libpod.QueuePairs
	s := loadDRASettings()
	lanNS := "/run/netns/" + s.lanNetNS
	var (
		agent     agentv1.AgentClient
		dyn       dynamic.Interface
		installed bool
		numaOf    = map[string]int64{}      // slot device -> its numaNode attribute, from (a)
		slots     = map[string]string{}     // pod -> its sorted VHOSTMQ_QUEUE_SLOTS
		claims    = map[string]claimOfPod{} // pod -> its claim
		created   = map[string]time.Time{}  // pod -> when it was created
		dpOwner   string                    // dp-c's reservation, from (b)
		before    map[string]string         // the agent's reservations before (f)
		sliceWas  []string                  // the slice before (f)
		pings     [2]int                    // the guests' replies before the kubelet restart
	)
	guest := func(i int) *framework.Guest { return f.Guest(draGuests[i].pod) }

	// deleteOurs removes what the specs create in namespace default.
	deleteOurs := func(ctx SpecContext) {
		Expect(f.DeleteLabelled(ctx, "default", "app="+libpod.TestLabel)).To(Succeed())
		for _, t := range []string{"qp4", "qp2", "qp1", "cq4", "cq2", "cq1"} {
			err := f.Client.ResourceV1().ResourceClaimTemplates("default").Delete(ctx, t, metav1.DeleteOptions{})
			Expect(ignoreNotFound(err)).To(Succeed())
		}
		for _, n := range []string{draNAD, "vhu-unlisted"} {
			Expect(ignoreNotFound(dyn.Resource(framework.NADResource).Namespace("default").Delete(ctx, n, metav1.DeleteOptions{}))).To(Succeed())
		}
	}

	BeforeAll(func(ctx SpecContext) {
		Expect(s.err).NotTo(HaveOccurred())
		a, conn, err := f.Agent()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(conn.Close)
		agent = a
		dyn, err = dynamic.NewForConfig(f.Rest)
		Expect(err).NotTo(HaveOccurred())
		// leftovers of an earlier run on a cluster that stayed up
		deleteOurs(ctx)
		out, err := f.Helm(ctx, "list", "--namespace", f.Namespace, "--short")
		Expect(err).NotTo(HaveOccurred())
		if slices.Contains(strings.Fields(out), draRelease) {
			_, err = f.Helm(ctx, "uninstall", draRelease, "--namespace", f.Namespace, "--wait", "--timeout", "2m")
			Expect(err).NotTo(HaveOccurred())
		}
		DeferCleanup(func(ctx SpecContext) {
			if os.Getenv("VHOSTMQ_E2E_KEEP") != "" {
				return
			}
			deleteOurs(ctx)
			_, err := f.Helm(ctx, "uninstall", draRelease, "--namespace", f.Namespace, "--wait", "--timeout", "2m")
			Expect(err).NotTo(HaveOccurred())
		}, NodeTimeout(4*time.Minute))
	}, NodeTimeout(4*time.Minute))

	BeforeEach(func() {
		if !installed && CurrentSpecReport().LeafNodeText != installText {
			Skip("the chart is not installed")
		}
	})

	// A failed spec leaves the DRA side's state beside the suite's
	// diagnostics.
	ReportAfterEach(func(r SpecReport) {
		if r.Failed() && f != nil && agent != nil {
			draDiagnostics(f, agent, r)
		}
	})

	Context("(a) helm install with devicePlugin.enabled, dra.enabled, the tap uplink, the webhook and metrics", func() {
		It(installText, func(ctx SpecContext) {
			t0 := time.Now()
			out, err := f.Helm(ctx, "install", draRelease, f.Chart, "--namespace", f.Namespace, "--create-namespace",
				"--wait", "--timeout", "3m",
				"--set", "dra.enabled=true", "--set", "devicePlugin.enabled=true", "--set", "dra.cdiDir="+f.CDIDir,
				"--set", "metrics.enabled=true", "--set", "dataplane.cpus={0,1}",
				"--set", "uplink.mode=tap", "--set", "uplink.tap.attach="+s.lanBridge, "--set", "networkAttachmentDefinition.uplink=tap",
				"--set", "paths.cniBinDir="+f.ClusterRun+"/cni/bin", "--set", "paths.cniConfDir="+f.ClusterRun+"/cni/net.d")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(MatchRegexp(`(?m)^STATUS: deployed$`))
			installed = true
			AddReportEntry("helm install --wait", time.Since(t0).Round(100*time.Millisecond).String())
		}, NodeTimeout(4*time.Minute))

		It("(a) the pod runs dataplane, deviceplugin and dra", func(ctx SpecContext) {
			l, err := f.Client.CoreV1().Pods(f.Namespace).List(ctx, metav1.ListOptions{LabelSelector: nodeSelector})
			Expect(err).NotTo(HaveOccurred())
			Expect(l.Items).NotTo(BeEmpty(), "pods of %s", nodeSelector)
			for _, p := range l.Items {
				var names []string
				for _, c := range p.Spec.Containers {
					names = append(names, c.Name)
				}
				Expect(names).To(ContainElements("dataplane", "deviceplugin", "dra"), p.Name)
			}
		})

		// the tap uplink needs the host's network namespace and NET_ADMIN, and no more
		It("(a) uplink.mode=tap: the node pod in the host network, the dataplane adding only NET_ADMIN to its own", func(ctx SpecContext) {
			ds, err := f.Client.AppsV1().DaemonSets(f.Namespace).Get(ctx, draRelease, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			spec := ds.Spec.Template.Spec
			add := []string{}
			for _, c := range spec.Containers {
				if c.Name == "dataplane" && c.SecurityContext != nil && c.SecurityContext.Capabilities != nil {
					for _, a := range c.SecurityContext.Capabilities.Add {
						add = append(add, string(a))
					}
				}
			}
			Expect(fmt.Sprintf("hostNetwork=%t add=%s", spec.HostNetwork, strings.Join(add, ","))).
				To(Equal("hostNetwork=true add=CHOWN,DAC_OVERRIDE,FOWNER,NET_ADMIN"))
		})

		It("(a) the dataplane's tap vhostmq0 is a port of the LAN bridge in the node's netns", func() {
			Eventually(func() (string, error) { return framework.LinkMaster(f.NetNS, "vhostmq0") }).
				WithTimeout(30*time.Second).WithPolling(500*time.Millisecond).Should(Equal(s.lanBridge), "vhostmq0's master")
		})

		It("(a) DeviceClass queues.vhostmq.io", func(ctx SpecContext) {
			_, err := f.Client.ResourceV1().DeviceClasses().Get(ctx, draDriver, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
		})

		It("(a) ResourceSlice of queues.vhostmq.io on the node: 8 devices", func(ctx SpecContext) {
			Eventually(f.SliceNames(ctx, draDriver, f.Node)).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(HaveLen(8))
			devs, err := f.SliceDevices(ctx, draDriver, f.Node)
			Expect(err).NotTo(HaveOccurred())
			var line []string
			for _, d := range devs {
				cpu, numa := intAttr(d, "cpu"), intAttr(d, "numaNode")
				numaOf[d.Name] = numa
				line = append(line, fmt.Sprintf("%s(cpu %d, numa %d)", d.Name, cpu, numa))
			}
			GinkgoWriter.Printf("devices: %s\n", strings.Join(line, " "))
		})

		It("(a) node allocatable vhostmq.io/queue-pairs = 8", func(ctx SpecContext) {
			Eventually(f.NodeResource(ctx, f.Node, res)).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(HaveField("Allocatable", "8"))
		})

		// the chart's NAD (resourceName: the device plugin's) as DRA pods'
		// NAD: the same config without the annotation, so the CNI looks for
		// a claim
		It("(a) NAD default/vhu-dra (the chart's vhu-net config without resourceName)", func(ctx SpecContext) {
			src, err := dyn.Resource(framework.NADResource).Namespace(f.Namespace).Get(ctx, "vhu-net", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			conf, err := nadConfig(src)
			Expect(err).NotTo(HaveOccurred())
			delete(conf, "resourceName")
			b, err := json.Marshal(conf)
			Expect(err).NotTo(HaveOccurred())
			nad := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
				"metadata": map[string]any{"name": draNAD, "namespace": "default"},
				"spec":     map[string]any{"config": string(b)},
			}}
			_, err = dyn.Resource(framework.NADResource).Namespace("default").Create(ctx, nad, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
			got, err := dyn.Resource(framework.NADResource).Namespace("default").Get(ctx, draNAD, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			gotConf, err := nadConfig(got)
			Expect(err).NotTo(HaveOccurred())
			ann, ok := got.GetAnnotations()["k8s.v1.cni.cncf.io/resourceName"]
			if !ok {
				ann = "none"
			}
			_, hasRes := gotConf["resourceName"]
			Expect(fmt.Sprintf("annotation=%s type=%v resourceName=%t", ann, gotConf["type"], hasRes)).
				To(Equal("annotation=none type=vhostmq-cni resourceName=false"))
		})
	})

	Context("(a) least exposure: the CNI's token, the webhook, the metrics", func() {
		cniSA := func() string { return "system:serviceaccount:" + f.Namespace + ":" + draRelease + "-cni" }
		nodeSA := func() string { return "system:serviceaccount:" + f.Namespace + ":" + draRelease + "-node" }

		for _, v := range []string{"get", "list", "watch"} {
			want := v == "get"
			for _, r := range []struct{ group, resource string }{
				{"", "pods"}, {"k8s.cni.cncf.io", "network-attachment-definitions"},
				{"kubevirt.io", "virtualmachineinstances"}, {"kubevirt.io", "virtualmachineinstancemigrations"},
			} {
				It(fmt.Sprintf("(a) the CNI's account: %s %s -A: %s", v, r.resource, yesNo(want)), func(ctx SpecContext) {
					Expect(canI(ctx, cniSA(), authorizationv1.ResourceAttributes{Verb: v, Group: r.group, Resource: r.resource})).
						To(Equal(want), "%s may %s %s", cniSA(), v, r.resource)
				})
			}
		}

		It("(a) the CNI's account: no create pods, no get secrets, no resourceslices", func(ctx SpecContext) {
			for _, ra := range []authorizationv1.ResourceAttributes{
				{Verb: "create", Resource: "pods"},
				{Verb: "get", Resource: "secrets"},
				{Verb: "list", Group: "resource.k8s.io", Resource: "resourceslices"},
			} {
				Expect(canI(ctx, cniSA(), ra)).To(BeFalse(), "%s may %s %s", cniSA(), ra.Verb, ra.Resource)
			}
		})

		It("(a) the node pod's account: no get pods (its token is not the host's)", func(ctx SpecContext) {
			Expect(canI(ctx, nodeSA(), authorizationv1.ResourceAttributes{Verb: "get", Resource: "pods"})).To(BeFalse())
		})

		It("(a) the node pod's account: creates tokens of vhostmq-cni only", func(ctx SpecContext) {
			token := func(sa string) authorizationv1.ResourceAttributes {
				return authorizationv1.ResourceAttributes{Verb: "create", Resource: "serviceaccounts", Subresource: "token",
					Name: sa, Namespace: f.Namespace}
			}
			Expect(canI(ctx, nodeSA(), token(draRelease+"-cni"))).To(BeTrue(), "a token of %s-cni", draRelease)
			Expect(canI(ctx, nodeSA(), token(draRelease+"-node"))).To(BeFalse(), "a token of %s-node", draRelease)
		})

		// the host file itself: whose token, for how long, and what it can do
		hostKC := func() string { return filepath.Join(f.ClusterRun, "cni/net.d/vhostmq.d") }
		It("(a) the host token (cni/net.d/vhostmq.d/token) is vhostmq-cni's, 10 minutes, mode 0600", func() {
			file := filepath.Join(hostKC(), "token")
			Eventually(func() (string, error) {
				claims, mode, err := jwtClaims(file)
				if err != nil {
					return "", err
				}
				GinkgoWriter.Printf("the host token: sub %s, lifetime %d s, pod %s\n", claims.Sub, claims.Exp-claims.Iat, claims.Kubernetes.Pod.Name)
				return fmt.Sprintf("%s lifetime=%d mode=%o", claims.Sub, claims.Exp-claims.Iat, mode), nil
			}).WithTimeout(10*time.Second).WithPolling(time.Second).Should(Equal(cniSA()+" lifetime=600 mode=600"), file)
		})

		It("(a) with the host kubeconfig: get the node pod works", func(ctx SpecContext) {
			l, err := f.Client.CoreV1().Pods(f.Namespace).List(ctx, metav1.ListOptions{LabelSelector: nodeSelector})
			Expect(err).NotTo(HaveOccurred())
			Expect(l.Items).NotTo(BeEmpty())
			host, err := f.ClientFor(filepath.Join(hostKC(), "vhostmq.kubeconfig"))
			Expect(err).NotTo(HaveOccurred())
			_, err = host.CoreV1().Pods(f.Namespace).Get(ctx, l.Items[0].Name, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred(), "get pod %s/%s with the host kubeconfig", f.Namespace, l.Items[0].Name)
		})

		It("(a) with the host kubeconfig: list pods -A is Forbidden", func(ctx SpecContext) {
			host, err := f.ClientFor(filepath.Join(hostKC(), "vhostmq.kubeconfig"))
			Expect(err).NotTo(HaveOccurred())
			_, err = host.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "list pods -A with the host kubeconfig: %v", err)
		})

		// the webhook: two replicas, a budget, and only pods that can ask for vhostmq
		It("(a) the webhook Deployment has 2 ready replicas", func(ctx SpecContext) {
			Eventually(func() (int32, error) {
				d, err := f.Client.AppsV1().Deployments(f.Namespace).Get(ctx, draRelease+"-webhook", metav1.GetOptions{})
				if err != nil {
					return 0, err
				}
				return d.Status.ReadyReplicas, nil
			}).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(Equal(int32(2)))
		})

		It("(a) PodDisruptionBudget vhostmq-webhook: minAvailable 1, 2 healthy", func(ctx SpecContext) {
			Eventually(func() (string, error) {
				p, err := f.Client.PolicyV1().PodDisruptionBudgets(f.Namespace).Get(ctx, draRelease+"-webhook", metav1.GetOptions{})
				if err != nil {
					return "", err
				}
				return fmt.Sprintf("minAvailable=%s healthy=%d", p.Spec.MinAvailable, p.Status.CurrentHealthy), nil
			}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(Equal("minAvailable=1 healthy=2"))
		})

		// asked: mutated (the API server reaches the webhook) or refused by
		// failurePolicy Fail (it does not: this node runs no kube-proxy)
		It("(a) a pod naming the chart's vhu-net goes to the webhook", func(ctx SpecContext) {
			Expect(dryRunPod(ctx, f.Namespace+"/vhu-net")).To(Or(HavePrefix("mutated:"), HavePrefix("webhook call failed:")))
		})

		// a vhostmq NAD the chart does not know by name: its pods bypass the webhook
		It("(a) a pod naming other NADs (vhu-unlisted: vhostmq's, not listed; sriov-net) is admitted untouched", func(ctx SpecContext) {
			src, err := dyn.Resource(framework.NADResource).Namespace(f.Namespace).Get(ctx, "vhu-net", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			nad := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
				"metadata": map[string]any{"name": "vhu-unlisted", "namespace": "default", "annotations": map[string]any{
					"k8s.v1.cni.cncf.io/resourceName": src.GetAnnotations()["k8s.v1.cni.cncf.io/resourceName"]}},
				"spec": src.Object["spec"],
			}}
			_, err = dyn.Resource(framework.NADResource).Namespace("default").Create(ctx, nad, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(func(ctx SpecContext) {
				Expect(ignoreNotFound(dyn.Resource(framework.NADResource).Namespace("default").Delete(ctx, "vhu-unlisted", metav1.DeleteOptions{}))).To(Succeed())
			})
			Expect(dryRunPod(ctx, "vhu-unlisted,sriov-net")).To(Equal("untouched"))
		})

		// metrics: the pod is in the host network (tap), so bound to localhost
		It(`(a) metrics: the agent config binds 127.0.0.1 (metricsAddress: "127.0.0.1:9474")`, func(ctx SpecContext) {
			cm, err := f.Client.CoreV1().ConfigMaps(f.Namespace).Get(ctx, draRelease+"-dataplane", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			var lines []string
			for _, l := range strings.Split(cm.Data["dataplane.yaml"], "\n") {
				if strings.HasPrefix(l, "metricsAddress:") {
					lines = append(lines, l)
				}
			}
			Expect(lines).To(Equal([]string{`metricsAddress: "127.0.0.1:` + metricsPort + `"`}))
		})

		It("(a) metrics: http://127.0.0.1:9474/healthz answers on the node", func(ctx SpecContext) {
			Eventually(func() (int, error) {
				return framework.HTTPGetIn(ctx, f.NetNS, "http://127.0.0.1:"+metricsPort+"/healthz")
			}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(And(BeNumerically(">=", 200), BeNumerically("<", 300)))
		})

		It("(a) metrics: nothing on the node address :9474", func(ctx SpecContext) {
			ip, err := nodeIP(ctx)
			Expect(err).NotTo(HaveOccurred())
			Expect(framework.TCPConnectIn(ctx, f.NetNS, ip+":"+metricsPort, 5*time.Second)).To(BeElementOf("refused", "timeout"), ip)
		})

		It("(a) metrics: nothing on the LAN address :9474, from the LAN host", func(ctx SpecContext) {
			Expect(framework.TCPConnectIn(ctx, lanNS, s.lanNodeIP+":"+metricsPort, 5*time.Second)).To(BeElementOf("refused", "timeout"),
				"%s from %s", s.lanNodeIP, s.lanNetNS)
		})

		It("(a) metrics: no Service vhostmq-metrics (nothing can scrape a localhost bind)", func(ctx SpecContext) {
			_, err := f.Client.CoreV1().Services(f.Namespace).Get(ctx, draRelease+"-metrics", metav1.GetOptions{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "get service %s-metrics: %v", draRelease, err)
		})
	})

	Context("(b) device-plugin pod dp-c, 2 queue pairs", func() {
		It("(b) dp-c Running", func(ctx SpecContext) {
			t0 := time.Now()
			_, err := f.CreatePod(ctx, libpod.New("dp-c", libpod.WithQueuePairs(2)))
			Expect(err).NotTo(HaveOccurred())
			Eventually(f.PodStateOf(ctx, "default", "dp-c")).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).
				Should(framework.BeReadyOn(f.Node))
			AddReportEntry("device plugin: dp-c (busybox, 2 queue pairs) create -> Running", time.Since(t0).Round(100*time.Millisecond).String())
		})

		It("(b) the agent holds dp-c's slots for its allocation", func(ctx SpecContext) {
			v, err := f.PodEnv(ctx, "default", "dp-c", "VHOSTMQ_QUEUE_SLOTS")
			Expect(err).NotTo(HaveOccurred())
			slots["dp-c"] = framework.SortedCSV(v)
			Expect(count(slots["dp-c"])).To(Equal(2), "dp-c's VHOSTMQ_QUEUE_SLOTS %q", v)
			held, err := framework.Held(ctx, agent)
			Expect(err).NotTo(HaveOccurred())
			owners := allocOwners(held)
			Expect(owners).To(HaveLen(1), "the device plugin's allocations in the agent: %v", held)
			dpOwner = owners[0]
			Expect(framework.HeldBy(held, dpOwner)).To(Equal(slots["dp-c"]), "the slots of %s", dpOwner)
		})

		It("(b) the slice drops them: 6 devices, none of dp-c's", func(ctx SpecContext) {
			Eventually(f.SliceNames(ctx, draDriver, f.Node)).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).
				Should(HaveLen(6))
		})

		It("(b) no slice device is one of dp-c's slots", func(ctx SpecContext) {
			Expect(slots["dp-c"]).NotTo(BeEmpty())
			names, err := f.SliceNames(ctx, draDriver, f.Node)()
			Expect(err).NotTo(HaveOccurred())
			for _, id := range strings.Split(slots["dp-c"], ",") {
				Expect(names).NotTo(ContainElement(id))
			}
		})
	})

	Context("(c) pods with claims for 4 and 2 queue pairs (ResourceClaimTemplates)", func() {
		for i, g := range draGuests {
			It(fmt.Sprintf("(c) %s Running", g.pod), func(ctx SpecContext) {
				if i == 0 {
					// qpN: N slot devices on one NUMA node
					for _, n := range []int64{4, 2, 1} {
						Expect(createTemplate(ctx, fmt.Sprintf("qp%d", n), slotRequest(n), numaConstraint())).To(Succeed())
					}
					dir, err := f.GuestDir()
					Expect(err).NotTo(HaveOccurred())
					t0 := time.Now()
					for _, h := range draGuests {
						_, err := f.CreatePod(ctx, guestPod(dir, h))
						Expect(err).NotTo(HaveOccurred())
						created[h.pod] = t0
					}
				}
				Expect(created).To(HaveKey(g.pod), "%s was created", g.pod)
				Eventually(f.PodStateOf(ctx, "default", g.pod)).WithTimeout(120 * time.Second).WithPolling(200 * time.Millisecond).
					Should(framework.BeReadyOn(f.Node))
				AddReportEntry(fmt.Sprintf("claim-to-Running: %s (QEMU, claim of %d, CNI) create -> Running", g.pod, g.queues),
					time.Since(created[g.pod]).Round(100*time.Millisecond).String())
			})
		}

		for _, g := range draGuests {
			n := g.queues
			It(fmt.Sprintf("(c) %s: its claim has %d devices of queues.vhostmq.io on one NUMA node", g.pod, n), func(ctx SpecContext) {
				c, err := getClaimOf(ctx, g.pod)
				Expect(err).NotTo(HaveOccurred())
				claims[g.pod] = c
				GinkgoWriter.Printf("%s: claim %s (uid %s) allocated %s\n", g.pod, c.name, c.uid, c.devices)
				Expect(c.devices).To(HaveLen(n))
				nodes := map[int64]bool{}
				for _, d := range c.devices {
					Expect(numaOf).To(HaveKey(d), "device %s in the slice of (a)", d)
					nodes[numaOf[d]] = true
				}
				Expect(nodes).To(HaveLen(1), "the NUMA nodes of %v", c.devices)
			})

			It(fmt.Sprintf("(c) %s: VHOSTMQ_QUEUE_SLOTS = the claim's devices", g.pod), func(ctx SpecContext) {
				Expect(claims).To(HaveKey(g.pod))
				v, err := f.PodEnv(ctx, "default", g.pod, "VHOSTMQ_QUEUE_SLOTS")
				Expect(err).NotTo(HaveOccurred())
				slots[g.pod] = framework.SortedCSV(v)
				Expect(slots[g.pod]).To(And(Not(BeEmpty()), Equal(strings.Join(claims[g.pod].devices, ","))))
			})

			It(fmt.Sprintf("(c) %s: the agent holds them for claim/<uid>", g.pod), func(ctx SpecContext) {
				Expect(claims).To(HaveKey(g.pod))
				held, err := framework.Held(ctx, agent)
				Expect(err).NotTo(HaveOccurred())
				Expect(framework.HeldBy(held, "claim/"+claims[g.pod].uid)).To(Equal(strings.Join(claims[g.pod].devices, ",")))
			})

			It(fmt.Sprintf("(c) %s: one port, %d queue pairs on exactly those slots", g.pod, n), func(ctx SpecContext) {
				Expect(claims).To(HaveKey(g.pod))
				ports, err := framework.PortsOfPod(ctx, agent, g.pod)
				Expect(err).NotTo(HaveOccurred())
				Expect(ports).To(HaveLen(1), "the agent's ports of %s", g.pod)
				p := ports[0].GetSpec()
				GinkgoWriter.Printf("%s: port %s, %d queue pairs, slots %v, socket %s, mac %s\n", g.pod, p.GetId(), p.GetQueuePairs(), p.GetSlots(), p.GetSocketPath(), p.GetMac())
				Expect(fmt.Sprintf("%d %s", p.GetQueuePairs(), framework.SortedCSV(strings.Join(p.GetSlots(), ",")))).
					To(Equal(fmt.Sprintf("%d %s", n, strings.Join(claims[g.pod].devices, ","))))
			})

			It(fmt.Sprintf("(c) %s: port socket in the claim's directory (claim-<hash>/vhost-user.sock)", g.pod), func(ctx SpecContext) {
				ports, err := framework.PortsOfPod(ctx, agent, g.pod)
				Expect(err).NotTo(HaveOccurred())
				Expect(ports).To(HaveLen(1))
				Expect(ports[0].GetSpec().GetSocketPath()).To(MatchRegexp(`^` + sockDir + `/claim-[^/]+/vhost-user\.sock$`))
			})

			It(fmt.Sprintf("(c) %s: claim status.devices: %d Ready entries naming /var/run/vhostmq/nic/vhost-user.sock", g.pod, n), func(ctx SpecContext) {
				Expect(claims).To(HaveKey(g.pod))
				c, err := f.Client.ResourceV1().ResourceClaims("default").Get(ctx, claims[g.pod].name, metav1.GetOptions{})
				Expect(err).NotTo(HaveOccurred())
				ready := 0
				for _, d := range c.Status.Devices {
					if d.Driver != draDriver {
						continue
					}
					GinkgoWriter.Printf("%s: status device %s conditions %v data %s\n", g.pod, d.Device, conditions(d.Conditions), rawData(d))
					var data struct {
						VhostUserPath string `json:"vhostUserPath"`
					}
					if d.Data != nil {
						_ = json.Unmarshal(d.Data.Raw, &data)
					}
					if len(d.Conditions) > 0 && d.Conditions[0].Type == "Ready" && d.Conditions[0].Status == metav1.ConditionTrue &&
						data.VhostUserPath == nicSock {
						ready++
					}
				}
				Expect(ready).To(Equal(n), "Ready device statuses of %s naming %s", claims[g.pod].name, nicSock)
			})

			It(fmt.Sprintf("(c) %s: claim status.devices carry the port's network data (net1, %s)", g.pod, g.mac), func(ctx SpecContext) {
				Expect(claims).To(HaveKey(g.pod))
				Eventually(func() ([]string, error) {
					c, err := f.Client.ResourceV1().ResourceClaims("default").Get(ctx, claims[g.pod].name, metav1.GetOptions{})
					if err != nil {
						return nil, err
					}
					nd := []string{}
					for _, d := range c.Status.Devices {
						if d.Driver == draDriver {
							if d.NetworkData == nil {
								nd = append(nd, "none")
							} else {
								nd = append(nd, d.NetworkData.InterfaceName+" "+d.NetworkData.HardwareAddress)
							}
						}
					}
					return nd, nil
				}).WithTimeout(15*time.Second).WithPolling(500*time.Millisecond).
					Should(And(Not(BeEmpty()), HaveEach("net1 "+g.mac)), "the network data of %s's device statuses", claims[g.pod].name)
			})
		}

		It("(c) device-plugin side shrinks: allocatable vhostmq.io/queue-pairs = 2 (6 slots held by claims)", func(ctx SpecContext) {
			Eventually(f.NodeResource(ctx, f.Node, res)).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).
				Should(HaveField("Allocatable", "2"))
		})

		It("(c) from the agent: 8 slots held, each once (dp-c 2, dra-a 4, dra-b 2), none shared", func(ctx SpecContext) {
			want := map[string]string{}
			n := 0
			for pod, owner := range map[string]string{"dp-c": dpOwner, "dra-a": "claim/" + claims["dra-a"].uid, "dra-b": "claim/" + claims["dra-b"].uid} {
				Expect(slots[pod]).NotTo(BeEmpty(), "%s's slots", pod)
				for _, id := range strings.Split(slots[pod], ",") {
					want[id] = owner
					n++
				}
			}
			Expect(want).To(HaveLen(n), "no slot in two pods: %v", slots)
			held, err := framework.Held(ctx, agent)
			Expect(err).NotTo(HaveOccurred())
			GinkgoWriter.Printf("held: %v\n", held)
			Expect(held).To(And(HaveLen(8), Equal(want)))
		})
	})

	Context("(d) QEMU in each pod on the socket from the metadata file; guests ping each other", func() {
		for _, g := range draGuests {
			It(fmt.Sprintf("(d) %s: QEMU on /var/run/vhostmq/nic/vhost-user.sock (metadata file), %d queues", g.pod, g.queues), func(ctx SpecContext) {
				Eventually(f.QEMULaunch(ctx, "default", g.pod)).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).
					Should(And(HaveField("Socket", nicSock), HaveField("Queues", g.queues)))
				if b, err := f.Client.CoreV1().Pods("default").GetLogs(g.pod, &corev1.PodLogOptions{Container: "qemu"}).DoRaw(ctx); err == nil {
					GinkgoWriter.Printf("%s's log:\n%s\n", g.pod, b)
				}
			})
		}

		for i, g := range draGuests {
			It(fmt.Sprintf("(d) guest %s: %d rx + %d tx queues, link up", g.pod, g.queues, g.queues), func() {
				Eventually(guest(i).Await("link")).WithTimeout(s.guestTimeout).WithPolling(time.Second).ShouldNot(BeNil())
				q, l := guest(i).Last("queues"), guest(i).Last("link")
				Expect(fmt.Sprintf("%s/%s %s", q["rx"], q["tx"], l["state"])).To(Equal(fmt.Sprintf("%d/%d up", g.queues, g.queues)), guest(i).Tail(20))
			})
		}

		It("(d) the guests ping each other (5 replies each way)", func() {
			Eventually(func() []int { return []int{guest(0).Pings(), guest(1).Pings()} }).
				WithTimeout(s.guestTimeout).WithPolling(500*time.Millisecond).Should(HaveEach(BeNumerically(">=", 5)), guest(0).Tail(10))
		})

		// the guests on the node's network, through the tap uplink
		for _, g := range draGuests {
			It(fmt.Sprintf("(d) tap uplink: %s (%s) answers the LAN's other host", g.pod, g.ip), func(ctx SpecContext) {
				// busybox's ping: Debian's minimal install has none
				Eventually(func() error {
					_, err := framework.Run(ctx, "ip", "netns", "exec", s.lanNetNS, "busybox", "ping", "-c", "2", "-W", "2", g.ip)
					return err
				}).WithTimeout(30*time.Second).WithPolling(time.Second).Should(Succeed(), "from %s (%s)", s.lanNetNS, s.lanHostIP)
			})

			It(fmt.Sprintf("(d) tap uplink: %s (%s) answers the node's address on the LAN bridge", g.pod, g.ip), func(ctx SpecContext) {
				Eventually(func() error {
					_, err := framework.Run(ctx, "nsenter", "--net="+f.NetNS, "--", "busybox", "ping", "-c", "2", "-W", "2", "-I", s.lanBridge, g.ip)
					return err
				}).WithTimeout(30*time.Second).WithPolling(time.Second).Should(Succeed(), "from %s on %s", s.lanNodeIP, s.lanBridge)
			})
		}

		It("(d) the LAN host learnt dra-a's MAC for its address", func() {
			Expect(framework.NeighborMAC(lanNS, "lan0", draGuests[0].ip)).To(Equal(draGuests[0].mac))
		})
	})

	Context("(e) above the free capacity: a claim and a device-plugin pod stay Pending", func() {
		It("(e) dra-x Pending: FailedScheduling says the claim cannot be allocated", func(ctx SpecContext) {
			_, err := f.CreatePod(ctx, libpod.New("dra-x", libpod.WithClaimTemplate("nic", "qp1")))
			Expect(err).NotTo(HaveOccurred())
			_, err = f.CreatePod(ctx, libpod.New("dp-y", libpod.WithQueuePairs(1)))
			Expect(err).NotTo(HaveOccurred())
			Eventually(lastEvent(ctx, "dra-x", "FailedScheduling")).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(ContainSubstring("cannot allocate all claims"))
		})

		It("(e) dp-y Pending: FailedScheduling says Insufficient vhostmq.io/queue-pairs", func(ctx SpecContext) {
			Eventually(lastEvent(ctx, "dp-y", "FailedScheduling")).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(ContainSubstring("Insufficient " + string(res)))
		})

		It("(e) both still Pending", func(ctx SpecContext) {
			for _, p := range []string{"dra-x", "dp-y"} {
				Expect(f.PodStateOf(ctx, "default", p)()).To(Equal(framework.PodState{Phase: corev1.PodPending}), p)
			}
		})
	})

	Context("(f) the DRA driver restarted, then the kubelet: prepared claims stay", func() {
		It("(f) the dra container restarted (its process killed) and is ready again", func(ctx SpecContext) {
			var err error
			before, err = framework.Held(ctx, agent)
			Expect(err).NotTo(HaveOccurred())
			sliceWas, err = f.SliceNames(ctx, draDriver, f.Node)()
			Expect(err).NotTo(HaveOccurred())
			was, err := draContainer(ctx)()
			Expect(err).NotTo(HaveOccurred())
			pid, err := f.ContainerPID(ctx, was.ID)
			Expect(err).NotTo(HaveOccurred(), "the DRA driver's process")
			Expect(framework.Comm(pid)).To(HavePrefix("vhostmq-dra"), "comm of pid %d (container %s)", pid, was.ID)
			GinkgoWriter.Printf("dra container %.25s pid %d, restarts %d\n", was.ID, pid, was.Restarts)
			Expect(syscall.Kill(pid, syscall.SIGTERM)).To(Succeed())
			Eventually(draContainer(ctx)).WithTimeout(90 * time.Second).WithPolling(500 * time.Millisecond).
				Should(And(HaveField("Restarts", BeNumerically(">", was.Restarts)), HaveField("Ready", true)))
		})

		It("(f) after the driver's restart: reservations and slice unchanged", func(ctx SpecContext) {
			Expect(before).NotTo(BeEmpty())
			Expect(framework.Held(ctx, agent)).To(Equal(before))
			Expect(f.SliceNames(ctx, draDriver, f.Node)()).To(Equal(sliceWas))
		})

		It("(f) node Ready after the kubelet restart", func(ctx SpecContext) {
			pings = [2]int{guest(0).Pings(), guest(1).Pings()}
			_, err := framework.Run(ctx, f.ClusterSh, "restart-kubelet")
			Expect(err).NotTo(HaveOccurred())
			Eventually(func() (corev1.ConditionStatus, error) {
				n, err := f.Client.CoreV1().Nodes().Get(ctx, f.Node, metav1.GetOptions{})
				if err != nil {
					return "", err
				}
				for _, c := range n.Status.Conditions {
					if c.Type == corev1.NodeReady {
						return c.Status, nil
					}
				}
				return "no Ready condition", nil
			}).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).Should(Equal(corev1.ConditionTrue))
		}, NodeTimeout(3*time.Minute))

		It("(f) reservations unchanged", func(ctx SpecContext) {
			Expect(before).NotTo(BeEmpty())
			Expect(framework.Held(ctx, agent)).To(Equal(before))
		})

		It("(f) the slice unchanged", func(ctx SpecContext) {
			Expect(sliceWas).NotTo(BeEmpty())
			Eventually(f.SliceNames(ctx, draDriver, f.Node)).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).
				Should(Equal(sliceWas))
		})

		It("(f) dra-a, dra-b, dp-c still Running", func(ctx SpecContext) {
			for _, p := range []string{"dra-a", "dra-b", "dp-c"} {
				Expect(f.PodStateOf(ctx, "default", p)()).To(HaveField("Phase", corev1.PodRunning), p)
			}
		})

		It("(f) the guests go on pinging each other (5 more replies each way)", func() {
			Eventually(func() []int { return []int{guest(0).Pings() - pings[0], guest(1).Pings() - pings[1]} }).
				WithTimeout(60*time.Second).WithPolling(500*time.Millisecond).Should(HaveEach(BeNumerically(">=", 5)), guest(0).Tail(10))
		})
	})

	Context("(g) dra-b deleted: its claim is unprepared; dp-y deleted: dra-x runs", func() {
		var freed time.Time
		uidB := func() string { return claims["dra-b"].uid }

		It("(g) the agent released claim/<uid of dra-b>", func(ctx SpecContext) {
			Expect(uidB()).NotTo(BeEmpty(), "dra-b's claim, from (c)")
			freed = time.Now() // dra-x's capacity: dra-b's claim, released as the pod goes
			Expect(f.DeletePods(ctx, "default", 60*time.Second, "dra-b")).To(Succeed())
			Expect(f.DeletePods(ctx, "default", 30*time.Second, "dp-y")).To(Succeed())
			Eventually(func() (string, error) {
				held, err := framework.Held(ctx, agent)
				return framework.HeldBy(held, "claim/"+uidB()), err
			}).WithTimeout(60*time.Second).WithPolling(500*time.Millisecond).Should(BeEmpty(), "slots of claim/%s", uidB())
		})

		It("(g) its CDI specs and metadata files are gone", func() {
			Expect(uidB()).NotTo(BeEmpty())
			Eventually(filesNamed(uidB(), f.CDIDir, sockDir, "/var/lib/kubelet/plugins/"+draDriver)).
				WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(BeEmpty())
		})

		It("(g) its record for the CNI is gone", func() {
			Expect(uidB()).NotTo(BeEmpty())
			Eventually(func() []string {
				files, _ := filepath.Glob(filepath.Join(sockDir, ".claim-*.json"))
				var with []string
				for _, file := range files {
					if b, err := os.ReadFile(file); err == nil && strings.Contains(string(b), uidB()) {
						with = append(with, file)
					}
				}
				return with
			}).WithTimeout(30*time.Second).WithPolling(500*time.Millisecond).Should(BeEmpty(), "records naming %s", uidB())
		})

		It("(g) dra-x Running once capacity was freed", func(ctx SpecContext) {
			Eventually(f.PodStateOf(ctx, "default", "dra-x")).WithTimeout(90 * time.Second).WithPolling(500 * time.Millisecond).
				Should(framework.BeReadyOn(f.Node))
			if !freed.IsZero() {
				AddReportEntry("claim-to-Running: dra-x (busybox, claim of 1) Running, from dra-b's deletion",
					time.Since(freed).Round(100*time.Millisecond).String())
			}
		})

		It("(g) dra-x: one slot, held for its claim, its socket directory mounted", func(ctx SpecContext) {
			v, err := f.PodEnv(ctx, "default", "dra-x", "VHOSTMQ_QUEUE_SLOTS")
			Expect(err).NotTo(HaveOccurred())
			slots["dra-x"] = framework.SortedCSV(v)
			c, err := getClaimOf(ctx, "dra-x")
			Expect(err).NotTo(HaveOccurred())
			held, err := framework.Held(ctx, agent)
			Expect(err).NotTo(HaveOccurred())
			out, err := f.Kubectl(ctx, "exec", "dra-x", "--", "/bin/sh", "-c", "test -d /var/run/vhostmq/nic && echo dir")
			Expect(err).NotTo(HaveOccurred())
			Expect(fmt.Sprintf("slots=%d held=%t mount=%s", count(slots["dra-x"]),
				slots["dra-x"] != "" && framework.HeldBy(held, "claim/"+c.uid) == slots["dra-x"], out)).
				To(Equal("slots=1 held=true mount=dir"), "dra-x: VHOSTMQ_QUEUE_SLOTS %q, held %v", v, held)
		})
	})

	Context("(h) everything deleted: all capacity back, nothing left", func() {
		It("(h) the slice has 8 devices again", func(ctx SpecContext) {
			deleteOurs(ctx)
			Eventually(f.SliceNames(ctx, draDriver, f.Node)).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(HaveLen(8))
		})

		It("(h) node allocatable vhostmq.io/queue-pairs = 8", func(ctx SpecContext) {
			Eventually(f.NodeResource(ctx, f.Node, res)).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(HaveField("Allocatable", "8"))
		})

		It("(h) no reservation in the agent", func(ctx SpecContext) {
			Eventually(framework.ObserveHeld(ctx, agent)).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(BeEmpty())
		})

		It("(h) nothing in /var/run/vhostmq but api.sock", func() {
			Eventually(leftovers(sockDir, func(fi os.FileInfo) bool { return false })).WithTimeout(90 * time.Second).WithPolling(500 * time.Millisecond).
				Should(Equal([]string{filepath.Join(sockDir, "api.sock")}))
		})

		It("(h) no CDI spec of queues.vhostmq.io or vhostmq.io in the CDI folder", func() {
			Eventually(filesNamed("vhostmq", f.CDIDir)).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).
				Should(BeEmpty())
		})
	})

	// create -> Running of the same busybox pod asking 2 queue pairs either
	// way, one at a time on the idle node, interleaved rounds
	Context("(i) claim-to-Running vs device plugin: busybox pods asking 2 queue pairs", func() {
		It("(i) all pods ran (device plugin and DRA, VHOSTMQ_DRA_ROUNDS rounds each)", func(ctx SpecContext) {
			Expect(createTemplate(ctx, "qp2", slotRequest(2), numaConstraint())).To(Succeed())
			var dp, dra []time.Duration
			var failed []string
			for r := 1; r <= s.rounds; r++ {
				for _, run := range []struct {
					name string
					opt  libpod.Option
					to   *[]time.Duration
				}{
					{fmt.Sprintf("dp-t%d", r), libpod.WithQueuePairs(2), &dp},
					{fmt.Sprintf("dra-t%d", r), libpod.WithClaimTemplate("nic", "qp2"), &dra},
				} {
					t, err := timedRun(ctx, run.name, run.opt)
					if err != nil {
						failed = append(failed, err.Error())
						continue
					}
					*run.to = append(*run.to, t)
				}
			}
			AddReportEntry(fmt.Sprintf("(i) create -> Running, busybox asking 2 queue pairs, median of %d: device plugin", s.rounds), median(dp))
			AddReportEntry(fmt.Sprintf("(i) create -> Running, busybox asking 2 queue pairs, median of %d: DRA claim of 2 slot devices", s.rounds), median(dra))
			Expect(failed).To(BeEmpty())
		}, NodeTimeout(10*time.Minute))

		It("(i) all capacity back after (slice 8, allocatable 8, no reservation)", func(ctx SpecContext) {
			deleteOurs(ctx)
			Eventually(capacity(ctx, agent, func(devs []resourcev1.Device) string { return strconv.Itoa(len(devs)) })).
				WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).Should(Equal("slice 8, allocatable 8, held 0"))
		})
	})

	// The other device model: one device per NUMA node whose consumable
	// capacity queuePairs claims share (KEP-5075); the same checks, shorter
	Context("(j) helm upgrade to dra.devices=numa: a device per NUMA node with consumable capacity queuePairs", func() {
		caps := []struct {
			pod, template string
			n             int
		}{{"cap-a", "cq4", 4}, {"cap-b", "cq2", 2}}

		It("(j) helm upgrade --set dra.devices=numa", func(ctx SpecContext) {
			out, err := f.Helm(ctx, "upgrade", draRelease, f.Chart, "--namespace", f.Namespace, "--reuse-values",
				"--set", "dra.devices=numa", "--wait", "--timeout", "3m")
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(MatchRegexp(`(?m)^STATUS: deployed$`))
		}, NodeTimeout(4*time.Minute))

		It("(j) the slice: numa-0 only, capacity queuePairs 8, shareable", func(ctx SpecContext) {
			Eventually(numaSlice(ctx)).WithTimeout(90 * time.Second).WithPolling(500 * time.Millisecond).
				Should(Equal("numa-0 queuePairs=8 shareable=true"))
		})

		It("(j) device-plugin pod dp-c (2) Running", func(ctx SpecContext) {
			// cqN: one share of N queuePairs of a NUMA node's device
			for _, n := range []int64{4, 2, 1} {
				Expect(createTemplate(ctx, fmt.Sprintf("cq%d", n), shareRequest(n), nil)).To(Succeed())
			}
			_, err := f.CreatePod(ctx, libpod.New("dp-c", libpod.WithQueuePairs(2)))
			Expect(err).NotTo(HaveOccurred())
			Eventually(f.PodStateOf(ctx, "default", "dp-c")).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).
				Should(framework.BeReadyOn(f.Node))
			v, err := f.PodEnv(ctx, "default", "dp-c", "VHOSTMQ_QUEUE_SLOTS")
			Expect(err).NotTo(HaveOccurred())
			slots["dp-c"] = framework.SortedCSV(v)
		})

		It("(j) the slice's capacity drops to 6", func(ctx SpecContext) {
			Eventually(numaSlice(ctx)).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(Equal("numa-0 queuePairs=6 shareable=true"))
		})

		for i, c := range caps {
			It(fmt.Sprintf("(j) %s Running", c.pod), func(ctx SpecContext) {
				if i == 0 {
					t0 := time.Now()
					for _, d := range caps {
						_, err := f.CreatePod(ctx, libpod.New(d.pod, libpod.WithClaimTemplate("nic", d.template)))
						Expect(err).NotTo(HaveOccurred())
						created[d.pod] = t0
					}
				}
				Expect(created).To(HaveKey(c.pod), "%s was created", c.pod)
				Eventually(f.PodStateOf(ctx, "default", c.pod)).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).
					Should(framework.BeReadyOn(f.Node))
				AddReportEntry(fmt.Sprintf("(j) %s (a share of %d) create -> Running", c.pod, c.n), time.Since(created[c.pod]).Round(100*time.Millisecond).String())
			})
		}

		for _, c := range caps {
			It(fmt.Sprintf("(j) %s: one share of numa-0 consuming %d queuePairs", c.pod, c.n), func(ctx SpecContext) {
				cl, err := getClaimOf(ctx, c.pod)
				Expect(err).NotTo(HaveOccurred())
				claims[c.pod] = cl
				GinkgoWriter.Printf("%s: allocation %s\n", c.pod, strings.Join(cl.shares, "; "))
				Expect(strings.Join(cl.shares, ";")).To(Equal(fmt.Sprintf("numa-0 %d share=true", c.n)))
			})

			It(fmt.Sprintf("(j) %s: the agent holds %d slots for claim/<uid> = VHOSTMQ_QUEUE_SLOTS", c.pod, c.n), func(ctx SpecContext) {
				Expect(claims).To(HaveKey(c.pod))
				v, err := f.PodEnv(ctx, "default", c.pod, "VHOSTMQ_QUEUE_SLOTS")
				Expect(err).NotTo(HaveOccurred())
				slots[c.pod] = framework.SortedCSV(v)
				held, err := framework.Held(ctx, agent)
				Expect(err).NotTo(HaveOccurred())
				Expect(fmt.Sprintf("%s n=%d", framework.HeldBy(held, "claim/"+claims[c.pod].uid), count(slots[c.pod]))).
					To(Equal(fmt.Sprintf("%s n=%d", slots[c.pod], c.n)))
			})

			It(fmt.Sprintf("(j) %s: its slots are on both CPUs", c.pod), func() {
				Expect(slots[c.pod]).NotTo(BeEmpty())
				cpus := map[string]bool{}
				for _, id := range strings.Split(slots[c.pod], ",") {
					cpu, _, _ := strings.Cut(id, "-")
					cpus[cpu] = true
				}
				Expect(cpus).To(HaveLen(2), "the CPUs of %s", slots[c.pod])
			})
		}

		It("(j) from the agent: 8 slots held, each once", func(ctx SpecContext) {
			held, err := framework.Held(ctx, agent)
			Expect(err).NotTo(HaveOccurred())
			GinkgoWriter.Printf("held: %v\n", held)
			owners := allocOwners(held)
			Expect(owners).To(HaveLen(1), "dp-c's allocation")
			want := map[string]string{}
			n := 0
			for pod, owner := range map[string]string{"dp-c": owners[0], "cap-a": "claim/" + claims["cap-a"].uid, "cap-b": "claim/" + claims["cap-b"].uid} {
				Expect(slots[pod]).NotTo(BeEmpty(), "%s's slots", pod)
				for _, id := range strings.Split(slots[pod], ",") {
					want[id] = owner
					n++
				}
			}
			Expect(want).To(HaveLen(n), "no slot in two pods: %v", slots)
			Expect(held).To(And(HaveLen(8), Equal(want)))
		})

		It("(j) cap-x (one more queue pair) Pending: the claim cannot be allocated", func(ctx SpecContext) {
			_, err := f.CreatePod(ctx, libpod.New("cap-x", libpod.WithClaimTemplate("nic", "cq1")))
			Expect(err).NotTo(HaveOccurred())
			Eventually(lastEvent(ctx, "cap-x", "FailedScheduling")).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(ContainSubstring("cannot allocate all claims"))
		})

		// as (i): one at a time on the idle node (dp-c's slots come back when
		// the device plugin reclaims its allocation; 2 of the 6 others are
		// enough)
		It("(j) pods with a share of 2 ran one at a time (VHOSTMQ_DRA_ROUNDS)", func(ctx SpecContext) {
			Expect(f.DeletePods(ctx, "default", 60*time.Second, "cap-x", "dp-c", "cap-a", "cap-b")).To(Succeed())
			var numa []time.Duration
			var failed []string
			for r := 1; r <= s.rounds; r++ {
				t, err := timedRun(ctx, fmt.Sprintf("cap-t%d", r), libpod.WithClaimTemplate("nic", "cq2"))
				if err != nil {
					failed = append(failed, err.Error())
					continue
				}
				numa = append(numa, t)
			}
			AddReportEntry(fmt.Sprintf("(j) create -> Running with dra.devices=numa, a share of 2 queuePairs, median of %d", s.rounds), median(numa))
			Expect(failed).To(BeEmpty())
		}, NodeTimeout(10*time.Minute))

		It("(j) all capacity back (numa-0 8, allocatable 8, no reservation)", func(ctx SpecContext) {
			for _, t := range []string{"cq4", "cq2", "cq1"} {
				Expect(ignoreNotFound(f.Client.ResourceV1().ResourceClaimTemplates("default").Delete(ctx, t, metav1.DeleteOptions{}))).To(Succeed())
			}
			Eventually(capacity(ctx, agent, describeNUMA)).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(Equal("slice numa-0 queuePairs=8 shareable=true, allocatable 8, held 0"))
		})
	})
})

// installText is the install's spec: the others skip when it failed.
const installText = "(a) helm install --wait: STATUS deployed"

// count is the number of items of a comma-separated list.
func count(csv string) int {
	if csv == "" {
		return 0
	}
	return len(strings.Split(csv, ","))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// canI asks the API server whether the service account user may do ra
// (kubectl auth can-i --as=USER: the user with its service-account groups
// and system:authenticated, which impersonation adds). A
// SubjectAccessReview needs no discovery of the resource: the test cluster
// has no KubeVirt CRDs.
func canI(ctx SpecContext, user string, ra authorizationv1.ResourceAttributes) (bool, error) {
	ns := strings.Split(user, ":")
	groups := []string{"system:serviceaccounts", "system:authenticated"}
	if len(ns) == 4 {
		groups = append(groups, "system:serviceaccounts:"+ns[2])
	}
	r, err := f.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &ra},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return r.Status.Allowed, nil
}

// tokenClaims are the JWT claims the host-token check reads.
type tokenClaims struct {
	Sub        string `json:"sub"`
	Exp        int64  `json:"exp"`
	Iat        int64  `json:"iat"`
	Kubernetes struct {
		Pod struct {
			Name string `json:"name"`
		} `json:"pod"`
	} `json:"kubernetes.io"`
}

// jwtClaims reads a service-account token file: its payload and the file's
// permission bits.
func jwtClaims(file string) (tokenClaims, os.FileMode, error) {
	var c tokenClaims
	fi, err := os.Stat(file)
	if err != nil {
		return c, 0, err
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return c, 0, err
	}
	parts := strings.Split(strings.TrimSpace(string(b)), ".")
	if len(parts) != 3 {
		return c, 0, fmt.Errorf("%s: not a JWT (%d parts)", file, len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return c, 0, fmt.Errorf("%s: %w", file, err)
	}
	return c, fi.Mode().Perm(), json.Unmarshal(payload, &c)
}

// nadConfig is a NetworkAttachmentDefinition's spec.config, parsed.
func nadConfig(nad *unstructured.Unstructured) (map[string]any, error) {
	conf, _, err := unstructured.NestedString(nad.Object, "spec", "config")
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal([]byte(conf), &m); err != nil {
		return nil, fmt.Errorf("the config of NAD %s/%s: %w", nad.GetNamespace(), nad.GetName(), err)
	}
	return m, nil
}

// dryRunPod sends a server dry run of a pod naming networks and says what
// came back: "mutated: vhostmq.io/queues=..." (the webhook set its
// annotation), "webhook call failed: ..." (failurePolicy Fail, the webhook
// not reachable), "untouched", or "error: ...".
func dryRunPod(ctx SpecContext, networks string) string {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "wh-probe", Namespace: "default",
			Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": networks}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: f.Image}}},
	}
	got, err := f.Client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err != nil && strings.Contains(err.Error(), `failed calling webhook "pods.vhostmq.io"`):
		return "webhook call failed: " + err.Error()
	case err != nil:
		return "error: " + err.Error()
	}
	if q, ok := got.Annotations["vhostmq.io/queues"]; ok {
		return "mutated: vhostmq.io/queues=" + q
	}
	return "untouched"
}

func nodeIP(ctx SpecContext) (string, error) {
	n, err := f.Client.CoreV1().Nodes().Get(ctx, f.Node, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address, nil
		}
	}
	return "", fmt.Errorf("node %s has no InternalIP: %v", f.Node, n.Status.Addresses)
}

// intAttr is a device's integer attribute (-1 when it has none).
func intAttr(d resourcev1.Device, name resourcev1.QualifiedName) int64 {
	if a, ok := d.Attributes[name]; ok && a.IntValue != nil {
		return *a.IntValue
	}
	return -1
}

// allocOwners are the device plugin's reservations among held.
func allocOwners(held map[string]string) []string {
	var owners []string
	for _, o := range held {
		if strings.HasPrefix(o, "alloc/") && !slices.Contains(owners, o) {
			owners = append(owners, o)
		}
	}
	return owners
}

// slotRequest: n slot devices (the default device model).
func slotRequest(n int64) resourcev1.ExactDeviceRequest {
	return resourcev1.ExactDeviceRequest{DeviceClassName: draDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: n}
}

// shareRequest: one share of n queuePairs of a NUMA node's device
// (dra.devices=numa).
func shareRequest(n int64) resourcev1.ExactDeviceRequest {
	return resourcev1.ExactDeviceRequest{DeviceClassName: draDriver, Capacity: &resourcev1.CapacityRequirements{
		Requests: map[resourcev1.QualifiedName]resource.Quantity{"queuePairs": *resource.NewQuantity(n, resource.DecimalSI)}}}
}

// numaConstraint: the request's devices on one NUMA node.
func numaConstraint() []resourcev1.DeviceConstraint {
	attr := resourcev1.FullyQualifiedName(draDriver + "/numaNode")
	return []resourcev1.DeviceConstraint{{Requests: []string{"queues"}, MatchAttribute: &attr}}
}

// createTemplate (re)creates the ResourceClaimTemplate name in default with
// one request "queues".
func createTemplate(ctx SpecContext, name string, req resourcev1.ExactDeviceRequest, cons []resourcev1.DeviceConstraint) error {
	tc := f.Client.ResourceV1().ResourceClaimTemplates("default")
	if err := ignoreNotFound(tc.Delete(ctx, name, metav1.DeleteOptions{})); err != nil {
		return err
	}
	_, err := tc.Create(ctx, &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests:    []resourcev1.DeviceRequest{{Name: "queues", Exactly: &req}},
			Constraints: cons,
		}}},
	}, metav1.CreateOptions{})
	return err
}

// guestPod is a QEMU pod whose claim (from g.template) gives its NIC: the
// launcher reads the socket from the claim's metadata file and the queue
// count from VHOSTMQ_QUEUE_SLOTS (CDI env); the guest pings its peer on.
func guestPod(dir string, g draGuest) *corev1.Pod {
	return libpod.New(g.pod, libpod.WithClaimTemplate("nic", g.template),
		libpod.WithNetworkSelections(libpod.NetworkSelection{Name: draNAD, Interface: "net1", MAC: g.mac}),
		libpod.WithQEMU(f.QEMU(g.pod, dir, libpod.NICFromDRAMetadata(draMetadata, g.mac),
			fmt.Sprintf("vmq.ip=%s/24 vmq.peer=%s vmq.role=pinger vmq.duration=600 vmq.interval=0.5", g.ip, g.peer))))
}

// claimOfPod is what the specs read of a pod's claim.
type claimOfPod struct {
	name, uid string
	devices   []string // our driver's allocated devices, sorted
	shares    []string // "device consumed-queuePairs share=<has a shareID>" per result
}

func getClaimOf(ctx SpecContext, pod string) (claimOfPod, error) {
	name, err := f.ClaimOf(ctx, "default", pod, "nic")
	if err != nil {
		return claimOfPod{}, err
	}
	if name == "" {
		return claimOfPod{}, fmt.Errorf("pod %s has no claim for its entry nic", pod)
	}
	c, err := f.Client.ResourceV1().ResourceClaims("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return claimOfPod{}, err
	}
	out := claimOfPod{name: name, uid: string(c.UID)}
	if c.Status.Allocation == nil {
		return out, fmt.Errorf("claim %s of %s is not allocated", name, pod)
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != draDriver {
			continue
		}
		out.devices = append(out.devices, r.Device)
		q := r.ConsumedCapacity["queuePairs"]
		out.shares = append(out.shares, fmt.Sprintf("%s %s share=%t", r.Device, q.String(), r.ShareID != nil))
	}
	slices.Sort(out.devices)
	return out, nil
}

func conditions(cs []metav1.Condition) string {
	var s []string
	for _, c := range cs {
		s = append(s, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	return strings.Join(s, ",")
}

func rawData(d resourcev1.AllocatedDeviceStatus) string {
	if d.Data == nil {
		return "none"
	}
	return string(d.Data.Raw)
}

// lastEvent observes the last event message of an object in default with
// one reason ("" when none).
func lastEvent(ctx SpecContext, object, reason string) func() (string, error) {
	obs := f.EventMessages(ctx, "default", object, reason)
	return func() (string, error) {
		msgs, err := obs()
		if err != nil || len(msgs) == 0 {
			return "", err
		}
		return msgs[len(msgs)-1], nil
	}
}

// draState is the node pod's dra container: its ID, restarts, readiness.
type draState struct {
	ID       string
	Restarts int32
	Ready    bool
}

func draContainer(ctx SpecContext) func() (draState, error) {
	return func() (draState, error) {
		l, err := f.Client.CoreV1().Pods(f.Namespace).List(ctx, metav1.ListOptions{LabelSelector: nodeSelector})
		if err != nil {
			return draState{}, err
		}
		for _, p := range l.Items {
			for _, c := range p.Status.ContainerStatuses {
				if c.Name == "dra" {
					return draState{ID: c.ContainerID, Restarts: c.RestartCount, Ready: c.Ready}, nil
				}
			}
		}
		return draState{}, fmt.Errorf("no dra container in the pods of %s", nodeSelector)
	}
}

// filesNamed observes the files and folders under roots whose name
// contains part.
func filesNamed(part string, roots ...string) func() []string {
	return func() []string {
		found := []string{}
		for _, root := range roots {
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && p != root && strings.Contains(d.Name(), part) {
					found = append(found, p)
				}
				return nil
			})
		}
		return found
	}
}

// capacity observes the slice (as describe gives it), the node's
// allocatable queue pairs and the agent's reservations in one line.
func capacity(ctx SpecContext, agent agentv1.AgentClient, describe func([]resourcev1.Device) string) func() (string, error) {
	return func() (string, error) {
		devs, err := f.SliceDevices(ctx, draDriver, f.Node)
		if err != nil {
			return "", err
		}
		r, err := f.NodeResource(ctx, f.Node, libpod.QueuePairs)()
		if err != nil {
			return "", err
		}
		held, err := framework.Held(ctx, agent)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("slice %s, allocatable %s, held %d", describe(devs), r.Allocatable, len(held)), nil
	}
}

// describeNUMA: "name queuePairs=N shareable=B" per device.
func describeNUMA(devs []resourcev1.Device) string {
	var s []string
	for _, d := range devs {
		c := d.Capacity["queuePairs"]
		s = append(s, fmt.Sprintf("%s queuePairs=%s shareable=%t", d.Name, c.Value.String(),
			d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations))
	}
	return strings.Join(s, "; ")
}

func numaSlice(ctx SpecContext) func() (string, error) {
	return func() (string, error) {
		devs, err := f.SliceDevices(ctx, draDriver, f.Node)
		return describeNUMA(devs), err
	}
}

// timedRun creates a busybox pod with opt and returns the time from its
// creation to Running (at most 60 s, polled every 50 ms); the pod is
// deleted after.
func timedRun(ctx SpecContext, name string, opt libpod.Option) (time.Duration, error) {
	t0 := time.Now()
	if _, err := f.CreatePod(ctx, libpod.New(name, opt)); err != nil {
		return 0, err
	}
	var last framework.PodState
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		s, err := f.PodStateOf(ctx, "default", name)()
		last = s
		return err == nil && s.Phase == corev1.PodRunning, nil
	})
	took := time.Since(t0)
	derr := f.DeletePods(ctx, "default", 60*time.Second, name)
	if err != nil {
		return 0, fmt.Errorf("%s not Running within 60 s: %+v", name, last)
	}
	GinkgoWriter.Printf("%s: create -> Running %.2f s\n", name, took.Seconds())
	return took, derr
}

func median(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var all []string
	for _, d := range ds {
		all = append(all, fmt.Sprintf("%.2f", d.Seconds()))
	}
	return fmt.Sprintf("%.2f s (%s)", s[(len(s)-1)/2].Seconds(), strings.Join(all, " "))
}

// draDiagnostics adds the DRA side to a failed spec's diagnostics: claims,
// slices, the agent's capacity and ports, the node pod's containers' logs,
// multus-lite's log, the guests' consoles, the kubelet's DRA lines, the
// node's folders.
func draDiagnostics(f *framework.Framework, agent agentv1.AgentClient, r SpecReport) {
	dir := f.DiagnosticsDir(r)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(bg(), 60*time.Second)
	defer cancel()
	var b strings.Builder
	section := func(name, out string, err error) {
		fmt.Fprintf(&b, "=== %s\n%s\n", name, strings.TrimRight(out, "\n"))
		if err != nil {
			fmt.Fprintf(&b, "--- error: %v\n", err)
		}
	}
	out, err := f.Kubectl(ctx, "get", "resourceclaims", "-A", "-o", "yaml")
	section("claims", out, err)
	out, err = f.Kubectl(ctx, "get", "resourceslices", "-o", "yaml")
	section("slices", out, err)
	if c, err := agent.GetCapacity(ctx, &agentv1.GetCapacityRequest{}); err == nil {
		section("agent capacity", protojson.Format(c), nil)
	} else {
		section("agent capacity", "", err)
	}
	if l, err := agent.ListPorts(ctx, &agentv1.ListPortsRequest{}); err == nil {
		section("agent ports", protojson.Format(l), nil)
	} else {
		section("agent ports", "", err)
	}
	for _, c := range []string{"dataplane", "deviceplugin", "dra"} {
		out, err = f.Kubectl(ctx, "-n", f.Namespace, "logs", "-l", nodeSelector, "-c", c, "--tail", "100")
		section(c+" log", out, err)
	}
	for _, g := range draGuests {
		out, err = f.Kubectl(ctx, "logs", g.pod, "--tail", "20")
		section(g.pod+" log", out, err)
		section(g.pod+" serial", f.Guest(g.pod).Tail(25)(), nil)
	}
	out, err = framework.Run(ctx, "tail", "-n", "40", f.MultusLog)
	section("multus-lite log", out, err)
	out, err = framework.Run(ctx, "sh", "-c", `grep -iE 'dra|claim' "$0" | tail -n 60 | cut -c1-400`, filepath.Join(f.ClusterLogs, "kubelet.log"))
	section("kubelet DRA lines", out, err)
	out, err = framework.Run(ctx, "find", sockDir, f.CDIDir, "-maxdepth", "2", "-ls")
	section("folders", out, err)
	_ = os.WriteFile(filepath.Join(dir, "dra.txt"), []byte(b.String()), 0o644)
}
