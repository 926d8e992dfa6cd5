//go:build e2e

package e2e

// vhostmq as a user installs it, on real KubeVirt v1.7.0 (the test bed of
// hack/kubevirt: testbed.sh up), ported from the checks of
// hack/kubevirt/test-vm.sh, which now does the bring-up only (the images,
// the test bed's own binding and CNI link taken out)
// and runs these specs (label kubevirt). The chain:
//
//	helm install charts/vhostmq --wait (DaemonSet: init container installs
//	vhostmq-cni and its kubeconfig; webhook Deployment + Service +
//	MutatingWebhookConfiguration; NAD vhostmq-system/vhu-net; the
//	post-install hook registers the binding in the KubeVirt CR) -> the
//	webhook raises the virt-launcher pod's vhostmq.io/queue-pairs to the
//	VM's queue pairs -> kubelet + device plugin allocate slots ->
//	multus-lite calls vhostmq-cni -> KubeVirt's network-info -> the binding
//	sidecar adds the vhost-user NIC -> libvirt + QEMU 10 listen, the
//	dataplane dials.
//
// Then traffic between two VMs (vm1: 4 vCPUs, iperf3 server; vm2: 2 vCPUs,
// rate-limited, pings and runs iperf3 both ways, spoofs a MAC), a
// migration that cannot leave the node (the second node cordoned), with
// two nodes a live migration of vm3 while vm4 streams a file to it, the
// webhook on more pod shapes, helm upgrade to a rebuilt image while vm2
// pings vm1, the VMs deleted, helm uninstall. The specs run in order and go
// on after a failure, as the script did. A VMI that reached Running and
// then ended fails the spec during which it ended (AfterEach), with its
// status, events and the dataplane's log in LogDir/<vm>-replaced.txt and
// the launchers' logs beside it. The one exception, as in the script: a
// guest kernel reporting a stalled CPU before the traffic step (TCG
// starving a vCPU on the busy host) has both VMs created again, at most
// twice.

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"libvirt.org/go/libvirtxml"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/test/e2e/framework"
	"github.com/vhostmq/vhostmq/test/e2e/libpod"
	"github.com/vhostmq/vhostmq/test/e2e/libvmi"
)

const (
	kvNS       = "vhostmq-kv-test" // the VMs' namespace
	kvRelease  = "vhostmq"
	kvNodeSel  = "app.kubernetes.io/component=node" // the chart's node pods
	kvDevinfo  = "/var/run/k8s.cni.cncf.io/devinfo"
	kvRate     = "100M" // vm2's limit both ways (#27)
	kvRateBPS  = 100000000
	kvStalled  = `rcu: INFO: rcu_(preempt|sched) detected stalls|timer wakeup didn't happen`
	kvTCGAbort = "iotlb_to_section: Assertion"
	kvVirsh    = "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock"
)

// kvVM is one test VM: what it is made of and what the specs learnt of it.
type kvVM struct {
	name   string
	cores  uint32
	mem    string
	queues int
	args   string // the guest's vmq.* keys (hack/guest/init)
	rate   string // both ways, "" for none

	created time.Time
	pod     string        // its running launcher pod
	uid     string        // its VMI's UID once Running ("" again once ended or deleted)
	port    *agentv1.Port // its port, as the boot found it
	slots   string        // the compute container's VHOSTMQ_QUEUE_SLOTS, sorted
}

func (v *kvVM) vm(k *framework.KubeVirt) *libvmi.VirtualMachine {
	opts := []libvmi.Option{
		libvmi.WithNamespace(kvNS), libvmi.WithCores(v.cores), libvmi.WithMemory(v.mem),
		libvmi.WithNetworkInterfaceMultiQueue(true),
		libvmi.WithVhostmqInterface("fast", f.Namespace+"/vhu-net"),
		libvmi.WithKernelBoot(k.GuestImage, "console=ttyS0 panic=-1 loglevel=4 vmq.name="+v.name+" "+v.args+" vmq.duration=3000"+overlayMTU(k)),
		libvmi.WithAnnotation("vhostmq.io/polling", "adaptive"),
		libvmi.WithTerminationGracePeriod(5),
	}
	if v.rate != "" {
		opts = append(opts, libvmi.WithBandwidth(v.rate))
	}
	return libvmi.New(v.name, opts...)
}

