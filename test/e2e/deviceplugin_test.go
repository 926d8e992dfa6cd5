//go:build e2e

package e2e

// The device plugin on the one-node test cluster, ported from
// hack/cluster/test-deviceplugin.sh (its checks (a)-(f), one It each, named
// as the script named them). The bring-up (cluster up, image imported, the
// vhostmq DaemonSet of hack/cluster/manifests/vhostmq.yaml applied) is
// bash: hack/cluster/e2e.sh. The specs run in order and go on after a
// failure, as the script did: (b) needs (a)'s CPU count, (c) and (d) need
// (b)'s pods, (f) deletes the DaemonSet.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/test/e2e/framework"
	"github.com/vhostmq/vhostmq/test/e2e/libpod"
)

const (
	dsSelector = "app.kubernetes.io/name=vhostmq"
	sockDir    = "/var/run/vhostmq"                    // the plugin's socket root, a hostPath
	devinfoDir = "/var/run/k8s.cni.cncf.io/devinfo/dp" // its device-info files
)

var _ = Describe("device plugin", Ordered, ContinueOnFailure, Label("deviceplugin"), func() {
	res := libpod.QueuePairs
	eight := framework.Resource{Capacity: "8", Allocatable: "8"}
	var (
		ncpu   int    // the agent's CPUs, from (a)
		s4, s2 string // VHOSTMQ_QUEUE_SLOTS of qp4 and qp2, from (b)
		qp4Dir string // qp4's allocation folder under sockDir, from (f)
	)

	BeforeAll(func(ctx SpecContext) {
		// leftovers of an earlier run on a cluster that stayed up
		Expect(f.DeleteLabelled(ctx, "default", "app="+libpod.TestLabel)).To(Succeed())
		DeferCleanup(func() error { return f.DeleteLabelled(bg(), "default", "app="+libpod.TestLabel) })
	})

	Context("(a) the DaemonSet registers vhostmq.io/queue-pairs", func() {
		It("(a) DaemonSet pod Running", func(ctx SpecContext) {
			Eventually(f.PodsReady(ctx, f.Namespace, dsSelector)).WithTimeout(90 * time.Second).WithPolling(time.Second).
				Should(Equal("all ready"))
		})

		It("(a) node capacity and allocatable vhostmq.io/queue-pairs = 8", func(ctx SpecContext) {
			Eventually(f.NodeResource(ctx, f.Node, res)).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).
				Should(Equal(eight))
		})

		It("(a) vhostmqctl capacity slots_total = node allocatable", func(ctx SpecContext) {
			agent, conn, err := f.Agent()
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(conn.Close)
			capacity, err := agent.GetCapacity(ctx, &agentv1.GetCapacityRequest{})
			Expect(err).NotTo(HaveOccurred(), "GetCapacity on %s", f.AgentSocket)
			ncpu = len(capacity.GetCpus())
			GinkgoWriter.Printf("agent: slots_total %d on %d CPUs\n", capacity.GetSlotsTotal(), ncpu)
			node, err := f.NodeResource(ctx, f.Node, res)()
			Expect(err).NotTo(HaveOccurred())
			Expect(strconv.Itoa(int(capacity.GetSlotsTotal()))).To(Equal(node.Allocatable),
				"the agent's slots_total against the node's allocatable %s", res)
		})
	})

	Context("(b) pods get queue slots", func() {
		It("(b) pod asking for 4 is Running", func(ctx SpecContext) {
			_, err := f.CreatePod(ctx, libpod.New("qp4", libpod.WithQueuePairs(4)))
			Expect(err).NotTo(HaveOccurred())
			Eventually(f.PodStateOf(ctx, "default", "qp4")).WithTimeout(90 * time.Second).
				Should(framework.BeReadyOn(f.Node))
		})

		It("(b) qp4 has a mount at /var/run/vhostmq", func(ctx SpecContext) {
			out, err := f.Kubectl(ctx, "exec", "qp4", "--", "sh", "-c", "grep ' "+sockDir+" ' /proc/mounts && test -d "+sockDir)
			Expect(err).NotTo(HaveOccurred())
			Expect(out).To(ContainSubstring(" " + sockDir + " "))
		})

		It("(b) qp4: 4 slots spread over the CPUs (<= ceil(4/CPUs) per CPU)", func(ctx SpecContext) {
			var err error
			s4, err = f.PodEnv(ctx, "default", "qp4", "VHOSTMQ_QUEUE_SLOTS")
			Expect(err).NotTo(HaveOccurred())
			GinkgoWriter.Printf("qp4 VHOSTMQ_QUEUE_SLOTS=%s\n", s4)
			Expect(spread(s4, 4, ncpu)).To(Succeed())
		})

		It("(b) pod asking for 2 is Running", func(ctx SpecContext) {
			_, err := f.CreatePod(ctx, libpod.New("qp2", libpod.WithQueuePairs(2)))
			Expect(err).NotTo(HaveOccurred())
			Eventually(f.PodStateOf(ctx, "default", "qp2")).WithTimeout(90 * time.Second).
				Should(framework.BeReadyOn(f.Node))
		})

		It("(b) qp2: 2 slots on distinct CPUs", func(ctx SpecContext) {
			var err error
			s2, err = f.PodEnv(ctx, "default", "qp2", "VHOSTMQ_QUEUE_SLOTS")
			Expect(err).NotTo(HaveOccurred())
			GinkgoWriter.Printf("qp2 VHOSTMQ_QUEUE_SLOTS=%s\n", s2)
			Expect(spread(s2, 2, ncpu)).To(Succeed())
		})

		It("(b) qp4 and qp2 share no slot", func() {
			Expect(spread(s4+","+s2, 6, ncpu)).To(Succeed())
		})
	})

	Context("(c) kubelet restart: re-registration", func() {
		var kstart time.Time

		// Done when allocatable is 8 in a status the new kubelet posted:
		// after a 0 was seen, or with a heartbeat later than its start.
		It("(c) allocatable back to 8 in a status the new kubelet posted", func(ctx SpecContext) {
			_, err := framework.Run(ctx, f.ClusterSh, "restart-kubelet")
			Expect(err).NotTo(HaveOccurred())
			kstart, err = readStamp(filepath.Join(f.ClusterRun, "kubelet.start"))
			Expect(err).NotTo(HaveOccurred())
			seenDrop := false
			Eventually(func() (framework.NodeStatus, error) {
				s, err := f.ObserveNodeStatus(ctx, f.Node, res)
				if err == nil && s.Allocatable != "8" && !seenDrop {
					seenDrop = true
					GinkgoWriter.Printf("allocatable %s at +%.1f s\n", s.Allocatable, time.Since(kstart).Seconds())
				}
				return s, err
			}).WithTimeout(60*time.Second).WithPolling(100*time.Millisecond).Should(Satisfy(func(s framework.NodeStatus) bool {
				return s.Allocatable == "8" && (seenDrop || s.Heartbeat.Unix() > kstart.Unix())
			}), "allocatable 8 posted by the kubelet started at %s", kstart.Format(time.RFC3339Nano))
			took := time.Since(kstart)
			AddReportEntry("re-registration: allocatable 8 in the API after the kubelet's start", took.Round(10*time.Millisecond).String())
			if l := os.Getenv("VHOSTMQ_TEST_REREG_LIMIT"); l != "" {
				limit, err := strconv.ParseFloat(l, 64)
				Expect(err).NotTo(HaveOccurred(), "VHOSTMQ_TEST_REREG_LIMIT")
				Expect(took.Seconds()).To(BeNumerically("<", limit), "seconds until allocatable was back")
			}
		})

		// registration through kubelet.sock, or through the plugin watcher
		// (plugins_registry/): the new kubelet logs one of these
		It("(c) the plugin registered with the new kubelet (kubelet log)", func() {
			line, err := registrationSinceRestart(filepath.Join(f.ClusterLogs, "kubelet.log"), string(res))
			Expect(err).NotTo(HaveOccurred())
			Expect(line).NotTo(BeEmpty(), "a registration of %s after the last '=== kubelet restarted' in kubelet.log", res)
			if t, err := time.ParseInLocation("15:04:05.000000", strings.Fields(line)[1], time.Local); err == nil && !kstart.IsZero() {
				y, m, d := kstart.Date()
				t = time.Date(y, m, d, t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.Local)
				AddReportEntry("re-registration: plugin registered (kubelet log) after the kubelet's start", t.Sub(kstart).Round(10*time.Millisecond).String())
			}
		})

		It("(c) qp4 and qp2 still Running with the same slots", func(ctx SpecContext) {
			for pod, want := range map[string]string{"qp4": s4, "qp2": s2} {
				Expect(f.PodStateOf(ctx, "default", pod)()).To(framework.BeReadyOn(f.Node), pod)
				Expect(f.PodEnv(ctx, "default", pod, "VHOSTMQ_QUEUE_SLOTS")).To(And(Not(BeEmpty()), Equal(want)), pod)
			}
		})
	})

	Context("(d) dataplane killed: devices unhealthy, then back", func() {
		var (
			killed   time.Time
			restarts int32
		)

		It("(d) allocatable 0 after the kill", func(ctx SpecContext) {
			dp, err := f.ContainerOf(ctx, f.Namespace, dsSelector, "dataplane")()
			Expect(err).NotTo(HaveOccurred())
			restarts = dp.Restarts
			pid, err := f.ContainerPID(ctx, dp.ID)
			Expect(err).NotTo(HaveOccurred(), "the dataplane container's process")
			Expect(framework.Comm(pid)).To(HavePrefix("vhostmq-datapla"), "comm of pid %d (container %s)", pid, dp.ID)
			GinkgoWriter.Printf("dataplane container %.25s pid %d, restarts %d\n", dp.ID, pid, restarts)
			// The devices are unhealthy for about as long as the kubelet takes
			// to restart the container (0.7-1.1 s measured), and the kubelet
			// posts the node's status once a second: a kill at a random time
			// may fall between two posts and no 0 ever reaches the API. So
			// the kill comes 0.4 s after a post, and the next post 0.6 s later
			// falls inside the unhealthy time.
			Expect(f.NextNodeStatus(ctx, f.Node, 10*time.Second)).To(Succeed())
			time.Sleep(400 * time.Millisecond)
			Expect(syscall.Kill(pid, syscall.SIGKILL)).To(Succeed())
			killed = time.Now()
			Eventually(f.NodeResource(ctx, f.Node, res)).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).
				Should(HaveField("Allocatable", "0"))
			took := time.Since(killed)
			AddReportEntry("dataplane kill: allocatable 0 after", took.Round(10*time.Millisecond).String())
			if l := os.Getenv("VHOSTMQ_TEST_UNHEALTHY_LIMIT"); l != "" {
				limit, err := strconv.ParseFloat(l, 64)
				Expect(err).NotTo(HaveOccurred(), "VHOSTMQ_TEST_UNHEALTHY_LIMIT")
				Expect(took.Seconds()).To(BeNumerically("<=", limit), "seconds until allocatable was 0")
			}
		})

		It("(d) allocatable back to 8 after the container restart", func(ctx SpecContext) {
			Expect(killed).NotTo(BeZero(), "the dataplane was killed")
			Eventually(f.NodeResource(ctx, f.Node, res)).WithTimeout(120 * time.Second).WithPolling(200 * time.Millisecond).
				Should(Equal(eight))
			AddReportEntry("dataplane kill: allocatable 8 again after", time.Since(killed).Round(10*time.Millisecond).String())
		})

		It("(d) dataplane container restarted", func(ctx SpecContext) {
			Expect(f.ContainerOf(ctx, f.Namespace, dsSelector, "dataplane")()).
				To(HaveField("Restarts", BeNumerically(">", restarts)))
		})
	})

	Context("(e) a pod asking for 9 stays Pending", func() {
		It("(e) FailedScheduling event says Insufficient vhostmq.io/queue-pairs", func(ctx SpecContext) {
			_, err := f.CreatePod(ctx, libpod.New("qp9", libpod.WithQueuePairs(9)))
			Expect(err).NotTo(HaveOccurred())
			Eventually(f.EventMessages(ctx, "default", "qp9", "FailedScheduling")).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).
				Should(ContainElement(ContainSubstring("Insufficient " + string(res))))
		})

		It("(e) qp9 is Pending and not bound to the node", func(ctx SpecContext) {
			Expect(f.PodStateOf(ctx, "default", "qp9")()).To(Equal(framework.PodState{Phase: corev1.PodPending}))
		})
	})

	// Two ways an allocation goes: (1) its pod is deleted while the plugin
	// runs: the plugin reclaims it once the kubelet's pod-resources API no
	// longer lists it (after a grace period for young allocations: Allocate
	// runs before the container exists); (2) the pods and then the DaemonSet
	// are deleted at once: the plugin reclaims on its way out.
	Context("(f) qp2 deleted: its allocation is reclaimed while the plugin runs", func() {
		It("(f) qp2's allocation reclaimed after its pod was deleted", func(ctx SpecContext) {
			// qp4's folder: the source of its /var/run/vhostmq bind mount
			qp4, err := f.Client.CoreV1().Pods("default").Get(ctx, "qp4", metav1.GetOptions{})
			Expect(err).NotTo(HaveOccurred())
			Expect(qp4.Status.ContainerStatuses).NotTo(BeEmpty())
			pid, err := f.ContainerPID(ctx, qp4.Status.ContainerStatuses[0].ContainerID)
			Expect(err).NotTo(HaveOccurred())
			qp4Dir, err = mountSource(pid, sockDir)
			Expect(err).NotTo(HaveOccurred())
			dirs := allocDirs()
			GinkgoWriter.Printf("allocation folders: %v (qp4: %s)\n", dirs, qp4Dir)
			Expect(dirs).To(ContainElement(qp4Dir))
			others := slices.DeleteFunc(slices.Clone(dirs), func(d string) bool { return d == qp4Dir })
			Expect(others).To(HaveLen(1), "qp2's folder: the one allocation folder that is not qp4's")
			qp2Dir := others[0]

			Expect(f.DeletePods(ctx, "default", 60*time.Second, "qp2")).To(Succeed())
			deleted := time.Now()
			timeout := 90 * time.Second
			if v := os.Getenv("VHOSTMQ_TEST_RECLAIM_TIMEOUT"); v != "" {
				s, err := strconv.Atoi(v)
				Expect(err).NotTo(HaveOccurred(), "VHOSTMQ_TEST_RECLAIM_TIMEOUT")
				timeout = time.Duration(s) * time.Second
			}
			Eventually(allocDirs).WithTimeout(timeout).WithPolling(500*time.Millisecond).
				ShouldNot(ContainElement(qp2Dir), "qp2's allocation %s", qp2Dir)
			AddReportEntry("freed allocation reclaimed after its pod was deleted", time.Since(deleted).Round(100*time.Millisecond).String())
		})

		It("(f) qp4's allocation (in use) kept", func() {
			Expect(qp4Dir).NotTo(BeEmpty())
			// the reclaim pass that took qp2's must not take the one in use
			Consistently(allocDirs).WithTimeout(time.Second).WithPolling(100 * time.Millisecond).
				Should(ContainElement(qp4Dir))
		})
	})

	Context("(f) qp4, qp9 and right after them the DaemonSet deleted", func() {
		It("(f) no allocation folders or files under /var/run/vhostmq", func(ctx SpecContext) {
			ds, err := f.ContainerOf(ctx, f.Namespace, dsSelector, "deviceplugin")()
			Expect(err).NotTo(HaveOccurred())
			// the plugin's log to its last line (the pod's log goes with the pod)
			waitLog, err := f.FollowLogs(ctx, f.Namespace, ds.Pod, "deviceplugin", "deviceplugin.log")
			Expect(err).NotTo(HaveOccurred())
			Expect(f.SaveLogs(ctx, f.Namespace, ds.Pod, "dataplane", "dataplane.log")).To(Succeed())
			Expect(f.DeletePods(ctx, "default", 60*time.Second, "qp4", "qp9")).To(Succeed())
			_, err = f.Kubectl(ctx, "delete", "-f", f.Manifest, "--wait=true", "--timeout", "90s")
			Expect(err).NotTo(HaveOccurred())
			Expect(waitLog(30*time.Second)).To(Succeed(), "the plugin's log ends with its pod")
			Eventually(leftovers(sockDir, func(fi os.FileInfo) bool { return fi.Mode()&os.ModeSocket != 0 })).
				WithTimeout(10*time.Second).WithPolling(500*time.Millisecond).Should(BeEmpty(),
				"anything but sockets under %s (the agent's api.sock stays)", sockDir)
		})

		It("(f) no files in /var/run/k8s.cni.cncf.io/devinfo/dp", func() {
			Eventually(leftovers(devinfoDir, func(os.FileInfo) bool { return false })).
				WithTimeout(5 * time.Second).WithPolling(500 * time.Millisecond).Should(BeEmpty())
		})
	})
})

