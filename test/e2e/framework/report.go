//go:build e2e

package framework

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	corev1 "k8s.io/api/core/v1"
)

// SaveDiagnostics writes what one needs to see why a spec failed into
// LogDir/<spec>/: the pods (kubectl get pods -A -o wide), the events, the
// node's status, the vhostmq pods' dataplane and device-plugin logs
// (current and previous), the kubelet's device-manager lines, the node's
// socket folders and, with KubeVirt, the VMIs and their launchers' logs.
// The suite calls it from ReportAfterEach for every failed spec; it never
// fails itself (what it cannot get, it writes down).
func (f *Framework) SaveDiagnostics(report ginkgo.SpecReport) string {
	dir := f.DiagnosticsDir(report)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	save := func(name, content string, err error) {
		if err != nil {
			content += "\n--- error: " + err.Error() + "\n"
		}
		_ = os.WriteFile(filepath.Join(dir, name), []byte(strings.TrimRight(content, "\n")+"\n"), 0o644)
	}
	_ = os.WriteFile(filepath.Join(dir, "failure.txt"), []byte(report.FullText()+"\n\n"+report.Failure.Message+"\n\n"+report.Failure.Location.String()+"\n"), 0o644)
	out, err := f.Kubectl(ctx, "get", "pods", "-A", "-o", "wide")
	save("pods.txt", out, err)
	out, err = f.Kubectl(ctx, "get", "events", "-A", "--sort-by", ".lastTimestamp")
	save("events.txt", out, err)
	out, err = f.Kubectl(ctx, "get", "node", f.Node, "-o", "jsonpath={.status.capacity}{\"\\n\"}{.status.allocatable}{\"\\n\"}{range .status.conditions[*]}{.type}={.status} {.lastHeartbeatTime}{\"\\n\"}{end}")
	save("node.txt", out, err)
	for _, c := range []string{"dataplane", "deviceplugin"} {
		out, err = f.Kubectl(ctx, "-n", f.Namespace, "logs", "-l", "app.kubernetes.io/name=vhostmq", "-c", c, "--tail", "300", "--prefix")
		save(c+".log", out, err)
		out, err = f.Kubectl(ctx, "-n", f.Namespace, "logs", "-l", "app.kubernetes.io/name=vhostmq", "-c", c, "--previous", "--tail", "100", "--prefix")
		save(c+".previous.log", out, err)
	}
	save("kubelet-devicemanager.log", grepFile(filepath.Join(f.ClusterLogs, "kubelet.log"), regexp.MustCompile(`(?i)device.?plugin|devicemanager|vhostmq`), 200), nil)
	out, err = Run(ctx, "find", "/var/run/vhostmq", "/var/run/k8s.cni.cncf.io/devinfo", "-maxdepth", "3", "-ls")
	save("node-folders.txt", out, err)
	f.saveKubeVirt(ctx, save) // VMs, VMIs, launchers (kubevirt.go)
	return dir
}

// DiagnosticsDir is the folder of a spec's diagnostics, for a Describe
// that adds its own to what SaveDiagnostics writes.
func (f *Framework) DiagnosticsDir(report ginkgo.SpecReport) string {
	return filepath.Join(f.LogDir, fileName(report.FullText()))
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func fileName(s string) string {
	s = strings.Trim(unsafeName.ReplaceAllString(s, "_"), "_")
	if len(s) > 120 {
		s = s[:120]
	}
	return s
}

// grepFile returns the last max lines of file that match re.
func grepFile(file string, re *regexp.Regexp, max int) string {
	fh, err := os.Open(file)
	if err != nil {
		return err.Error()
	}
	defer fh.Close()
	var lines []string
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if re.MatchString(sc.Text()) {
			lines = append(lines, sc.Text())
			if len(lines) > max {
				lines = lines[1:]
			}
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// FollowLogs copies a container's log into LogDir/name until the container
// ends (its pod deleted) or ctx is done; call the returned function to wait
// for the copy to finish (an error if it did not within timeout). For a log
// that must outlive its pod.
func (f *Framework) FollowLogs(ctx context.Context, ns, pod, container, name string) (wait func(timeout time.Duration) error, err error) {
	if err := os.MkdirAll(f.LogDir, 0o755); err != nil {
		return nil, err
	}
	out, err := os.Create(filepath.Join(f.LogDir, name))
	if err != nil {
		return nil, err
	}
	rc, err := f.Stream.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, Follow: true}).Stream(ctx)
	if err != nil {
		out.Close()
		return nil, fmt.Errorf("logs of %s/%s -c %s: %w", ns, pod, container, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(out, rc)
		rc.Close()
		out.Close()
	}()
	return func(timeout time.Duration) error {
		select {
		case <-done:
			return nil
		case <-time.After(timeout):
			return fmt.Errorf("the log of %s/%s -c %s did not end within %s", ns, pod, container, timeout)
		}
	}, nil
}

// SaveLogs writes a container's log, as it is now, into LogDir/name.
func (f *Framework) SaveLogs(ctx context.Context, ns, pod, container, name string) error {
	if err := os.MkdirAll(f.LogDir, 0o755); err != nil {
		return err
	}
	b, err := f.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(f.LogDir, name), b, 0o644)
}