var _ = Describe("KubeVirt", Ordered, ContinueOnFailure, Label("kubevirt"), func() {
	var (
		k      *framework.KubeVirt
		agent  agentv1.AgentClient
		follow context.Context // the log followers' (they outlive a spec)
		s      kvSuite
	)
	vm1 := &kvVM{name: "vm1", cores: 4, mem: "1Gi", queues: 4,
		args: "vmq.ip=10.0.0.1/24 vmq.queues=4 vmq.role=server vmq.carrierwatch=1"}
	vm2 := &kvVM{name: "vm2", cores: 2, mem: "512Mi", queues: 2, rate: kvRate,
		args: "vmq.ip=10.0.0.2/24 vmq.peer=10.0.0.1 vmq.queues=2 vmq.role=client,spoof,pinger vmq.interval=0.2 vmq.pings=10 " +
			"vmq.streams=16 vmq.time=5 vmq.carrierwatch=1 vmq.victim=10.0.0.9 vmq.victimmac=02:00:00:00:00:99"}
	vm3 := &kvVM{name: "vm3", cores: 1, mem: "512Mi", queues: 1,
		args: "vmq.ip=10.0.0.3/24 vmq.peer=10.0.0.4 vmq.queues=1 vmq.role=recvfile,idle vmq.fileport=5000 vmq.hashto=1"}
	vm4 := &kvVM{name: "vm4", cores: 1, mem: "768Mi", queues: 1} // args in BeforeAll (the file's size)
	vms := []*kvVM{vm1, vm2, vm3, vm4}

	BeforeAll(func(ctx SpecContext) {
		// a cluster without KubeVirt (hack/cluster/e2e.sh without a label
		// filter): nothing to test here; test-vm.sh checks the test bed first
		if _, err := f.Client.Discovery().ServerResourcesForGroupVersion("kubevirt.io/v1"); err != nil {
			Skip("KubeVirt is not installed (hack/kubevirt/testbed.sh up): " + err.Error())
		}
		var err error
		k, err = framework.NewKubeVirt(f)
		Expect(err).NotTo(HaveOccurred())
		a, conn, err := f.Agent()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(conn.Close)
		agent = a
		var cancel context.CancelFunc
		follow, cancel = context.WithCancel(bg())
		DeferCleanup(cancel)
		s = kvSuite{k: k, agent: agent, follow: follow, followed: map[string]bool{}}
		vm4.args = fmt.Sprintf("vmq.ip=10.0.0.4/24 vmq.peer=10.0.0.3 vmq.queues=1 vmq.role=sendfile,idle vmq.filemb=%d "+
			"vmq.fileport=5000 vmq.interval=0.01 vmq.tail=5 vmq.hashto=1", k.MigrateMB)
		_, err = f.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: kvNS, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred())
		}
		DeferCleanup(s.printTimings)
	})

	// A VMI that reached Running and ended since fails the spec in which it
	// ended (once: the specs after fail on their own if they needed it).
	AfterEach(func(ctx SpecContext) {
		for _, v := range vms {
			if err := s.vmiEnded(ctx, v); err != nil {
				v.uid = ""
				Fail(err.Error())
			}
		}
	})

	Context("helm install vhostmq (the chart, the locally built image)", func() {
		It("helm install --wait", func(ctx SpecContext) {
			args := []string{"install", kvRelease, f.Chart, "--namespace", f.Namespace, "--create-namespace", "--wait", "--timeout", "5m"}
			for _, v := range s.helmValues() {
				args = append(args, "--set", v)
			}
			out, err := f.Helm(ctx, args...)
			_ = os.WriteFile(filepath.Join(f.LogDir, "helm-install.log"), []byte(out+"\n"), 0o644)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(MatchRegexp(`(?m)^STATUS: deployed$`))
		})

		It("DaemonSet pod Ready (dataplane, deviceplugin, cni)", func(ctx SpecContext) {
			Eventually(f.PodsReady(ctx, f.Namespace, kvNodeSel)).WithTimeout(90 * time.Second).WithPolling(time.Second).
				Should(Equal("all ready"))
			// the dataplanes' logs, kept whole: the stall watchdog, the
			// handoff and the migration's ring positions are read from them
			s.followDataplane(ctx, f.Node)
			if k.Node2 != "" {
				s.followDataplane(ctx, k.Node2)
			}
		})

		It("node allocatable vhostmq.io/queue-pairs = 8 (2 CPUs x 4 slots)", func(ctx SpecContext) {
			Eventually(f.NodeResource(ctx, f.Node, libpod.QueuePairs)).WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).
				Should(HaveField("Allocatable", "8"))
		})

		It("the init container installed vhostmq-cni into the node's CNI bin dir (same bytes as the image's)", func() {
			installed, err := os.ReadFile(filepath.Join(k.NodeCNIBin, "vhostmq-cni"))
			Expect(err).NotTo(HaveOccurred())
			built, err := os.ReadFile(filepath.Join(k.BinDir, "vhostmq-cni"))
			Expect(err).NotTo(HaveOccurred())
			Expect(installed).To(Equal(built), "%s/vhostmq-cni (%d bytes) against %s/vhostmq-cni (%d bytes)",
				k.NodeCNIBin, len(installed), k.BinDir, len(built))
		})

		It("its kubeconfig and token are on the node (vhostmq.d/)", func() {
			for _, name := range []string{"vhostmq.kubeconfig", "token"} {
				fi, err := os.Stat(filepath.Join(k.NodeCNIConf, "vhostmq.d", name))
				Expect(err).NotTo(HaveOccurred())
				Expect(fi.Size()).To(BeNumerically(">", 0), name)
			}
		})

		It("webhook Deployment Available", func(ctx SpecContext) {
			Eventually(func() (string, error) {
				d, err := f.Client.AppsV1().Deployments(f.Namespace).Get(ctx, kvRelease+"-webhook", metav1.GetOptions{})
				if err != nil {
					return "", err
				}
				for _, c := range d.Status.Conditions {
					if c.Type == appsv1.DeploymentAvailable {
						return string(c.Status) + " " + c.Message, nil
					}
				}
				return "no Available condition", nil
			}).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(HavePrefix("True"))
		})

		It("MutatingWebhookConfiguration vhostmq-webhook", func(ctx SpecContext) {
			_, err := f.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, kvRelease+"-webhook", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
		})

		It("the post-install hook registered the binding in the KubeVirt CR", func(ctx SpecContext) {
			Expect(k.BindingImage(ctx)).To(Equal(k.SidecarImage))
		})

		It("with two nodes: each node's dataplane has the other's VTEP, its InternalIP from the Node objects (vxlan uplink)", func(ctx SpecContext) {
			s.needNode2()
			ip1, ip2 := internalIP(ctx, k.Node), internalIP(ctx, k.Node2)
			a2, closeConn, err := k.AgentOn(k.Node2)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(closeConn)
			for _, c := range []struct {
				a         agentv1.AgentClient
				own, peer string
			}{{agent, ip1, ip2}, {a2, ip2, ip1}} {
				Eventually(func() ([]string, error) {
					o, err := c.a.GetOverlay(ctx, &agentv1.GetOverlayRequest{})
					var vteps []string
					for _, v := range o.GetVteps() {
						vteps = append(vteps, v.GetAddress())
					}
					return append(vteps, "local "+o.GetLocal()), err
				}).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(ConsistOf(c.peer, fmt.Sprintf("local %s:4789", c.own)))
			}
		})

		It("NAD vhostmq-system/vhu-net with resourceName vhostmq.io/queue-pairs", func(ctx SpecContext) {
			nad, err := k.Dyn.Resource(framework.NADResource).Namespace(f.Namespace).Get(ctx, "vhu-net", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(nad.GetAnnotations()).To(HaveKeyWithValue("k8s.v1.cni.cncf.io/resourceName", string(libpod.QueuePairs)))
		})
	})

	Context("vm1 and vm2 on vhostmq", func() {
		s.bootSpecs(vm1, false)
		s.bootSpecs(vm2, false)

		// A guest whose CPU stalled before the traffic step is no test of
		// the NIC: both VMs are created again (at most twice) and checked
		// as above; a stall that starts later fails as anything else would.
		It("vm1 and vm2: no guest CPU stalled before the traffic step (created again at most twice)", func(ctx SpecContext) {
			for try := 1; ; try++ {
				stalled := s.stalled(ctx, vm1, vm2)
				if len(stalled) == 0 {
					return
				}
				Expect(try).To(BeNumerically("<=", 2), "guests with a stalled CPU after two re-creations: %v", stalled)
				AddReportEntry("VMs created again after a guest CPU stall", fmt.Sprintf("%d: %v", try, stalled))
				for _, v := range []*kvVM{vm1, vm2} {
					v.uid = ""
					_ = os.Rename(k.ConsoleFile(v.name), fmt.Sprintf("%s.stalled-%d", k.ConsoleFile(v.name), try))
				}
				Expect(k.DeleteVMs(ctx, kvNS, 4*time.Minute, vm1.name, vm2.name)).To(Succeed())
				for _, v := range []*kvVM{vm1, vm2} {
					s.boot(ctx, v)
				}
			}
		})

		It("kubectl exec the node pod -c dataplane -- vhostmqctl port list shows both ports", func(ctx SpecContext) {
			Expect(vm1.port).NotTo(BeNil(), "vm1's port")
			Expect(vm2.port).NotTo(BeNil(), "vm2's port")
			pod, err := s.nodePod(ctx, f.Node)
			Expect(err).NotTo(HaveOccurred())
			out, err := f.Kubectl(ctx, "-n", f.Namespace, "exec", pod, "-c", "dataplane", "--", "vhostmqctl", "port", "list")
			Expect(err).NotTo(HaveOccurred())
			GinkgoWriter.Println(out)
			Expect(out).To(And(ContainSubstring(vm1.port.GetSpec().GetId()), ContainSubstring(vm2.port.GetSpec().GetId())))
		})
	})

	Context("vm2 -> vm1: ping and iperf3 both ways", func() {
		It("vm2 reaches vm1", func(ctx SpecContext) {
			Eventually(s.await(ctx, vm2, "reach")).WithTimeout(150 * time.Second).WithPolling(time.Second).
				Should(HaveKeyWithValue("ok", "1"))
			s.timing("vm2 created -> its guest reaches vm1", time.Since(vm2.created))
		})

		It("ping vm2 -> vm1 answered", func(ctx SpecContext) {
			Eventually(s.await(ctx, vm2, "role-done", "role=client")).WithTimeout(240 * time.Second).WithPolling(time.Second).
				ShouldNot(BeNil())
			ping := f.Guest(vm2.name).Last("ping")
			Expect(ping.Int("received")).To(BeNumerically(">", 0), "ping: %v", ping)
			s.note("ping vm2 -> vm1", fmt.Sprintf("%s/%s replies, rtt avg %s ms", ping["received"], ping["sent"], ping["rtt_avg_ms"]))
		})

		for _, d := range []struct{ dir, arrow, limit string }{{"forward", "->", "egress"}, {"reverse", "<-", "ingress"}} {
			It(fmt.Sprintf("iperf3 %s (vm2 %s vm1, -P 16) ran", d.dir, d.arrow), func() {
				r := f.Guest(vm2.name).Last("iperf", "dir="+d.dir)
				Expect(r).NotTo(BeNil(), "no iperf dir=%s line from vm2", d.dir)
				s.note("iperf3 -P 16 "+d.dir+" (Gbit/s)", r["gbps"])
				Expect(r["rc"]).To(Equal("0"), "iperf %v", r)
				Expect(strconv.ParseFloat(r["gbps"], 64)).To(BeNumerically(">", 0), "iperf %v", r)
			})

			// vm2's annotations limit it both ways: forward is its egress
			// (shaped), reverse its ingress (policed); iperf3 counts TCP
			// payload, below the Ethernet bytes the limit counts
			It(fmt.Sprintf("iperf3 %s held to vm2's %s %s limit (+5 %%)", d.dir, kvRate, d.limit), func() {
				r := f.Guest(vm2.name).Last("iperf", "dir="+d.dir)
				Expect(r).NotTo(BeNil(), "no iperf dir=%s line from vm2", d.dir)
				g, err := strconv.ParseFloat(r["gbps"], 64)
				Expect(err).NotTo(HaveOccurred(), "iperf %v", r)
				Expect(g).To(And(BeNumerically(">", 0), BeNumerically("<=", kvRateBPS*1.05/1e9)), "Gbit/s %s (vm2 -> vm1 %s)", d.dir, d.arrow)
			})
		}

		It("vm2's port has the VMI's bandwidth annotations as its limits, vm1's none", func(ctx SpecContext) {
			Expect(s.bandwidth(ctx, vm2)).To(Equal([2]uint64{kvRateBPS, kvRateBPS}), "vm2 ingress, egress bits/s")
			Expect(s.bandwidth(ctx, vm1)).To(Equal([2]uint64{0, 0}), "vm1 ingress, egress bits/s")
		})

		It("vm2's port shaped its egress and policed its ingress", func(ctx SpecContext) {
			st, err := s.stats(ctx, vm2)
			Expect(err).NotTo(HaveOccurred())
			var shaped, policed uint64
			for _, q := range st.GetQueues() {
				shaped += q.GetShaped()
				policed += q.GetDrops().GetRateLimited()
			}
			s.note("vm2's port: bursts shaped, frames policed", fmt.Sprintf("%d, %d", shaped, policed))
			Expect([]uint64{shaped, policed}).To(HaveEach(BeNumerically(">", 0)), "bursts shaped, frames dropped as rate_limited")
		})
	})

	// port security on the VMs' ports (the VMI's MAC; no IPAM here, so MACs
	// only): vm2's pings to vm1 from a MAC not its own get no reply and are
	// counted at vm2's port; its own before and after are answered
	Context("port security", func() {
		It("port security: vm2's pings from a MAC not its VMI's got no reply, its own before and after did", func(ctx SpecContext) {
			Eventually(s.await(ctx, vm2, "role-done", "role=spoof")).WithTimeout(120 * time.Second).WithPolling(time.Second).
				ShouldNot(BeNil())
			g := f.Guest(vm2.name)
			own, victim, after := g.Last("spoof", "step=own"), g.Last("spoof", "step=victim-mac"), g.Last("spoof", "step=after")
			s.note("vm2's pings answered (own MAC, from 02:00:00:00:00:99, own again; of 3)",
				fmt.Sprintf("%s, %s, %s", own["replies"], victim["replies"], after["replies"]))
			Expect(own.Int("replies")).To(BeNumerically(">", 0), "own MAC: %v", own)
			Expect(victim).To(HaveKeyWithValue("replies", "0"), "from another MAC")
			Expect(after.Int("replies")).To(BeNumerically(">", 0), "own MAC again: %v", after)
		})

		It("port security: vm2's port counted spoofed frames, vm1's none", func(ctx SpecContext) {
			sp2, sp1 := s.spoofed(ctx, vm2), s.spoofed(ctx, vm1)
			Expect(sp2).To(BeNumerically(">", 0), "spoofed drops at vm2's port")
			Expect(sp1).To(BeZero(), "spoofed drops at vm1's port")
		})
	})

	Context("every queue pair carried traffic", func() {
		It("no queue stalled (the stall watchdog healed none)", func() {
			Expect(s.dataplaneLines(regexp.MustCompile(`queue stalled`))).To(BeEmpty(),
				"the stall watchdog's messages and ring dumps are in %s/dataplane-*.log", f.LogDir)
		})

		for _, v := range []*kvVM{vm1, vm2} {
			It(v.name+": every queue the guest used (its own counters) was served on its pair, frames both ways", func(ctx SpecContext) {
				Expect(s.usedServed(ctx, v)).To(Succeed())
			})
		}

		It("vm1 guest MAC = its port's MAC (sidecar and CNI derive the same)", func() {
			Expect(vm1.port).NotTo(BeNil())
			link := f.Guest(vm1.name).Last("link")
			Expect(link["mac"]).NotTo(BeEmpty(), "the guest's link line: %v", link)
			Expect(strings.ToLower(link["mac"])).To(Equal(strings.ToLower(vm1.port.GetSpec().GetMac())))
		})
	})

	// How far a migration gets while the second node is cordoned (or there
	// is none): KubeVirt must see vm2 as live-migratable (the binding's
	// registration carries `migration`), accept the migration and build the
	// target pod as the webhook and the CNI need it; KubeVirt keeps a target
	// off its source's node (required anti-affinity), so the target pod
	// stays Pending. Cancelling must leave vm2 as it was.
	Context("live migration of vm2 (the second node cordoned: as far as the target pod)", func() {
		var (
			pingsBefore, portsBefore, allocsBefore int
			target                                 string
		)

		It("vm2 is live-migratable (condition LiveMigratable)", func(ctx SpecContext) {
			vmi, err := k.GetVMI(ctx, kvNS, vm2.name)
			Expect(err).NotTo(HaveOccurred())
			Expect(vmi.Condition("LiveMigratable")).To(HavePrefix("True"))
		})

		It("VirtualMachineInstanceMigration vm2-migration accepted by virt-api", func(ctx SpecContext) {
			pingsBefore = s.pings(ctx, vm2)
			l, err := agent.ListPorts(ctx, &agentv1.ListPortsRequest{})
			Expect(err).NotTo(HaveOccurred())
			portsBefore, allocsBefore = len(l.GetPorts()), len(kvAllocDirs())
			Expect(k.CreateMigration(ctx, kvNS, "vm2-migration", vm2.name)).To(Succeed())
		})

		It("target pod created", func(ctx SpecContext) {
			t0 := time.Now()
			Eventually(s.otherLauncher(ctx, vm2)).WithTimeout(60 * time.Second).WithPolling(time.Second).ShouldNot(BeEmpty())
			target, _ = s.otherLauncher(ctx, vm2)()
			s.timing("migration object -> target pod", time.Since(t0))
		})

		It("target pod compute asks vhostmq.io/queue-pairs = 2 (webhook: vm2's queue pairs)", func(ctx SpecContext) {
			Expect(target).NotTo(BeEmpty())
			Expect(s.computeAsks(ctx, target)).To(Equal("2/2"), "limits/requests")
		})

		It("target pod annotated vhostmq.io/queues=2", func(ctx SpecContext) {
			Expect(target).NotTo(BeEmpty())
			p, err := f.Client.CoreV1().Pods(kvNS).Get(ctx, target, metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(p.Annotations).To(HaveKeyWithValue("vhostmq.io/queues", "2"))
		})

		It("target pod joins the same vhostmq network as the source", func(ctx SpecContext) {
			Expect(target).NotTo(BeEmpty())
			src, err := s.networks(ctx, vm2.pod)
			Expect(err).NotTo(HaveOccurred())
			Expect(src).NotTo(BeEmpty())
			Expect(s.networks(ctx, target)).To(Equal(src))
		})

		It("target pod Pending: the scheduler names the anti-affinity to the source", func(ctx SpecContext) {
			Expect(target).NotTo(BeEmpty())
			Eventually(func() (string, error) {
				p, err := f.Client.CoreV1().Pods(kvNS).Get(ctx, target, metav1.GetOptions{})
				if err != nil {
					return "", err
				}
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
						return string(p.Status.Phase) + ": " + c.Message, nil
					}
				}
				return string(p.Status.Phase) + ": no reason given", nil
			}).WithTimeout(60 * time.Second).WithPolling(time.Second).
				Should(And(HavePrefix("Pending: "), MatchRegexp(`(?i)anti-affinity`)))
		})

		It("migration cancelled (its object deleted): the target pod is gone", func(ctx SpecContext) {
			Expect(k.DeleteMigration(ctx, kvNS, "vm2-migration", 60*time.Second)).To(Succeed())
			Eventually(s.otherLauncher(ctx, vm2)).WithTimeout(90 * time.Second).WithPolling(time.Second).Should(BeEmpty())
		})

		It("vm2 still Running in its pod", func(ctx SpecContext) {
			Expect(k.VMIStateOf(ctx, kvNS, vm2.name)()).To(HaveField("Phase", "Running"))
			Expect(k.Launcher(ctx, kvNS, vm2.name)()).To(Equal(vm2.pod))
		})

		It("no dataplane port added or removed", func(ctx SpecContext) {
			l, err := agent.ListPorts(ctx, &agentv1.ListPortsRequest{})
			Expect(err).NotTo(HaveOccurred())
			Expect(l.GetPorts()).To(HaveLen(portsBefore))
		})

		It("vm2's port connected with 2 pairs enabled", func(ctx SpecContext) {
			Expect(s.portStatus(ctx, agent, vm2.pod)()).To(Equal("connected, 2 pairs enabled"))
		})

		It("no slot allocated for the target", func() {
			Expect(kvAllocDirs()).To(HaveLen(allocsBefore))
		})

		It("vm2's pings to vm1 still answered", func(ctx SpecContext) {
			Eventually(func() int { return s.pings(ctx, vm2) }).WithTimeout(30 * time.Second).WithPolling(time.Second).
				Should(BeNumerically(">", pingsBefore+5))
		})
	})

	// With the second node: vm3 (1 vCPU) receives a file from vm4 (1 vCPU),
	// which pings vm3 every 10 ms meanwhile; one second into the transfer
	// vm3 migrates to the second node. The file's sha256 in vm3 after the
	// migration must equal vm4's (a page the dataplane wrote and did not
	// log would corrupt it or stall TCP); vm3's port is then on the second
	// node's dataplane with its MAC, its rings start where the first node's
	// stopped them, the first node's port of it is gone. vm3 sends its hash
	// to vm4: a migration target pod has no console log container.
	Context("vm3 receives a file from vm4 and migrates to the second node meanwhile", func() {
		var (
			srcPod  string
			srcPort *agentv1.Port
			phase   string
		)
		migrated := func() {
			GinkgoHelper()
			Expect(phase).To(Equal("Succeeded"), "the migration's phase")
		}
		// agent2 connects to the second node's agent for one spec
		agent2 := func() agentv1.AgentClient {
			GinkgoHelper()
			a, closeConn, err := k.AgentOn(k.Node2)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(closeConn)
			return a
		}

		s.bootSpecs(vm3, true)
		s.bootSpecs(vm4, true)

		It("VirtualMachineInstanceMigration vm3-migration created while the file streams", func(ctx SpecContext) {
			s.needNode2()
			srcPod, srcPort = vm3.pod, vm3.port
			Expect(srcPort).NotTo(BeNil(), "vm3's port")
			_, err := f.Kubectl(ctx, "uncordon", k.Node2)
			Expect(err).NotTo(HaveOccurred())
			Eventually(s.await(ctx, vm4, "sendfile-start")).WithTimeout(300 * time.Second).WithPolling(time.Second).ShouldNot(BeNil())
			time.Sleep(time.Second) // into the transfer
			Expect(k.CreateMigration(ctx, kvNS, "vm3-migration", vm3.name)).To(Succeed())
			s.migStart = time.Now()
		})

		It("migration vm3 -> the second node: phase Succeeded", func(ctx SpecContext) {
			s.needNode2()
			Expect(s.migStart).NotTo(BeZero())
			Eventually(k.MigrationPhase(ctx, kvNS, "vm3-migration")).WithTimeout(600 * time.Second).WithPolling(time.Second).
				Should(BeElementOf("Succeeded", "Failed"))
			s.timing("migration object -> Succeeded", time.Since(s.migStart))
			phase, _ = k.MigrationPhase(ctx, kvNS, "vm3-migration")()
			out, _ := f.Kubectl(ctx, "-n", kvNS, "get", "vmim", "vm3-migration", "-o", "yaml")
			_ = os.WriteFile(filepath.Join(f.LogDir, "migration-vm3.yaml"), []byte(out), 0o644)
			Expect(phase).To(Equal("Succeeded"))
		})

		It("vm3 runs on the second node now", func(ctx SpecContext) {
			s.needNode2()
			migrated()
			vmi, err := k.GetVMI(ctx, kvNS, vm3.name)
			Expect(err).NotTo(HaveOccurred())
			Expect(vmi.Status.NodeName).To(Equal(k.Node2))
		})

		It("migrationState: completed, not failed", func(ctx SpecContext) {
			s.needNode2()
			migrated()
			vmi, err := k.GetVMI(ctx, kvNS, vm3.name)
			Expect(err).NotTo(HaveOccurred())
			ms := vmi.Status.MigrationState
			Expect(ms).NotTo(BeNil())
			Expect(*ms).To(And(HaveField("Completed", true), HaveField("Failed", false)))
			if ms.StartTimestamp != nil && ms.EndTimestamp != nil {
				s.timing("migration window (migrationState)", ms.EndTimestamp.Sub(ms.StartTimestamp.Time))
			}
			vm3.pod = ms.TargetPod
			k.FollowLauncher(follow, kvNS, vm3.name, vm3.pod)
			// libvirt's statistics of the finished job, on the target
			job, err := f.Kubectl(ctx, "-n", kvNS, "exec", vm3.pod, "-c", "compute", "--",
				"virsh", "-c", kvVirsh, "domjobinfo", "--completed", kvNS+"_"+vm3.name)
			_ = os.WriteFile(filepath.Join(f.LogDir, "migration-vm3-jobinfo.txt"), []byte(job+"\n"), 0o644)
			if err == nil {
				s.note("migration downtime (libvirt)", kvJobField(job, "Total downtime"))
				s.note("migration data moved (libvirt)", kvJobField(job, "Data processed", "Memory processed"))
			}
		})

		It("vm3's port on the second node's dataplane, connected, 1 pair enabled", func(ctx SpecContext) {
			s.needNode2()
			migrated()
			Eventually(s.portStatus(ctx, agent2(), vm3.pod)).WithTimeout(60 * time.Second).WithPolling(time.Second).
				Should(Equal("connected, 1 pairs enabled"))
		})

		It("the first node's overlay has vm3's MAC behind the second node's VTEP", func(ctx SpecContext) {
			s.needNode2()
			migrated()
			mac, ip2 := srcPort.GetSpec().GetMac(), internalIP(ctx, k.Node2)
			Eventually(func() (string, error) {
				o, err := agent.GetOverlay(ctx, &agentv1.GetOverlayRequest{})
				for _, e := range o.GetEntries() {
					if e.GetMac() == mac {
						return e.GetVtep(), err
					}
				}
				return "not learned", err
			}).WithTimeout(60*time.Second).WithPolling(time.Second).Should(Equal(ip2), "vm3's MAC %s", mac)
		})

		It("it carries vm3's MAC", func(ctx SpecContext) {
			s.needNode2()
			migrated()
			ports, err := framework.PortsOfPod(ctx, agent2(), vm3.pod)
			Expect(err).NotTo(HaveOccurred())
			Expect(ports).To(HaveLen(1))
			Expect(ports[0].GetSpec().GetMac()).To(And(Not(BeEmpty()), Equal(srcPort.GetSpec().GetMac())))
		})

		// where the first node's dataplane stopped each of vm3's rings
		// (GET_VRING_BASE) the second node's started them (SET_VRING_BASE)
		It("ring positions continue: vm3's rings start on the second node where the first stopped them", func(ctx SpecContext) {
			s.needNode2()
			migrated()
			ports, err := framework.PortsOfPod(ctx, agent2(), vm3.pod)
			Expect(err).NotTo(HaveOccurred())
			Expect(ports).To(HaveLen(1))
			Eventually(func() []string {
				var pairs []string
				for _, ring := range []int{0, 1} {
					pairs = append(pairs, fmt.Sprintf("ring %d: stopped at %s, set to %s", ring,
						s.ringBase("vring stopped", srcPort.GetSpec().GetId(), ring),
						s.ringBase("vring base set", ports[0].GetSpec().GetId(), ring)))
				}
				return pairs
			}).WithTimeout(15*time.Second).WithPolling(time.Second).Should(HaveEach(MatchRegexp(`stopped at (\d+), set to (\d+)$`)), "both logged")
			for _, ring := range []int{0, 1} {
				a := s.ringBase("vring stopped", srcPort.GetSpec().GetId(), ring)
				Expect(s.ringBase("vring base set", ports[0].GetSpec().GetId(), ring)).To(Equal(a), "ring %d", ring)
			}
		})

		It("the source pod's port is gone from the first node's dataplane (the source pod ended, CNI DEL)", func(ctx SpecContext) {
			s.needNode2()
			migrated()
			Eventually(func() ([]*agentv1.Port, error) { return framework.PortsOfPod(ctx, agent, srcPod) }).
				WithTimeout(120 * time.Second).WithPolling(time.Second).Should(BeEmpty())
		})

		It("vm4 sent the file", func(ctx SpecContext) {
			s.needNode2()
			Eventually(s.await(ctx, vm4, "pings")).WithTimeout(600 * time.Second).WithPolling(time.Second).ShouldNot(BeNil())
			g := f.Guest(vm4.name)
			send := g.Last("sendfile")
			s.note("vm4 sent the file (s)", send["secs"])
			p := g.Last("pings")
			s.note("vm4 -> vm3 pings every 10 ms: longest run lost, longest round trip (ms)", p["max_lost_run"]+", "+p["max_rtt_ms"])
			Expect(send).To(HaveKeyWithValue("rc", "0"))
		})

		It("vm4's pings answered after the migration", func() {
			s.needNode2()
			p := f.Guest(vm4.name).Last("pings")
			Expect(p).NotTo(BeNil(), "vm4's pings line")
			Expect(p.Int("sent")).To(BeNumerically(">", 0), "%v", p)
			Expect(p.Int("last_seq")).To(BeNumerically(">", p.Int("sent")-200), "the last reply's sequence number against the pings sent: %v", p)
		})

		It("vm3's file after the migration has vm4's sha256 (sent by vm3 to vm4 across the uplinks)", func(ctx SpecContext) {
			s.needNode2()
			Eventually(s.await(ctx, vm4, "peer-hash")).WithTimeout(180 * time.Second).WithPolling(time.Second).ShouldNot(BeNil())
			g := f.Guest(vm4.name)
			want := g.Last("sendfile-ready")["sha256"]
			Expect(want).NotTo(BeEmpty(), "vm4's sendfile-ready line")
			Expect(g.Last("peer-hash")["sha256"]).To(Equal(want))
		})

		It("vm3 and vm4 deleted, the second node cordoned again", func(ctx SpecContext) {
			s.needNode2()
			vm3.uid, vm4.uid = "", ""
			Expect(k.DeleteVMs(ctx, kvNS, 0, vm3.name, vm4.name)).To(Succeed())
			_, err := f.Kubectl(ctx, "cordon", k.Node2)
			Expect(err).NotTo(HaveOccurred())
		})
	})

	Context("webhook: a virt-launcher-shaped pod with two vhostmq networks; bad annotations", func() {
		It("two networks x vm1's 4 queue pairs: compute asks vhostmq.io/queue-pairs = 8, annotated vhostmq.io/queues=4", func(ctx SpecContext) {
			p, err := s.launcherShape(ctx, vm1, "kubevirt.io/domain", vm1.name)
			Expect(err).NotTo(HaveOccurred())
			c := p.Spec.Containers[0].Resources
			Expect([]string{c.Limits.Name(libpod.QueuePairs, resource.DecimalSI).String(), c.Requests.Name(libpod.QueuePairs, resource.DecimalSI).String(),
				p.Annotations["vhostmq.io/queues"]}).To(Equal([]string{"8", "8", "4"}), "limits, requests, vhostmq.io/queues")
		})

		for _, bad := range [][2]string{{"vhostmq.io/polling", "spin"}, {"vhostmq.io/queues", "0"}, {"vhostmq.io/socket-mode", "both"}} {
			It(fmt.Sprintf("webhook refuses %s: %s, naming %s", bad[0], bad[1], bad[0]), func(ctx SpecContext) {
				_, err := s.launcherShape(ctx, vm1, bad[0], bad[1])
				Expect(err).To(MatchError(ContainSubstring("vhostmq: annotation " + bad[0])))
			})
		}
	})

	Context("helm upgrade to a rebuilt image while vm2 pings vm1 every 0.2 s", func() {
		var (
			n0       int
			oldPod   types.UID
			carrier0 = map[string]string{}
			upStart  time.Time
		)

		It("rebuilt image localhost/vhostmq:upgrade differs from :dev", func(ctx SpecContext) {
			dev, up := s.imageDigest(ctx, k.ImageRepo+":dev"), s.imageDigest(ctx, k.ImageRepo+":upgrade")
			Expect(up).NotTo(BeEmpty(), "%s:upgrade imported (test-vm.sh builds it)", k.ImageRepo)
			Expect(up).NotTo(Equal(dev))
		})

		It("helm upgrade --wait", func(ctx SpecContext) {
			Eventually(func() int { return s.pings(ctx, vm2) }).WithTimeout(60*time.Second).WithPolling(time.Second).
				Should(BeNumerically(">", 0), "vm2 pinging vm1")
			n0 = s.pings(ctx, vm2)
			l, err := f.Client.CoreV1().Pods(f.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kvNodeSel, FieldSelector: "spec.nodeName=" + f.Node})
			Expect(err).NotTo(HaveOccurred())
			Expect(l.Items).To(HaveLen(1), "the node pod on %s", f.Node)
			oldPod = l.Items[0].UID
			for _, v := range []*kvVM{vm1, vm2} {
				carrier0[v.name] = s.carrier(ctx, v)
			}
			upStart = time.Now()
			out, err := f.Helm(ctx, "upgrade", kvRelease, f.Chart, "--namespace", f.Namespace, "--reuse-values",
				"--set", "image.tag=upgrade", "--wait", "--timeout", "5m")
			_ = os.WriteFile(filepath.Join(f.LogDir, "helm-upgrade.log"), []byte(out+"\n"), 0o644)
			Expect(err).NotTo(HaveOccurred())
			s.timing("helm upgrade --wait", time.Since(upStart))
		})

		It("a new node pod runs the rebuilt image, all its containers Ready", func(ctx SpecContext) {
			Eventually(func() (string, error) {
				l, err := f.Client.CoreV1().Pods(f.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kvNodeSel, FieldSelector: "spec.nodeName=" + f.Node})
				if err != nil {
					return "", err
				}
				var seen []string
				for _, p := range l.Items {
					st := "not ready"
					if p.Status.Phase == corev1.PodRunning && kvReady(&p) {
						st = "ready"
					}
					seen = append(seen, fmt.Sprintf("%s %s %s new=%t", p.Name, p.Spec.Containers[0].Image, st, p.UID != oldPod))
					if p.UID != oldPod && p.Spec.Containers[0].Image == k.ImageRepo+":upgrade" && st == "ready" {
						return "new pod on the rebuilt image, ready", nil
					}
				}
				return strings.Join(seen, "; "), nil
			}).WithTimeout(120 * time.Second).WithPolling(time.Second).Should(Equal("new pod on the rebuilt image, ready"))
			s.followDataplane(ctx, f.Node)
		})

		It("no container of the node pod restarted", func(ctx SpecContext) {
			l, err := f.Client.CoreV1().Pods(f.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kvNodeSel})
			Expect(err).NotTo(HaveOccurred())
			restarts := map[string]int32{}
			for _, p := range l.Items {
				for _, c := range p.Status.ContainerStatuses {
					restarts[p.Name+"/"+c.Name] = c.RestartCount
				}
			}
			Expect(restarts).NotTo(BeEmpty())
			Expect(restarts).To(HaveEach(BeZero()))
		})

		for _, v := range []*kvVM{vm1, vm2} {
			It(fmt.Sprintf("%s: port back after the upgrade, connected with its pairs enabled, same slots", v.name), func(ctx SpecContext) {
				Expect(v.port).NotTo(BeNil())
				Eventually(s.portStatus(ctx, agent, v.pod)).WithTimeout(60 * time.Second).WithPolling(time.Second).
					Should(Equal(fmt.Sprintf("connected, %d pairs enabled", v.queues)))
				ports, err := framework.PortsOfPod(ctx, agent, v.pod)
				Expect(err).NotTo(HaveOccurred())
				Expect(ports).To(HaveLen(1))
				Expect(kvSorted(ports[0].GetSpec().GetSlots())).To(Equal(kvSorted(v.port.GetSpec().GetSlots())))
				if v == vm2 {
					s.timing("helm upgrade: both ports back", time.Since(upStart))
				}
			})
		}

		// the new pod took the live ports over from the old one
		// (handoff.sock): no reconnect, the guests saw no link down/up
		It("the new node pod took the live ports over from the old one (handoff)", func(ctx SpecContext) {
			pod, err := s.nodePod(ctx, f.Node)
			Expect(err).NotTo(HaveOccurred())
			re := regexp.MustCompile(`handoff done: serving the predecessor.*`)
			Eventually(func() string { return re.FindString(s.dataplaneLog(pod)) }).WithTimeout(30 * time.Second).WithPolling(time.Second).
				ShouldNot(BeEmpty())
			line := re.FindString(s.dataplaneLog(pod))
			adopted, hello := regexp.MustCompile(`adopted=(\d+)`).FindStringSubmatch(line), regexp.MustCompile(`sinceHello=(\S+)`).FindStringSubmatch(line)
			if adopted != nil && hello != nil {
				s.note("handoff", fmt.Sprintf("adopted %s, hello to serving %s", adopted[1], hello[1]))
			}
		})

		It("no frontend reconnected to the new dataplane", func(ctx SpecContext) {
			pod, err := s.nodePod(ctx, f.Node)
			Expect(err).NotTo(HaveOccurred())
			Expect(s.dataplaneLog(pod)).NotTo(BeEmpty(), "the new dataplane's log")
			Expect(s.dataplaneLog(pod)).NotTo(ContainSubstring("frontend connected"))
		})

		// vmq.carrierwatch: the guest reports carrier_changes once the link
		// is up, then on every move; a backend that went away shows as a
		// link down/up, a new value. Watched for 5 s after the ports are back.
		for _, v := range []*kvVM{vm1, vm2} {
			It(v.name+": carrier_changes unchanged across the upgrade (no link down/up)", func(ctx SpecContext) {
				Expect(carrier0[v.name]).NotTo(BeEmpty(), "carrier_changes before the upgrade")
				Consistently(func() string { return s.carrier(ctx, v) }).WithTimeout(5 * time.Second).WithPolling(time.Second).
					Should(Equal(carrier0[v.name]))
			})
		}

		It("vm2's pings to vm1 answered again after the upgrade", func(ctx SpecContext) {
			Expect(upStart).NotTo(BeZero())
			Expect(s.pings(ctx, vm2)-n0).To(BeNumerically(">", 10), "replies since the upgrade began")
		})

		// a reconnect takes seconds (3.3-6.8 s measured before the handoff):
		// the pings sent meanwhile are lost, or answered seconds late; with
		// the handoff the upgrade's pings fare no worse than as many just
		// before it: at most one lost at 0.2 s (or as many as the baseline
		// lost), none waiting a second (or twice the baseline's longest)
		It("no ping of vm2's waited max(1 s, twice the baseline's longest) or more for its reply across the upgrade", func(ctx SpecContext) {
			Expect(upStart).NotTo(BeZero())
			up, base := kvUpgradePings(s.pingLines(ctx, vm2), n0)
			s.note("vm2's pings across the upgrade: replies, lost, reordered, longest round trip (ms), longest gap (s)",
				fmt.Sprintf("%d, %d, %d, %.0f, %.2f", len(up.lines), up.lost, up.reordered, up.maxRTT, up.maxGap))
			s.note("baseline (as many replies before): lost, longest round trip (ms)", fmt.Sprintf("%d, %.0f", base.lost, base.maxRTT))
			limit := max(2*math.Round(base.maxRTT), 1000)
			Expect(math.Round(up.maxRTT)).To(BeNumerically("<", limit), "the longest round trip (ms) across the upgrade; baseline %.0f ms", base.maxRTT)
		})

		It("at most max(1, the baseline's) of vm2's pings lost across the upgrade", func(ctx SpecContext) {
			Expect(upStart).NotTo(BeZero())
			up, base := kvUpgradePings(s.pingLines(ctx, vm2), n0)
			Expect(up.lost).To(BeNumerically("<=", max(base.lost, 1)), "pings lost across the upgrade; baseline %d", base.lost)
		})

		It("the post-upgrade hook kept the binding registered", func(ctx SpecContext) {
			Expect(k.BindingImage(ctx)).To(Equal(k.SidecarImage))
		})
	})

	Context("delete the VMs", func() {
		var deleted time.Time

		It("launcher pods gone", func(ctx SpecContext) {
			vm1.uid, vm2.uid = "", ""
			deleted = time.Now()
			Expect(k.DeleteVMs(ctx, kvNS, 180*time.Second, vm1.name, vm2.name)).To(Succeed())
			Eventually(f.PodNames(ctx, kvNS, "kubevirt.io=virt-launcher")).WithTimeout(180 * time.Second).WithPolling(time.Second).Should(BeEmpty())
			s.timing("delete -> launcher pods gone", time.Since(deleted))
		})

		It("no dataplane port left", func(ctx SpecContext) {
			Eventually(framework.PortIDs(ctx, agent)).WithTimeout(60 * time.Second).WithPolling(time.Second).Should(BeEmpty())
		})

		It("no socket left in /var/run/vhostmq (but the agent's api.sock)", func() {
			Eventually(leftovers(sockDir, func(fi os.FileInfo) bool { return fi.Mode()&os.ModeSocket == 0 || fi.Name() == "api.sock" })).
				WithTimeout(30 * time.Second).WithPolling(time.Second).Should(BeEmpty())
		})

		It("no device-info file left in /var/run/k8s.cni.cncf.io/devinfo", func() {
			Eventually(leftovers(kvDevinfo, func(fi os.FileInfo) bool { return !fi.Mode().IsRegular() })).
				WithTimeout(60 * time.Second).WithPolling(time.Second).Should(BeEmpty())
		})

		It("no allocation directory (qp-*) left (device plugin reclaim)", func() {
			Eventually(kvAllocDirs).WithTimeout(k.Reclaim).WithPolling(time.Second).Should(BeEmpty())
			s.timing("delete -> allocations reclaimed", time.Since(deleted))
		})

		It("node allocatable vhostmq.io/queue-pairs back to 8", func(ctx SpecContext) {
			Eventually(f.NodeResource(ctx, f.Node, libpod.QueuePairs)).WithTimeout(30 * time.Second).WithPolling(time.Second).
				Should(HaveField("Allocatable", "8"))
		})
	})

	Context("helm uninstall: nothing of vhostmq is left", func() {
		var t0 time.Time

		It("helm uninstall --wait", func(ctx SpecContext) {
			t0 = time.Now()
			out, err := f.Helm(ctx, "uninstall", kvRelease, "--namespace", f.Namespace, "--wait", "--timeout", "3m")
			_ = os.WriteFile(filepath.Join(f.LogDir, "helm-uninstall.log"), []byte(out+"\n"), 0o644)
			Expect(err).NotTo(HaveOccurred())
		})

		It("no pod left in vhostmq-system", func(ctx SpecContext) {
			Eventually(f.PodNames(ctx, f.Namespace, "")).WithTimeout(90 * time.Second).WithPolling(time.Second).Should(BeEmpty())
			s.timing("helm uninstall -> no pod left", time.Since(t0))
		})

		It("no object of the release left (namespaced or cluster-wide)", func(ctx SpecContext) {
			Expect(s.releaseObjects(ctx)).To(BeEmpty())
		})

		It("the pre-delete hook took the binding out of the KubeVirt CR", func(ctx SpecContext) {
			Expect(k.BindingImage(ctx)).To(BeEmpty())
		})

		It("vhostmq-cni removed from the node's CNI bin dir", func() {
			_, err := os.Lstat(filepath.Join(k.NodeCNIBin, "vhostmq-cni"))
			Expect(os.IsNotExist(err)).To(BeTrue(), "lstat %s/vhostmq-cni: %v", k.NodeCNIBin, err)
		})

		It("no file or socket left on the node (CNI kubeconfig, agent state, sockets, device-info)", func() {
			Eventually(func() []string {
				var left []string
				for _, d := range []string{filepath.Join(k.NodeCNIConf, "vhostmq.d"), "/var/lib/vhostmq", sockDir, kvDevinfo} {
					left = append(left, leftovers(d, func(fi os.FileInfo) bool { return fi.IsDir() })()...)
				}
				return left
			}).WithTimeout(30 * time.Second).WithPolling(time.Second).Should(BeEmpty())
		})

		It("node allocatable vhostmq.io/queue-pairs = 0", func(ctx SpecContext) {
			// a node whose plugin is gone lists it at 0, or not at all
			Eventually(f.NodeResource(ctx, f.Node, libpod.QueuePairs)).WithTimeout(60 * time.Second).WithPolling(time.Second).
				Should(HaveField("Allocatable", BeElementOf("0", "none")))
		})
	})
})