// spread checks a VHOSTMQ_QUEUE_SLOTS value: n distinct slot IDs
// c<cpu>-s<n>, no CPU with more than ceil(n/ncpu) of them.
func spread(slots string, n, ncpu int) error {
	ids := slices.DeleteFunc(strings.Split(slots, ","), func(s string) bool { return s == "" })
	if len(ids) != n {
		return fmt.Errorf("want %d slots, got %d: %q", n, len(ids), slots)
	}
	perCPU := map[string]int{}
	seen := map[string]bool{}
	for _, id := range ids {
		m := slotID.FindStringSubmatch(id)
		if m == nil {
			return fmt.Errorf("bad slot ID %q in %q", id, slots)
		}
		if seen[id] {
			return fmt.Errorf("duplicate slot %q in %q", id, slots)
		}
		seen[id] = true
		perCPU[m[1]]++
	}
	if ncpu <= 0 {
		return fmt.Errorf("the agent's CPU count is unknown ((a) failed?)")
	}
	for cpu, k := range perCPU {
		if k > (n+ncpu-1)/ncpu {
			return fmt.Errorf("%d slots on CPU %s (%d CPUs): %q", k, cpu, ncpu, slots)
		}
	}
	return nil
}

var slotID = regexp.MustCompile(`^c([0-9]+)-s[0-9]+$`)

