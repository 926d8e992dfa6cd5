package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func TestReleaseGone(t *testing.T) {
	gr := schema.GroupResource{Group: "apps", Resource: "daemonsets"}
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		ds   *appsv1.DaemonSet
		err  error
		want bool
	}{
		{name: "upgrade: the DaemonSet is there", ds: &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "vhostmq", Namespace: "ns"}}, want: false},
		{name: "uninstall: deleted", want: true},
		{name: "uninstall: being deleted", ds: &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "vhostmq", Namespace: "ns", DeletionTimestamp: &now, Finalizers: []string{"x"}}}, want: true},
		{name: "uninstall: service account deleted", err: apierrors.NewUnauthorized("token"), want: true},
		{name: "uninstall: RBAC deleted", err: apierrors.NewForbidden(gr, "vhostmq", errors.New("no")), want: true},
		{name: "API server unreachable", err: errors.New("dial tcp: connection refused"), want: false},
		{name: "API server overloaded", err: apierrors.NewTooManyRequests("slow down", 1), want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			if tc.ds != nil {
				cs = fake.NewClientset(tc.ds)
			}
			if tc.err != nil {
				cs.PrependReactor("get", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.err
				})
			}
			got, why := releaseGone(context.Background(), cs, "ns", "vhostmq")
			if got != tc.want {
				t.Fatalf("releaseGone = %v (%s), want %v", got, why, tc.want)
			}
		})
	}
}

// node lays out what the chart and the agent put on a node.
func node(t *testing.T, statePorts string) nodePaths {
	t.Helper()
	root := t.TempDir()
	p := nodePaths{
		binDir: filepath.Join(root, "opt/cni/bin"), plugin: "vhostmq-cni",
		confDir:  filepath.Join(root, "etc/cni/net.d/vhostmq.d"),
		stateDir: filepath.Join(root, "var/lib/vhostmq"), agentSock: filepath.Join(root, "run/vhostmq-agent/api.sock"),
		socketRoot: filepath.Join(root, "var/run/vhostmq"),
		agentWait:  2 * time.Second, agentPoll: 10 * time.Millisecond,
	}
	for _, d := range []string{p.binDir, p.confDir, p.stateDir, filepath.Dir(p.agentSock), p.socketRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(p.binDir, "vhostmq-cni"), "elf")
	write(filepath.Join(p.binDir, "bridge"), "another plugin")
	for _, f := range []string{"vhostmq.kubeconfig", "token", "ca.crt"} {
		write(filepath.Join(p.confDir, f), f)
	}
	write(filepath.Join(p.stateDir, "ports.json"), `{"schemaVersion":1,"ports":[`+statePorts+`]}`)
	// what an agent killed after a handoff leaves: its handoff socket
	// file and the lock
	write(filepath.Join(p.stateDir, "handoff.sock"), "")
	write(filepath.Join(p.stateDir, "dataplane.lock"), "")
	return p
}

func exists(path string) bool { _, err := os.Lstat(path); return err == nil }

func TestRemoveNodeFilesNoPorts(t *testing.T) {
	p := node(t, "")
	// the agent stops 100 ms into the wait: its state goes only after that
	ln, err := net.Listen("unix", p.agentSock)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		ln.Close()
	}()
	if err := removeNodeFiles(p, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{filepath.Join(p.binDir, "vhostmq-cni"), p.confDir, p.stateDir, filepath.Dir(p.agentSock), p.socketRoot} {
		if exists(gone) {
			t.Errorf("%s is left", gone)
		}
	}
	if !exists(filepath.Join(p.binDir, "bridge")) || !exists(p.binDir) {
		t.Error("the CNI bin directory and other plugins must stay")
	}
}

func TestRemoveNodeFilesKeepsPortsInUse(t *testing.T) {
	p := node(t, `{"id":"vm1"}`)
	qp := filepath.Join(p.socketRoot, "qp-1234")
	os.MkdirAll(qp, 0o770)
	if err := removeNodeFiles(p, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Join(p.binDir, "vhostmq-cni")) || exists(p.confDir) {
		t.Error("the plugin and its kubeconfig go even when VMs remain")
	}
	for _, kept := range []string{filepath.Join(p.stateDir, "ports.json"), qp} {
		if !exists(kept) {
			t.Errorf("%s removed while a port is listed", kept)
		}
	}
}

func TestRemoveNodeFilesAgentStillRunning(t *testing.T) {
	p := node(t, "")
	p.agentWait = 200 * time.Millisecond
	ln, err := net.Listen("unix", p.agentSock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = removeNodeFiles(p, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("an agent that still answers must be reported")
	}
	if !exists(filepath.Join(p.stateDir, "ports.json")) {
		t.Error("the state of a running agent must stay")
	}
}
