//go:build e2e

// Package libpod builds the test pods, in the style of KubeVirt's
// pkg/libvmi: New(name, options...) gives a pod that runs on the test
// cluster as it is (an imported busybox image, never pulled, a shell that
// sleeps and ends on SIGTERM, a 1 s grace period), and each option changes
// one thing:
//
//	pod := libpod.New("qp4", libpod.WithQueuePairs(4), libpod.WithNetwork("vhu-net"))
package libpod

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// QueuePairs is the device plugin's extended resource.
const QueuePairs corev1.ResourceName = "vhostmq.io/queue-pairs"

// DefaultImage is the test cluster's busybox (hack/cluster/lib.sh,
// VMQC_BUSYBOX_IMAGE); WithImage picks another.
const DefaultImage = "localhost/vhostmq/busybox:dev"

// TestLabel is on every pod New makes ("app": TestLabel), so that a clean-up
// can find them all.
const TestLabel = "vhostmq-test"

// networksAnnotation is Multus' list of extra networks.
const networksAnnotation = "k8s.v1.cni.cncf.io/networks"

// Option changes a pod.
type Option func(*corev1.Pod)

// New returns a pod in namespace default with one container "c" and opts
// applied in order.
func New(name string, opts ...Option) *corev1.Pod {
	grace := int64(1)
	no := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: "default",
			Labels:    map[string]string{"app": TestLabel},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &no,
			Containers: []corev1.Container{{
				Name:            "c",
				Image:           DefaultImage,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"},
			}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// WithNamespace puts the pod in ns.
func WithNamespace(ns string) Option { return func(p *corev1.Pod) { p.Namespace = ns } }

// WithImage runs the container from image (imported into the node's
// containerd: pods never pull).
func WithImage(image string) Option {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Image = image }
}

// WithCommand replaces the container's command.
func WithCommand(cmd ...string) Option {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Command = cmd }
}

// WithLabel adds a label.
func WithLabel(k, v string) Option { return func(p *corev1.Pod) { p.Labels[k] = v } }

// WithAnnotation sets an annotation (vhostmq.io/queues, vhostmq.io/polling, ...).
func WithAnnotation(k, v string) Option {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}

// WithQueuePairs asks for n vhostmq.io/queue-pairs (limit = request).
func WithQueuePairs(n int64) Option {
	return func(p *corev1.Pod) {
		c := &p.Spec.Containers[0]
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		c.Resources.Limits[QueuePairs] = *resource.NewQuantity(n, resource.DecimalSI)
	}
}

// WithNetwork adds a network to the pod's k8s.v1.cni.cncf.io/networks list,
// in its comma form: "name", "ns/name" or "name@ifname".
func WithNetwork(network string) Option {
	return func(p *corev1.Pod) {
		old := ""
		if p.Annotations != nil {
			old = p.Annotations[networksAnnotation]
		}
		WithAnnotation(networksAnnotation, strings.TrimPrefix(old+","+network, ","))(p)
	}
}

// WithNodeName pins the pod to a node (no scheduler).
func WithNodeName(node string) Option { return func(p *corev1.Pod) { p.Spec.NodeName = node } }