// readStamp reads a `date +%s.%N` file.
func readStamp(file string) (time.Time, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return time.Time{}, err
	}
	s, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", file, err)
	}
	return time.Unix(0, int64(s*1e9)), nil
}

// registrationSinceRestart: the first kubelet log line after the last
// restart marker of cluster.sh that shows res registering.
func registrationSinceRestart(file, res string) (string, error) {
	fh, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer fh.Close()
	re := regexp.MustCompile(`Got registration request from device plugin with resource.*` + regexp.QuoteMeta(res) +
		`|Registered client" name="` + regexp.QuoteMeta(res) + `"`)
	found := ""
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		switch l := sc.Text(); {
		case strings.HasPrefix(l, "=== kubelet restarted"):
			found = "-"
		case found == "-" && re.MatchString(l):
			found = l
		}
	}
	if found == "-" {
		found = ""
	}
	return found, sc.Err()
}

// mountSource is the base name of the host folder mounted at target in
// process pid's mount namespace (mountinfo's root field).
func mountSource(pid int, target string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		fs := strings.Fields(l)
		if len(fs) > 4 && fs[4] == target {
			return filepath.Base(fs[3]), nil
		}
	}
	return "", fmt.Errorf("no mount at %s in pid %d", target, pid)
}

// allocDirs lists the allocation folders under sockDir.
func allocDirs() []string {
	es, _ := os.ReadDir(sockDir)
	dirs := []string{}
	for _, e := range es {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	return dirs
}

// leftovers observes what is under dir (recursively) but what skip allows.
func leftovers(dir string, skip func(os.FileInfo) bool) func() []string {
	return func() []string {
		left := []string{}
		_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err != nil || p == dir || skip(fi) {
				return nil
			}
			left = append(left, p)
			return nil
		})
		return left
	}
}