// kvSuite holds what the KubeVirt specs share, and their steps.
type kvSuite struct {
	k        *framework.KubeVirt
	agent    agentv1.AgentClient
	follow   context.Context
	followed map[string]bool // node pods whose dataplane log is followed
	migStart time.Time
	timings  [][2]string
}

// helmValues are the chart's values on the test bed: its node keeps CNI
// binaries and configuration under the cluster's run folder, the sidecar
// is named (its default follows image.tag, and the upgrade rebuilds only
// the main image), the dataplane logs every vhost-user message and dumps
// its TX rings every 10 s; with two nodes, the dataplanes are joined by
// the vxlan uplink (#30) over the nodes' InternalIP addresses.
func (s *kvSuite) helmValues() []string {
	v := []string{"paths.cniBinDir=" + s.k.NodeCNIBin, "paths.cniConfDir=" + s.k.NodeCNIConf, "kubevirt.registerBinding=true",
		"kubevirt.sidecarImage=" + s.k.SidecarImage, "dataplane.cpus={0,1}", "dataplane.logLevel=debug", "dataplane.watchdog.ringDumpSeconds=10"}
	if s.k.Node2 != "" {
		v = append(v, "uplink.mode=vxlan", "networkAttachmentDefinition.uplink=vxlan", fmt.Sprintf("networkAttachmentDefinition.vni=%d", kvVNI),
			fmt.Sprintf("networkAttachmentDefinition.mtu=%d", kvOverlayMTU))
	}
	return v
}

