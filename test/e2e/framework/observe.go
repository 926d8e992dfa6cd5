//go:build e2e

package framework

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// The Eventually helpers: each returns a function that observes one small
// value. Poll it with Gomega's Eventually; on a timeout Gomega prints the
// last value observed (or the last error), e.g.
//
//	Eventually(f.NodeResource(ctx, f.Node, res)).WithTimeout(time.Minute).
//		Should(Equal(framework.Resource{Capacity: "8", Allocatable: "8"}))
//
//	Timed out after 60.001s.
//	Expected
//	    <framework.Resource>: {Capacity: "8", Allocatable: "0"}
//	to equal ...
//
// Keep the observed value small (a string, a struct of a few fields): it is
// the failure message.

// Resource is a node's capacity and allocatable of one extended resource
// ("none" when the node has no such resource).
type Resource struct {
	Capacity, Allocatable string
}

// NodeResource observes a node's capacity and allocatable of res.
func (f *Framework) NodeResource(ctx context.Context, node string, res corev1.ResourceName) func() (Resource, error) {
	return func() (Resource, error) {
		n, err := f.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return Resource{}, err
		}
		return nodeResource(n, res), nil
	}
}

func nodeResource(n *corev1.Node, res corev1.ResourceName) Resource {
	r := Resource{Capacity: "none", Allocatable: "none"}
	if q, ok := n.Status.Capacity[res]; ok {
		r.Capacity = q.String()
	}
	if q, ok := n.Status.Allocatable[res]; ok {
		r.Allocatable = q.String()
	}
	return r
}

// NodeStatus is what a node's status says of one resource and when the
// kubelet last posted it.
type NodeStatus struct {
	Allocatable string
	Heartbeat   time.Time // the Ready condition's lastHeartbeatTime
}

// ObserveNodeStatus reads one NodeStatus.
func (f *Framework) ObserveNodeStatus(ctx context.Context, node string, res corev1.ResourceName) (NodeStatus, error) {
	n, err := f.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return NodeStatus{}, err
	}
	s := NodeStatus{Allocatable: nodeResource(n, res).Allocatable}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			s.Heartbeat = c.LastHeartbeatTime.Time
		}
	}
	return s, nil
}

// PodState is a pod's phase, node, readiness and restarts in one line.
type PodState struct {
	Phase    corev1.PodPhase
	Node     string
	Ready    bool
	Restarts int32
}

// PodStateOf observes a pod ("NotFound" as the phase when it is gone).
func (f *Framework) PodStateOf(ctx context.Context, ns, name string) func() (PodState, error) {
	return func() (PodState, error) {
		p, err := f.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return PodState{Phase: "NotFound"}, nil
		}
		if err != nil {
			return PodState{}, err
		}
		return podState(p), nil
	}
}

func podState(p *corev1.Pod) PodState {
	s := PodState{Phase: p.Status.Phase, Node: p.Spec.NodeName}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			s.Ready = c.Status == corev1.ConditionTrue
		}
	}
	for _, c := range p.Status.ContainerStatuses {
		s.Restarts += c.RestartCount
	}
	return s
}

// BeReadyOn matches a PodState that is Running and Ready on node.
func BeReadyOn(node string) gomega.OmegaMatcher {
	return gomega.Equal(PodState{Phase: corev1.PodRunning, Node: node, Ready: true})
}

// PodsReady observes the pods of a label selector: "name phase ready" each,
// and whether all of them are Running and Ready (false when there is none).
func (f *Framework) PodsReady(ctx context.Context, ns, selector string) func() (string, error) {
	return func() (string, error) {
		l, err := f.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return "", err
		}
		var parts []string
		all := len(l.Items) > 0
		for i := range l.Items {
			s := podState(&l.Items[i])
			all = all && s.Ready && s.Phase == corev1.PodRunning
			parts = append(parts, fmt.Sprintf("%s %s ready=%t", l.Items[i].Name, s.Phase, s.Ready))
		}
		if all {
			return "all ready", nil
		}
		return fmt.Sprintf("not all ready: [%s]", strings.Join(parts, "; ")), nil
	}
}

// EventMessages observes the messages of the events of one object with one
// reason, oldest first.
func (f *Framework) EventMessages(ctx context.Context, ns, object, reason string) func() ([]string, error) {
	return func() ([]string, error) {
		sel := fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", object),
			fields.OneTermEqualSelector("reason", reason)).String()
		l, err := f.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return nil, err
		}
		msgs := []string{}
		for _, e := range l.Items {
			msgs = append(msgs, e.Message)
		}
		return msgs, nil
	}
}

// ContainerStatus is one container's ID and restart count in a pod.
type ContainerStatus struct {
	Pod, ID  string
	Restarts int32
}

// ContainerOf observes container c of the (first) pod of a label selector.
func (f *Framework) ContainerOf(ctx context.Context, ns, selector, c string) func() (ContainerStatus, error) {
	return func() (ContainerStatus, error) {
		l, err := f.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return ContainerStatus{}, err
		}
		for _, p := range l.Items {
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == c {
					return ContainerStatus{Pod: p.Name, ID: s.ContainerID, Restarts: s.RestartCount}, nil
				}
			}
		}
		return ContainerStatus{}, fmt.Errorf("no container %q in the pods of %q in %s", c, selector, ns)
	}
}

// NextNodeStatus returns when the kubelet next posts node's status (the
// node object changes), at most timeout. With the test cluster's 1 s
// status period, a fault injected some time after it falls at a known
// place between two posts.
func (f *Framework) NextNodeStatus(ctx context.Context, node string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n, err := f.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	w, err := f.Stream.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", node).String(),
		ResourceVersion: n.ResourceVersion,
	})
	if err != nil {
		return err
	}
	defer w.Stop()
	select {
	case _, ok := <-w.ResultChan():
		if !ok {
			return fmt.Errorf("watch of node %s ended", node)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no status of node %s within %s: %w", node, timeout, ctx.Err())
	}
}

// PodNames observes the names of the pods in ns that match selector ("":
// all of them).
func (f *Framework) PodNames(ctx context.Context, ns, selector string) func() ([]string, error) {
	return func() ([]string, error) {
		l, err := f.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, err
		}
		names := []string{}
		for _, p := range l.Items {
			names = append(names, p.Name)
		}
		return names, nil
	}
}
