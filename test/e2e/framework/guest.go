//go:build e2e

package framework

// QEMU guests in pods. A pod made with libpod.WithQEMU(f.QEMU(...)) runs the
// test guest of hack/guest under the host's QEMU on the vhost-user socket
// its CNI or DRA driver gave it; the guest does what its kernel command
// line says (vmq.role=client,spoof,pinger ...: see hack/guest/init) and
// reports on its serial console, a file on the host. There is no shell on
// the console: a guest's "commands" are its roles, given at boot, and
// their output is VHOSTMQ-RESULT lines, which Guest reads:
//
//	dir, err := f.GuestDir()
//	pod := libpod.New("vm-a", libpod.WithQueuePairs(4), libpod.WithNetwork("vhu-net"),
//		libpod.WithQEMU(f.QEMU("a", dir, libpod.NICFromNetworkStatus("net1"),
//			"vmq.ip=10.0.0.1/24 vmq.peer=10.0.0.2 vmq.role=client vmq.pings=10")))
//	...
//	g := f.Guest("a")
//	Eventually(f.QEMULaunch(ctx, "default", "vm-a")).Should(HaveField("Queues", 4))
//	Eventually(g.Await("link")).WithTimeout(150 * time.Second).Should(HaveKeyWithValue("state", "up"))
//	Eventually(g.Await("role-done", "role=client")).WithTimeout(150 * time.Second).Should(Not(BeNil()))
//	ping := g.Last("ping") // sent=10 received=10 rtt_avg_ms=...
//	Expect(ping.Int("received")).To(Equal(ping.Int("sent")), g.Tail(20))
//
// Pings that go on (vmq.role=pinger) print one VHOSTMQ-PING line per reply:
// Pings counts them, PingRTTs gives their round trips.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
	"github.com/vhostmq/vhostmq/test/e2e/libpod"
)

// GuestDir makes the folder the guests' serial logs go to, LogDir/guests
// (so they stay with the run's other logs), writable by QEMU's user in the
// pods (libpod.QEMUUser); a log of an earlier guest of the same name is
// removed when the guest is made (f.QEMU).
func (f *Framework) GuestDir() (string, error) {
	dir := filepath.Join(f.LogDir, "guests")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// every parent must let uid 107 through
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return "", fmt.Errorf("%s is not searchable by others (mode %v): QEMU (uid %d) cannot reach %s", d, fi.Mode().Perm(), libpod.QEMUUser, dir)
		}
	}
	return dir, os.Chown(dir, libpod.QEMUUser, libpod.QEMUUser)
}

// QEMU describes guest name for libpod.WithQEMU: the guest image of this
// run (GuestImage), its serial log in dir (from GuestDir), its NIC, more
// kernel command line words in args. The old serial log of name goes.
func (f *Framework) QEMU(name, dir string, nic libpod.NIC, args string) libpod.QEMU {
	_ = os.Remove(filepath.Join(dir, "serial-"+name+".log"))
	return libpod.QEMU{Name: name, Args: args, ImageDir: f.GuestImage, OutDir: dir, NIC: nic}
}

// Guest is the guest called name, whose serial log is in GuestDir.
func (f *Framework) Guest(name string) *Guest {
	return &Guest{Name: name, Serial: filepath.Join(f.LogDir, "guests", "serial-"+name+".log")}
}

// Launch is what the in-pod launcher (libpod.WithQEMU) started QEMU with,
// from its "launch:" line.
type Launch struct {
	MAC, Socket string
	Queues      int
	Slots       string // the pod's VHOSTMQ_QUEUE_SLOTS
}

var launchLine = regexp.MustCompile(`(?m)^launch: nic=\S* iface=\S* mac=(\S*) socket=(\S*) queues=(\d+) slots=(\S*)`)