// With two nodes the network is an overlay (#30): VNI kvVNI between the
// nodes' InternalIP addresses, which the node pods take from the Node
// objects; the guests (static addresses, no DHCP) are given its MTU.
const (
	kvVNI        = 4242
	kvOverlayMTU = 1450 // the test bed's 1500 less 50
)

func overlayMTU(k *framework.KubeVirt) string {
	if k.Node2 == "" {
		return ""
	}
	return fmt.Sprintf(" vmq.mtu=%d", kvOverlayMTU)
}

// internalIP is a node's InternalIP address.
func internalIP(ctx context.Context, node string) string {
	GinkgoHelper()
	n, err := f.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	Fail("node " + node + " has no InternalIP")
	return ""
}

func (s *kvSuite) needNode2() {
	if s.k.Node2 == "" {
		Skip("one node (VHOSTMQ_KUBEVIRT_NODES=1): no migration to a second node")
	}
}

// timing is a measured time: a report entry and a line of the summary.
func (s *kvSuite) timing(what string, d time.Duration) {
	s.note(what, d.Round(100*time.Millisecond).String())
}

// note is a measured value: a report entry and a line of the summary.
func (s *kvSuite) note(what, value string) {
	AddReportEntry(what, value)
	s.timings = append(s.timings, [2]string{what, value})
}

