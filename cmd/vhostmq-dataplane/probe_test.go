package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProbeReady: the readiness probe says ready only for the pod whose
// dataplane serves the API socket (during an upgrade the new pod's probe
// must not see the old pod's dataplane as its own), and not ready while
// nothing serves it.
func TestProbeReady(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "dataplane.yaml")
	api := filepath.Join(dir, "api.sock")
	yaml := fmt.Sprintf("cpus: [0]\napiSocket: %s\nstateDir: %s\n", api, filepath.Join(dir, "state"))
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	probe := func(pod string) error {
		cmd := exec.Command(os.Args[0], "--config", cfg, "--probe", "ready")
		cmd.Env = append(os.Environ(), "VHOSTMQ_TEST_AS_DATAPLANE=1", "POD_UID="+pod)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := probe("pod-a"); err == nil {
		t.Fatal("ready with no dataplane running")
	}
	cmd := exec.Command(os.Args[0], "--config", cfg)
	cmd.Env = append(os.Environ(), "VHOSTMQ_TEST_AS_DATAPLANE=1", "POD_UID=pod-a")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = probe("pod-a"); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("pod-a's probe against its own dataplane: %v", err)
	}
	err = probe("pod-b")
	if err == nil || !strings.Contains(err.Error(), `served by pod "pod-a"`) {
		t.Fatalf("pod-b's probe against pod-a's dataplane: %v; want not ready, naming pod-a", err)
	}
}