// QEMULaunch observes the launcher's "launch:" line in the log of the
// pod's qemu container (an error until it is there, with the log so far).
func (f *Framework) QEMULaunch(ctx context.Context, ns, pod string) func() (Launch, error) {
	return func() (Launch, error) {
		b, err := f.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "qemu"}).DoRaw(ctx)
		if err != nil {
			return Launch{}, err
		}
		m := launchLine.FindStringSubmatch(string(b))
		if m == nil {
			return Launch{}, fmt.Errorf("no launch line in the log of %s/%s yet: %q", ns, pod, lastLines(string(b), 5))
		}
		q, _ := strconv.Atoi(m[3])
		return Launch{MAC: m[1], Socket: m[2], Queues: q, Slots: m[4]}, nil
	}
}

// Guest reads one guest's serial console.
type Guest struct {
	Name   string
	Serial string // the serial log on the host
}

// Result is one VHOSTMQ-RESULT line's key=value fields.
type Result map[string]string

// Int is key's value as an integer (-1 when missing or not a number).
func (r Result) Int(key string) int {
	n, err := strconv.Atoi(r[key])
	if err != nil {
		return -1
	}
	return n
}

// Log is the serial log so far, without the console's carriage returns
// ("" before QEMU made it).
func (g *Guest) Log() string {
	b, err := os.ReadFile(g.Serial)
	if err != nil {
		return ""
	}
	return strings.ReplaceAll(string(b), "\r", "")
}

// Tail is the last n lines of the log, as a Gomega description: pass it as
// an assertion's last argument and a failure shows what the guest said.
func (g *Guest) Tail(n int) func() string {
	return func() string {
		return fmt.Sprintf("guest %s, serial log %s ends:\n%s", g.Name, g.Serial, lastLines(g.Log(), n))
	}
}

// Results are the fields of every "VHOSTMQ-RESULT kind ..." line whose
// fields include all of where ("key=value" each), in order.
func (g *Guest) Results(kind string, where ...string) []Result {
	var out []Result
	for _, l := range strings.Split(g.Log(), "\n") {
		fs := strings.Fields(l)
		if len(fs) < 2 || fs[0] != "VHOSTMQ-RESULT" || fs[1] != kind {
			continue
		}
		r := Result{}
		for _, kv := range fs[2:] {
			if k, v, ok := strings.Cut(kv, "="); ok {
				r[k] = v
			}
		}
		if r.matches(where) {
			out = append(out, r)
		}
	}
	return out
}

func (r Result) matches(where []string) bool {
	for _, w := range where {
		k, v, _ := strings.Cut(w, "=")
		if r[k] != v {
			return false
		}
	}
	return true
}

// Last is the last Results(kind, where...) line (nil when none).
func (g *Guest) Last(kind string, where ...string) Result {
	rs := g.Results(kind, where...)
	if len(rs) == 0 {
		return nil
	}
	return rs[len(rs)-1]
}

// Await observes Last(kind, where...): an error until such a line is there,
// which holds the log's last lines (what a timeout then prints).
func (g *Guest) Await(kind string, where ...string) func() (Result, error) {
	return func() (Result, error) {
		if r := g.Last(kind, where...); r != nil {
			return r, nil
		}
		return nil, fmt.Errorf("no VHOSTMQ-RESULT %s %s from guest %s yet; %s", kind, strings.Join(where, " "), g.Name, g.Tail(10)())
	}
}

// WaitFor waits (at most timeout) for a Last(kind, where...) line and
// returns it; without Gomega.
func (g *Guest) WaitFor(ctx context.Context, timeout time.Duration, kind string, where ...string) (Result, error) {
	var r Result
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		r = g.Last(kind, where...)
		return r != nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", err, g.Tail(10)())
	}
	return r, nil
}

// Pings counts the guest's VHOSTMQ-PING replies (role pinger, watch).
func (g *Guest) Pings() int {
	return strings.Count("\n"+g.Log(), "\nVHOSTMQ-PING ok ")
}