// printTimings ends the run with what was measured, as the script did.
func (s *kvSuite) printTimings() {
	var b strings.Builder
	fmt.Fprintf(&b, "===== real KubeVirt + vhostmq: timings and values\n")
	for _, t := range s.timings {
		fmt.Fprintf(&b, "%s: %s\n", t[0], t[1])
	}
	fmt.Fprintf(&b, "guest consoles and logs in %s\n", f.LogDir)
	_ = os.WriteFile(filepath.Join(f.LogDir, "timings.txt"), []byte(b.String()), 0o644)
	fmt.Print(b.String())
}

// nodePod is the vhostmq node pod on node (not one being deleted).
func (s *kvSuite) nodePod(ctx context.Context, node string) (string, error) {
	l, err := f.Client.CoreV1().Pods(f.Namespace).List(ctx, metav1.ListOptions{LabelSelector: kvNodeSel, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return "", err
	}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			return p.Name, nil
		}
	}
	return "", fmt.Errorf("no vhostmq node pod on %s", node)
}

// followDataplane keeps the dataplane log of node's pod in
// LogDir/dataplane-<pod>.log while the pod lives.
func (s *kvSuite) followDataplane(ctx context.Context, node string) {
	GinkgoHelper()
	pod, err := s.nodePod(ctx, node)
	Expect(err).NotTo(HaveOccurred())
	if s.followed[pod] {
		return
	}
	_, err = f.FollowLogs(s.follow, f.Namespace, pod, "dataplane", "dataplane-"+pod+".log")
	Expect(err).NotTo(HaveOccurred())
	s.followed[pod] = true
}

