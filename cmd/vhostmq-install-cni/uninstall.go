package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/agent"
)

// An uninstall and an upgrade look the same to a container: SIGTERM. What
// tells them apart is the DaemonSet: an upgrade (or a drain, or a deleted
// pod) leaves it in place, `helm uninstall` deletes it, and then the
// release's service account and RBAC, so our own credentials stop working.
// Only then is what the chart put on the node removed; a running ADD or a
// VM never loses its plugin in an upgrade.

// releaseGone asks the API server whether the DaemonSet that runs this pod
// is gone or going. A transport error is "no": removing the plugin from a
// node whose API server is briefly unreachable would break every pod
// started after it.
func releaseGone(ctx context.Context, cs kubernetes.Interface, namespace, name string) (bool, string) {
	ds, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, fmt.Sprintf("DaemonSet %s/%s is gone", namespace, name)
	case apierrors.IsUnauthorized(err), apierrors.IsForbidden(err):
		return true, fmt.Sprintf("our service account can no longer read DaemonSet %s/%s (%s): the release's RBAC is removed", namespace, name, apierrors.ReasonForError(err))
	case err != nil:
		return false, fmt.Sprintf("cannot tell (%v): keeping everything", err)
	case ds.DeletionTimestamp != nil:
		return true, fmt.Sprintf("DaemonSet %s/%s is being deleted", namespace, name)
	}
	return false, fmt.Sprintf("DaemonSet %s/%s is still there (upgrade or pod restart)", namespace, name)
}

// nodePaths are the host paths, as mounted in this container, that an
// uninstall empties.
type nodePaths struct {
	binDir, plugin       string // the CNI bin directory and the plugin's name
	confDir              string // the plugin's kubeconfig directory
	stateDir, agentSock  string // the node agent's state and API socket
	socketRoot           string // per-allocation socket directories
	agentWait, agentPoll time.Duration
}

// removeNodeFiles removes the CNI plugin and its kubeconfig at once, then
// waits for the node agent to stop (its API socket stops answering) and,
// if the agent's state lists no port, removes the state file and every
// directory the chart created that is now empty. Ports still listed mean
// VMs still use them: their state is kept and reported.
func removeNodeFiles(p nodePaths, log *slog.Logger) error {
	var errs []error
	rm := func(path string) {
		switch err := os.Remove(path); {
		case err == nil:
			log.Info("removed", "path", path)
		case os.IsNotExist(err), errors.Is(err, unix.EBUSY): // EBUSY: our own mount point
		default:
			errs = append(errs, err)
		}
	}
	rm(filepath.Join(p.binDir, p.plugin))
	for _, f := range []string{"vhostmq.kubeconfig", "token", "ca.crt"} {
		rm(filepath.Join(p.confDir, f))
	}
	rmEmptyDir(p.confDir, rm)

	if p.stateDir == "" {
		return errors.Join(errs...)
	}
	deadline := time.Now().Add(p.agentWait)
	for agentAnswers(p.agentSock) && time.Now().Before(deadline) {
		time.Sleep(p.agentPoll)
	}
	if agentAnswers(p.agentSock) {
		errs = append(errs, fmt.Errorf("the node agent still answers on %s after %v: its state is kept", p.agentSock, p.agentWait))
		return errors.Join(errs...)
	}
	n, err := agent.SavedPorts(p.stateDir)
	if err != nil {
		errs = append(errs, fmt.Errorf("reading the agent's state: %w (kept)", err))
		return errors.Join(errs...)
	}
	if n > 0 {
		log.Warn("the node agent's state lists ports that VMs may still use; keeping it and their sockets (delete those VMs, then the state directory)", "ports", n, "stateDir", p.stateDir)
		return errors.Join(errs...)
	}
	for _, f := range []string{agent.StateFileName, agent.HandoffSocketName, agent.LockFileName} {
		rm(filepath.Join(p.stateDir, f)) // the sockets: stale ones of an agent that did not get to remove them
	}
	rm(p.agentSock)
	for _, d := range []string{p.stateDir, filepath.Dir(p.agentSock), p.socketRoot} {
		rmEmptyDir(d, rm)
	}
	return errors.Join(errs...)
}

// rmEmptyDir removes dir only when nothing is in it. A directory this
// container has mounted (a hostPath volume) cannot be removed from inside
// it: the empty directory stays on the host, which holds nothing.
func rmEmptyDir(dir string, rm func(string)) {
	if dir == "" {
		return
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return
	}
	rm(dir)
}

func agentAnswers(sock string) bool {
	c, err := net.DialTimeout("unix", sock, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// onTermination runs when the pod is stopped: it removes the node's files
// only if the release is gone.
func onTermination(daemonSet string, p nodePaths, log *slog.Logger) {
	ns, err := os.ReadFile(filepath.Join(saDir, "namespace"))
	if err != nil {
		log.Error("cannot read our namespace; keeping the node's files", "err", err)
		return
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Error("no in-cluster config; keeping the node's files", "err", err)
		return
	}
	cfg.Timeout = 3 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Error("no API client; keeping the node's files", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	gone, why := releaseGone(ctx, cs, strings.TrimSpace(string(ns)), daemonSet)
	if !gone {
		log.Info("stopping; the node's files stay", "why", why)
		return
	}
	log.Info("uninstall: removing what vhostmq put on this node", "why", why)
	if err := removeNodeFiles(p, log); err != nil {
		log.Error("uninstall left something behind", "err", err)
	}
}