// PingRTTs are the round trips (ms) of the replies after the first skip.
func (g *Guest) PingRTTs(skip int) []float64 {
	var rtts []float64
	n := 0
	for _, l := range strings.Split(g.Log(), "\n") {
		if !strings.HasPrefix(l, "VHOSTMQ-PING ok ") {
			continue
		}
		if n++; n <= skip {
			continue
		}
		for _, f := range strings.Fields(l) {
			if v, ok := strings.CutPrefix(f, "rtt_ms="); ok {
				if x, err := strconv.ParseFloat(v, 64); err == nil {
					rtts = append(rtts, x)
				}
			}
		}
	}
	return rtts
}

// MinAvgMax formats round trips as "min/avg/max" ms ("-" when none).
func MinAvgMax(rtts []float64) string {
	if len(rtts) == 0 {
		return "-"
	}
	s := append([]float64(nil), rtts...)
	sort.Float64s(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	return fmt.Sprintf("%.3f/%.3f/%.3f", s[0], sum/float64(len(s)), s[len(s)-1])
}

// QueueCounters are the guest's own per-queue packet counters of a
// guest-queues line (ethtool -S: rx_q0=..., tx_q0=...), by pair: index 0
// is what it received on the pair, 1 what it sent.
func QueueCounters(r Result) map[int][2]int64 {
	out := map[int][2]int64{}
	for k, v := range r {
		dir := 0
		q, ok := strings.CutPrefix(k, "rx_q")
		if !ok {
			if q, ok = strings.CutPrefix(k, "tx_q"); !ok {
				continue
			}
			dir = 1
		}
		pair, err1 := strconv.Atoi(q)
		n, err2 := strconv.ParseInt(v, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		c := out[pair]
		c[dir] = n
		out[pair] = c
	}
	return out
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// UsedServed checks the guest's own per-queue counters against its port's
// stats: every queue the guest used during its traffic (from its first
// guest-queues line of the traffic, or of session 0, to its last) was
// served on that pair by the dataplane, the port has pairs pairs, and
// some pair carried frames each way. Which queues a guest uses is its
// choice (XPS, the flow hash, where its threads ran). The error shows, per
// pair, the guest's counts beside the dataplane's.
func (g *Guest) UsedServed(st *agentv1.PortStats, pairs int) error {
	var first Result
	for _, r := range g.Results("guest-queues") {
		if r["phase"] == "traffic" || r["session"] == "0" {
			first = r
			break
		}
	}
	last := g.Last("guest-queues")
	if first == nil || fmt.Sprint(first) == fmt.Sprint(last) {
		return fmt.Errorf("guest %s: no per-queue counters before and after its traffic; %s", g.Name, g.Tail(10)())
	}
	dp := map[int][2]uint64{}
	for _, q := range st.GetQueues() {
		dp[int(q.GetPair())] = [2]uint64{q.GetRx().GetPackets(), q.GetTx().GetPackets()}
	}
	before, after := QueueCounters(first), QueueCounters(last)
	var table []string
	bad, rx, tx := len(dp) != pairs, false, false
	for p := range pairs {
		grx, gtx := after[p][0]-before[p][0], after[p][1]-before[p][1]
		table = append(table, fmt.Sprintf("pair %d: guest tx %d / dataplane tx %d, guest rx %d / dataplane rx %d", p, gtx, dp[p][1], grx, dp[p][0]))
		bad = bad || (gtx > 0 && dp[p][1] == 0) || (grx > 0 && dp[p][0] == 0)
		rx, tx = rx || dp[p][0] > 0, tx || dp[p][1] > 0
	}
	ginkgo.GinkgoWriter.Printf("guest %s (%d pairs at the dataplane):\n  %s\n", g.Name, len(dp), strings.Join(table, "\n  "))
	if bad || !rx || !tx {
		return fmt.Errorf("guest %s, %d pairs at the dataplane, want %d:\n  %s", g.Name, len(dp), pairs, strings.Join(table, "\n  "))
	}
	return nil
}