func (s *kvSuite) dataplaneLog(pod string) string {
	b, _ := os.ReadFile(filepath.Join(f.LogDir, "dataplane-"+pod+".log"))
	return string(b)
}

// dataplaneLines are the lines of every followed dataplane log matching re.
func (s *kvSuite) dataplaneLines(re *regexp.Regexp) []string {
	files, _ := filepath.Glob(filepath.Join(f.LogDir, "dataplane-*.log"))
	var out []string
	for _, file := range files {
		b, _ := os.ReadFile(file)
		for _, l := range strings.Split(string(b), "\n") {
			if re.MatchString(l) {
				out = append(out, filepath.Base(file)+": "+l)
			}
		}
	}
	return out
}

// ringBase is the base of the last "msg" line the dataplanes logged for a
// port's ring ("" if none).
func (s *kvSuite) ringBase(msg, port string, ring int) string {
	re := regexp.MustCompile(fmt.Sprintf(`msg="%s" port=%s vring=%d .*\bbase=(\d+)`, regexp.QuoteMeta(msg), regexp.QuoteMeta(port), ring))
	lines := s.dataplaneLines(re)
	if len(lines) == 0 {
		return ""
	}
	return re.FindStringSubmatch(lines[len(lines)-1])[1]
}

// bootSpecs are the checks of one VM's start, one It each; with node2
// they are skipped on a one-node test bed.
func (s *kvSuite) bootSpecs(v *kvVM, node2 bool) {
	skip := func() {
		if node2 {
			s.needNode2()
		}
	}
	It(v.name+": virt-launcher pod created", func(ctx SpecContext) {
		skip()
		s.create(ctx, v)
	})
	It(fmt.Sprintf("%s: pod compute asks vhostmq.io/queue-pairs = %d (webhook)", v.name, v.queues), func(ctx SpecContext) {
		skip()
		s.checkAsks(ctx, v)
	})
	It(fmt.Sprintf("%s: pod annotated vhostmq.io/queues=%d", v.name, v.queues), func(ctx SpecContext) {
		skip()
		s.checkAnnotated(ctx, v)
	})
	It(v.name+": VMI Running", func(ctx SpecContext) {
		skip()
		s.checkRunning(ctx, v)
	})
	It(v.name+": guest booted", func(ctx SpecContext) {
		skip()
		s.checkBooted(ctx, v)
	})
	It(fmt.Sprintf("%s: guest NIC has %d queue pairs", v.name, v.queues), func(ctx SpecContext) {
		skip()
		s.checkGuestQueues(ctx, v)
	})
	It(v.name+": guest eth0 up", func() {
		skip()
		s.checkLinkUp(v)
	})
	It(v.name+": one dataplane port for the pod", func(ctx SpecContext) {
		skip()
		s.checkOnePort(ctx, v)
	})
	It(fmt.Sprintf("%s: port has %d queue pairs on exactly the pod's %d slots", v.name, v.queues, v.queues), func(ctx SpecContext) {
		skip()
		s.checkPortSlots(ctx, v)
	})
	It(fmt.Sprintf("%s: port connected with %d pairs enabled", v.name, v.queues), func(ctx SpecContext) {
		skip()
		s.checkConnected(ctx, v)
	})
	It(fmt.Sprintf("%s: domain has a vhost-user interface with queues=%d", v.name, v.queues), func(ctx SpecContext) {
		skip()
		s.checkDomainQueues(ctx, v)
	})
}

// boot is bootSpecs in one go (a VM created again).
func (s *kvSuite) boot(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	s.create(ctx, v)
	s.checkAsks(ctx, v)
	s.checkAnnotated(ctx, v)
	s.checkRunning(ctx, v)
	s.checkBooted(ctx, v)
	s.checkGuestQueues(ctx, v)
	s.checkLinkUp(v)
	s.checkOnePort(ctx, v)
	s.checkPortSlots(ctx, v)
	s.checkConnected(ctx, v)
	s.checkDomainQueues(ctx, v)
}

func (s *kvSuite) create(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	v.pod, v.uid, v.port, v.slots = "", "", nil, ""
	u, err := libvmi.ToUnstructured(v.vm(s.k))
	Expect(err).NotTo(HaveOccurred())
	v.created = time.Now()
	Expect(s.k.CreateVM(ctx, u)).To(Succeed())
	Eventually(s.k.Launcher(ctx, kvNS, v.name)).WithTimeout(120 * time.Second).WithPolling(500 * time.Millisecond).ShouldNot(BeEmpty())
	v.pod, _ = s.k.Launcher(ctx, kvNS, v.name)()
	s.timing(v.name+": create -> launcher pod", time.Since(v.created))
	s.k.FollowLauncher(s.follow, kvNS, v.name, v.pod)
}

// computeAsks is the compute container's vhostmq.io/queue-pairs as
// "limit/request".
func (s *kvSuite) computeAsks(ctx context.Context, pod string) (string, error) {
	p, err := f.Client.CoreV1().Pods(kvNS).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, c := range p.Spec.Containers {
		if c.Name == "compute" {
			l, r := c.Resources.Limits[libpod.QueuePairs], c.Resources.Requests[libpod.QueuePairs]
			return l.String() + "/" + r.String(), nil
		}
	}
	return "", fmt.Errorf("no compute container in %s", pod)
}

func (s *kvSuite) checkAsks(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.pod).NotTo(BeEmpty(), "%s's launcher pod", v.name)
	Expect(s.computeAsks(ctx, v.pod)).To(Equal(fmt.Sprintf("%d/%d", v.queues, v.queues)), "limits/requests of %s", v.pod)
}

func (s *kvSuite) checkAnnotated(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.pod).NotTo(BeEmpty(), "%s's launcher pod", v.name)
	p, err := f.Client.CoreV1().Pods(kvNS).Get(ctx, v.pod, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	Expect(p.Annotations).To(HaveKeyWithValue("vhostmq.io/queues", strconv.Itoa(v.queues)))
}

func (s *kvSuite) checkRunning(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.pod).NotTo(BeEmpty(), "%s's launcher pod", v.name)
	Eventually(s.k.VMIStateOf(ctx, kvNS, v.name)).WithTimeout(s.k.VMTimeout).WithPolling(time.Second).
		Should(HaveField("Phase", "Running"))
	st, err := s.k.VMIStateOf(ctx, kvNS, v.name)()
	Expect(err).NotTo(HaveOccurred())
	v.uid = st.UID
	took := time.Since(v.created)
	s.timing(v.name+": create -> VMI Running", took)
	if took > time.Minute {
		// seen once: the launcher undefined the domain a second after
		// starting it and virt-handler started it again at its next resync
		re := regexp.MustCompile(`"msg":"(Domain (defined|started|undefined)\.|Signaled vmi deletion)`)
		for _, l := range strings.Split(s.k.LauncherLog(v.name, v.pod, "compute"), "\n") {
			if re.MatchString(l) {
				GinkgoWriter.Printf("%s slow start, domain event: %.300s\n", v.name, l)
			}
		}
	}
}

func (s *kvSuite) checkBooted(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.uid).NotTo(BeEmpty(), "%s's VMI Running", v.name)
	Eventually(s.await(ctx, v, "boot")).WithTimeout(s.k.VMTimeout).WithPolling(time.Second).ShouldNot(BeNil(), func() string {
		// QEMU 10.0's multi-threaded TCG aborts booting multi-vCPU guests
		// (iotlb_to_section, qemu#3040); the launcher image runs them
		// single-threaded (images.sh), so naming it means that broke
		if strings.Contains(s.k.LauncherLog(v.name, v.pod, "compute"), kvTCGAbort) {
			return "QEMU's TCG aborted (iotlb_to_section): is the launcher's thread=single wrapper in place?"
		}
		return "no boot line on the serial console"
	})
	s.timing(v.name+": create -> guest boot line", time.Since(v.created))
}

func (s *kvSuite) checkGuestQueues(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.uid).NotTo(BeEmpty(), "%s's VMI Running", v.name)
	Eventually(s.await(ctx, v, "link")).WithTimeout(120 * time.Second).WithPolling(time.Second).ShouldNot(BeNil())
	s.timing(v.name+": create -> guest link line", time.Since(v.created))
	q := f.Guest(v.name).Last("queues")
	n := strconv.Itoa(v.queues)
	Expect(q).To(And(HaveKeyWithValue("rx", n), HaveKeyWithValue("tx", n), HaveKeyWithValue("max_combined", n)))
}

func (s *kvSuite) checkLinkUp(v *kvVM) {
	GinkgoHelper()
	Expect(f.Guest(v.name).Last("link")).To(HaveKeyWithValue("state", "up"))
}

func (s *kvSuite) checkOnePort(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.pod).NotTo(BeEmpty(), "%s's launcher pod", v.name)
	ports, err := framework.PortsOfPod(ctx, s.agent, v.pod)
	Expect(err).NotTo(HaveOccurred())
	Expect(ports).To(HaveLen(1), "ports labelled with pod %s", v.pod)
	v.port = ports[0]
	p, err := f.Client.CoreV1().Pods(kvNS).Get(ctx, v.pod, metav1.GetOptions{})
	Expect(err).NotTo(HaveOccurred())
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == "compute" {
			slots, err := f.ContainerEnv(ctx, c.ContainerID, "VHOSTMQ_QUEUE_SLOTS")
			Expect(err).NotTo(HaveOccurred())
			v.slots = framework.SortedCSV(slots)
		}
	}
	sp := v.port.GetSpec()
	GinkgoWriter.Printf("pod %s: allocated slots %s; port %s socket %s queue_pairs %d mac %s role %s polling %s\n",
		v.pod, v.slots, sp.GetId(), sp.GetSocketPath(), sp.GetQueuePairs(), sp.GetMac(), sp.GetRole(), sp.GetPolling())
}

func (s *kvSuite) checkPortSlots(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.port).NotTo(BeNil(), "%s's port", v.name)
	Expect(v.slots).NotTo(BeEmpty(), "the compute container's VHOSTMQ_QUEUE_SLOTS")
	Expect(strings.Split(v.slots, ",")).To(HaveLen(v.queues), "the pod's slots %s", v.slots)
	Expect(v.port.GetSpec().GetQueuePairs()).To(BeEquivalentTo(v.queues))
	Expect(kvSorted(v.port.GetSpec().GetSlots())).To(Equal(v.slots), "the port's slots against the pod's")
}

func (s *kvSuite) checkConnected(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.pod).NotTo(BeEmpty(), "%s's launcher pod", v.name)
	Eventually(s.portStatus(ctx, s.agent, v.pod)).WithTimeout(30 * time.Second).WithPolling(time.Second).
		Should(Equal(fmt.Sprintf("connected, %d pairs enabled", v.queues)))
}

// checkDomainQueues: the running domain's vhost-user NIC, by virsh in the
// compute container; libvirt leaves queues out for one queue pair.
func (s *kvSuite) checkDomainQueues(ctx context.Context, v *kvVM) {
	GinkgoHelper()
	Expect(v.pod).NotTo(BeEmpty(), "%s's launcher pod", v.name)
	x, err := f.Kubectl(ctx, "-n", kvNS, "exec", v.pod, "-c", "compute", "--", "virsh", "-c", kvVirsh, "dumpxml", kvNS+"_"+v.name)
	Expect(err).NotTo(HaveOccurred())
	_ = os.WriteFile(filepath.Join(f.LogDir, "domain-"+v.name+".xml"), []byte(x+"\n"), 0o644)
	var dom libvirtxml.Domain
	Expect(dom.Unmarshal(x)).To(Succeed())
	Expect(dom.Devices).NotTo(BeNil())
	var queues []string
	for _, nic := range dom.Devices.Interfaces {
		if nic.Source == nil || nic.Source.VHostUser == nil {
			continue
		}
		if nic.Driver == nil {
			queues = append(queues, "no driver element")
		} else {
			queues = append(queues, fmt.Sprintf("queues=%d", nic.Driver.Queues))
		}
	}
	want := fmt.Sprintf("queues=%d", v.queues)
	if v.queues == 1 {
		want = "queues=0"
	}
	Expect(queues).To(Equal([]string{want}), "the domain's vhost-user interfaces (domain-%s.xml)", v.name)
}

// portStatus observes a pod's one port as "connected, N pairs enabled".
func (s *kvSuite) portStatus(ctx context.Context, agent agentv1.AgentClient, pod string) func() (string, error) {
	return func() (string, error) {
		ports, err := framework.PortsOfPod(ctx, agent, pod)
		if err != nil {
			return "", err
		}
		if len(ports) != 1 {
			return fmt.Sprintf("%d ports of pod %s", len(ports), pod), nil
		}
		st := ports[0].GetStatus()
		c := "connected"
		if !st.GetConnected() {
			c = "not connected"
		}
		return fmt.Sprintf("%s, %d pairs enabled", c, st.GetEnabledPairs()), nil
	}
}

// await observes the VM's guest's last "kind" result line (its console
// fetched anew each time). A VMI that reached Running and ended stops the
// wait at once, saying so.
func (s *kvSuite) await(ctx context.Context, v *kvVM, kind string, where ...string) func() (framework.Result, error) {
	g := f.Guest(v.name)
	return func() (framework.Result, error) {
		cerr := s.k.Console(ctx, kvNS, v.pod, v.name)
		if cerr == nil {
			if r := g.Last(kind, where...); r != nil {
				return r, nil
			}
		}
		if err := s.vmiEnded(ctx, v); err != nil {
			v.uid = ""
			return nil, StopTrying(err.Error())
		}
		if cerr != nil {
			return nil, cerr
		}
		return g.Await(kind, where...)()
	}
}

// vmiEnded: the VMI that reached Running is gone or no longer Running
// (runStrategy Always replaces a crashed one); its state goes to
// LogDir/<vm>-replaced.txt. nil while it runs, or before it ran.
func (s *kvSuite) vmiEnded(ctx context.Context, v *kvVM) error {
	if v.uid == "" {
		return nil
	}
	st, err := s.k.VMIStateOf(ctx, kvNS, v.name)()
	if err != nil || (st.UID == v.uid && st.Phase == "Running") {
		return nil
	}
	file := filepath.Join(f.LogDir, v.name+"-replaced.txt")
	var b strings.Builder
	fmt.Fprintf(&b, "=== %s: VMI %s -> uid %q phase %q at %s\n", v.name, v.uid, st.UID, st.Phase, time.Now().Format(time.RFC3339Nano))
	for _, args := range [][]string{{"-n", kvNS, "get", "vmi", v.name, "-o", "yaml"}, {"-n", kvNS, "get", "events", "--sort-by", ".lastTimestamp"},
		{"-n", f.Namespace, "logs", "-l", kvNodeSel, "-c", "dataplane", "--tail", "80", "--prefix"}} {
		out, err := f.Kubectl(ctx, args...)
		fmt.Fprintf(&b, "=== kubectl %s\n%s\n", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "--- error: %v\n", err)
		}
	}
	_ = os.WriteFile(file, []byte(b.String()), 0o644)
	why := ""
	if strings.Contains(s.k.LauncherLog(v.name, v.pod, "compute"), kvTCGAbort) {
		why = "; QEMU's TCG aborted (iotlb_to_section)"
	}
	return fmt.Errorf("%s: the VMI %s that reached Running ended (now uid %q, phase %q)%s: %s, launcher logs %s/%s-%s-*.log",
		v.name, v.uid, st.UID, st.Phase, why, file, f.LogDir, v.name, v.pod)
}

// stalled names the VMs whose guest kernel reported a stalled CPU.
func (s *kvSuite) stalled(ctx context.Context, vms ...*kvVM) []string {
	var out []string
	re := regexp.MustCompile(kvStalled)
	for _, v := range vms {
		if v.pod == "" || s.k.Console(ctx, kvNS, v.pod, v.name) != nil {
			continue
		}
		if l := re.FindString(f.Guest(v.name).Log()); l != "" {
			out = append(out, v.name+": "+l)
		}
	}
	return out
}

// pings counts vm's VHOSTMQ-PING replies so far.
func (s *kvSuite) pings(ctx context.Context, v *kvVM) int {
	_ = s.k.Console(ctx, kvNS, v.pod, v.name)
	return f.Guest(v.name).Pings()
}

// carrier is the distinct carrier_changes values the guest reported
// (vmq.carrierwatch), sorted, comma-separated.
func (s *kvSuite) carrier(ctx context.Context, v *kvVM) string {
	_ = s.k.Console(ctx, kvNS, v.pod, v.name)
	var vals []int
	for _, r := range f.Guest(v.name).Results("carrier") {
		if n := r.Int("changes"); n >= 0 && !slices.Contains(vals, n) {
			vals = append(vals, n)
		}
	}
	slices.Sort(vals)
	var out []string
	for _, n := range vals {
		out = append(out, strconv.Itoa(n))
	}
	return strings.Join(out, ",")
}

// kvPing is one VHOSTMQ-PING reply.
type kvPing struct {
	t, rtt float64 // the guest's uptime (s), the round trip (ms)
	seq    int
}

var kvPingLine = regexp.MustCompile(`^VHOSTMQ-PING ok .*\bt=([0-9.]+) .*\bseq=([0-9]+) rtt_ms=([0-9.]+)`)

// pingLines are the guest's replies so far, in order.
func (s *kvSuite) pingLines(ctx context.Context, v *kvVM) []kvPing {
	_ = s.k.Console(ctx, kvNS, v.pod, v.name)
	var out []kvPing
	for _, l := range strings.Split(f.Guest(v.name).Log(), "\n") {
		m := kvPingLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		t, _ := strconv.ParseFloat(m[1], 64)
		seq, _ := strconv.Atoi(m[2])
		rtt, _ := strconv.ParseFloat(m[3], 64)
		out = append(out, kvPing{t: t, rtt: rtt, seq: seq})
	}
	return out
}

// kvPingRun sums up some replies: how many pings were lost (holes in the
// sequence numbers), the longest round trip and the longest gap between
// two replies (the guest's clock).
type kvPingRun struct {
	lines []kvPing
	// lost: sequence numbers between the window's first and last reply
	// that got no reply at all; reordered: replies that came after a later
	// one's (a guest's queues are not one FIFO: not a loss)
	lost, reordered int
	maxRTT, maxGap  float64
}

// kvSummary sums up the replies ps, a window of all (every reply of the
// run, by sequence number: a reply that came outside the window is no
// loss).
func kvSummary(ps []kvPing, all map[int]bool) kvPingRun {
	r := kvPingRun{lines: ps}
	lo, hi := 0, -1
	for i, p := range ps {
		r.maxRTT = max(r.maxRTT, p.rtt)
		if i == 0 {
			lo, hi = p.seq, p.seq
			continue
		}
		r.maxGap = max(r.maxGap, p.t-ps[i-1].t)
		if p.seq < hi {
			r.reordered++
		}
		lo, hi = min(lo, p.seq), max(hi, p.seq)
	}
	for seq := lo; seq <= hi; seq++ {
		if !all[seq] {
			r.lost++
		}
	}
	return r
}

// kvUpgradePings splits the replies at n0, the count when the upgrade
// began: those from the n0-th on (the last one before, to see a gap right
// at the start), and as many just before as the baseline under the same
// load.
func kvUpgradePings(ps []kvPing, n0 int) (up, base kvPingRun) {
	from := max(n0-1, 0)
	if from > len(ps) {
		from = len(ps)
	}
	all := map[int]bool{}
	for _, p := range ps {
		all[p.seq] = true
	}
	up = kvSummary(ps[from:], all)
	nb := len(ps) - n0
	b0 := max(n0-nb, 1)
	end := max(n0-1, 1)
	if b0-1 < end && end <= len(ps) {
		base = kvSummary(ps[b0-1:end], all)
	}
	return up, base
}

// bandwidth is a VM's port's limits: ingress, egress bits/s (0: none).
func (s *kvSuite) bandwidth(ctx context.Context, v *kvVM) ([2]uint64, error) {
	ports, err := framework.PortsOfPod(ctx, s.agent, v.pod)
	if err != nil {
		return [2]uint64{}, err
	}
	if len(ports) != 1 {
		return [2]uint64{}, fmt.Errorf("%d ports of pod %q", len(ports), v.pod)
	}
	bw := ports[0].GetSpec().GetBandwidth()
	return [2]uint64{bw.GetIngress().GetBitsPerSecond(), bw.GetEgress().GetBitsPerSecond()}, nil
}

// stats are the counters of the VM's port (as the boot found it).
func (s *kvSuite) stats(ctx context.Context, v *kvVM) (*agentv1.PortStats, error) {
	if v.port == nil {
		return nil, fmt.Errorf("%s: no port", v.name)
	}
	st, err := s.agent.GetStats(ctx, &agentv1.GetStatsRequest{Ids: []string{v.port.GetSpec().GetId()}})
	if err != nil {
		return nil, err
	}
	if len(st.GetPorts()) != 1 {
		return nil, fmt.Errorf("stats of port %s: %d ports", v.port.GetSpec().GetId(), len(st.GetPorts()))
	}
	return st.GetPorts()[0], nil
}

// spoofed is the VM's port's spoofed drops (a failed read fails the spec).
func (s *kvSuite) spoofed(ctx context.Context, v *kvVM) uint64 {
	GinkgoHelper()
	st, err := s.stats(ctx, v)
	Expect(err).NotTo(HaveOccurred())
	var n uint64
	for _, q := range st.GetQueues() {
		n += q.GetDrops().GetSpoofed()
	}
	return n
}

// usedServed: every one of the guest's queues that carried frames during
// its iperf3 traffic, by its own counters, was served on that pair
// (framework.Guest.UsedServed).
func (s *kvSuite) usedServed(ctx context.Context, v *kvVM) error {
	if err := s.k.Console(ctx, kvNS, v.pod, v.name); err != nil {
		return err
	}
	st, err := s.stats(ctx, v)
	if err != nil {
		return err
	}
	return f.Guest(v.name).UsedServed(st, v.queues)
}

// otherLauncher observes the VM's launcher pod that is not its running one
// ("" when there is none): a migration's target.
func (s *kvSuite) otherLauncher(ctx context.Context, v *kvVM) func() (string, error) {
	return func() (string, error) {
		ps, err := s.k.Launchers(ctx, kvNS, v.name, false)
		if err != nil {
			return "", err
		}
		for _, p := range ps {
			if p != v.pod {
				return p, nil
			}
		}
		return "", nil
	}
}

// networks are a pod's Multus network selections (name, namespace,
// interface), as JSON.
func (s *kvSuite) networks(ctx context.Context, pod string) (string, error) {
	p, err := f.Client.CoreV1().Pods(kvNS).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	var sel []struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		Interface string `json:"interface"`
	}
	if err := json.Unmarshal([]byte(p.Annotations["k8s.v1.cni.cncf.io/networks"]), &sel); err != nil {
		return "", fmt.Errorf("networks of %s: %w", pod, err)
	}
	b, err := json.Marshal(sel)
	return string(b), err
}

// launcherShape asks the API server (dry run, so through the webhook) for a
// pod like vm's launcher: owned by its VMI, two vhostmq networks, compute
// asking 2 queue pairs, annotation k=val.
func (s *kvSuite) launcherShape(ctx context.Context, v *kvVM, key, val string) (*corev1.Pod, error) {
	vmi, err := s.k.GetVMI(ctx, kvNS, v.name)
	if err != nil {
		return nil, err
	}
	two := resource.MustParse("2")
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "virt-launcher-shape-",
			Namespace:    kvNS,
			Annotations: map[string]string{
				"k8s.v1.cni.cncf.io/networks": fmt.Sprintf(`[{"name":"vhu-net","namespace":%q,"interface":"pod115dc3606fb"},{"name":"vhu-net","namespace":%q,"interface":"pod0123456789a"}]`, f.Namespace, f.Namespace),
				key:                           val,
			},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: v.name, UID: vmi.UID, Controller: &yes}},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "compute", Image: f.Image,
			Resources: corev1.ResourceRequirements{
				Limits:   corev1.ResourceList{libpod.QueuePairs: two},
				Requests: corev1.ResourceList{libpod.QueuePairs: two},
			},
		}}},
	}
	return f.Client.CoreV1().Pods(kvNS).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
}

// imageDigest is an image's digest in the first node's containerd ("" if
// it is not there).
func (s *kvSuite) imageDigest(ctx context.Context, ref string) string {
	GinkgoHelper()
	out, err := f.Ctr(ctx, "images", "ls")
	Expect(err).NotTo(HaveOccurred())
	for _, l := range strings.Split(out, "\n") {
		if fs := strings.Fields(l); len(fs) >= 3 && fs[0] == ref {
			return fs[2]
		}
	}
	return ""
}

// releaseObjects lists what carries the release's instance label:
// namespaced in the release's namespace and KubeVirt's, and cluster-wide.
func (s *kvSuite) releaseObjects(ctx context.Context) ([]string, error) {
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + kvRelease}
	gvr := func(g, v, r string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: g, Version: v, Resource: r}
	}
	roles, bindings := gvr("rbac.authorization.k8s.io", "v1", "roles"), gvr("rbac.authorization.k8s.io", "v1", "rolebindings")
	lists := []struct {
		ns  string
		gvr schema.GroupVersionResource
	}{
		{f.Namespace, gvr("apps", "v1", "daemonsets")}, {f.Namespace, gvr("apps", "v1", "deployments")},
		{f.Namespace, gvr("", "v1", "services")}, {f.Namespace, gvr("", "v1", "serviceaccounts")},
		{f.Namespace, gvr("", "v1", "secrets")}, {f.Namespace, gvr("", "v1", "configmaps")},
		{f.Namespace, roles}, {f.Namespace, bindings}, {f.Namespace, gvr("batch", "v1", "jobs")}, {f.Namespace, framework.NADResource},
		{"", gvr("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations")},
		{"", gvr("rbac.authorization.k8s.io", "v1", "clusterroles")}, {"", gvr("rbac.authorization.k8s.io", "v1", "clusterrolebindings")},
		{"kubevirt", roles}, {"kubevirt", bindings},
	}
	left := []string{}
	for _, l := range lists {
		items, err := s.k.Dyn.Resource(l.gvr).Namespace(l.ns).List(ctx, sel)
		if err != nil {
			return nil, fmt.Errorf("list %s in %q: %w", l.gvr.Resource, l.ns, err)
		}
		for _, it := range items.Items {
			left = append(left, l.gvr.Resource+"/"+it.GetNamespace()+"/"+it.GetName())
		}
	}
	return left, nil
}

// kvAllocDirs lists the device plugin's allocation entries under sockDir
// (qp-*, and .qp-* being made or removed).
func kvAllocDirs() []string {
	es, _ := os.ReadDir(sockDir)
	out := []string{}
	for _, e := range es {
		if strings.HasPrefix(e.Name(), "qp-") || strings.HasPrefix(e.Name(), ".qp-") {
			out = append(out, e.Name())
		}
	}
	return out
}

func kvSorted(ids []string) string { return framework.SortedCSV(strings.Join(ids, ",")) }

func kvReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// kvJobField is the first of fields in virsh domjobinfo's output ("" if
// none).
func kvJobField(out string, fields ...string) string {
	for _, want := range fields {
		for _, l := range strings.Split(out, "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == want {
				return strings.Join(strings.Fields(v), " ")
			}
		}
	}
	return ""
}
