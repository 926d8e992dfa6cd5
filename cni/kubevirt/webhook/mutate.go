// Package webhook is vhostmq's mutating admission webhook for pods: a pod
// (a virt-launcher pod or a plain one) that attaches vhostmq networks gets
// its vhostmq.io/queue-pairs request set to what those networks need, so
// VM owners write no resource lines. The queue count per network comes
// from the same rule the binding sidecar uses (package vmi), and is
// written to the pod as vhostmq.io/queues for the CNI plugin, so the
// guest NIC, the allocation and the dataplane port agree.
package webhook

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/vhostmq/vhostmq/cni/kubevirt/podnet"
	"github.com/vhostmq/vhostmq/cni/kubevirt/vmi"
	"github.com/vhostmq/vhostmq/internal/bandwidth"
)

// Annotations the webhook reads.
const (
	AnnotationNetworks     = podnet.AnnotationNetworks
	AnnotationResourceName = podnet.AnnotationResourceName
	AnnotationQueues       = vmi.AnnotationQueues
	AnnotationSocketMode   = "vhostmq.io/socket-mode"
	AnnotationPolling      = "vhostmq.io/polling"
	// AnnotationPortSecurity is "true" or "false"; KubeVirt copies it from
	// the VMI to the pod like every VMI annotation, and the CNI reads it.
	AnnotationPortSecurity = "vhostmq.io/port-security"
	// ComputeContainer is virt-launcher's container that runs QEMU.
	ComputeContainer = "compute"
)

// Decision is what the webhook does to one pod.
type Decision struct {
	Networks  int    // vhostmq networks of the pod
	Queues    int    // queue pairs per network
	Container string // the container that gets the request
	Total     int64  // its vhostmq.io/queue-pairs request and limit
	Patch     []PatchOp
	Reason    string // for the log
}

// PatchOp is one JSON patch operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Rule turns a pod into a Decision. A nil Decision means the pod has no
// vhostmq network. Errors name the annotation or object at fault and
// deny the pod.
type Rule struct {
	ResourceName string
	Lookup       podnet.Lookup
}

// Decide applies the rule to pod.
func (r *Rule) Decide(ctx context.Context, pod *corev1.Pod) (*Decision, error) {
	if err := validateAnnotations(pod.Annotations); err != nil {
		return nil, err
	}
	k, err := podnet.CountNetworks(ctx, r.Lookup, pod, r.ResourceName)
	if err != nil {
		return nil, err
	}
	if k == 0 {
		return nil, nil
	}
	// The rate limits the CNI reads for its ports (KubeVirt copies them
	// from the VMI like every annotation): a value the CNI would refuse is
	// refused here, naming it, rather than at the pod's network setup.
	// Pods without a vhostmq network keep Kubernetes' own rules.
	if _, err := bandwidth.FromAnnotations(pod.Annotations); err != nil {
		return nil, fmt.Errorf("annotation %w", err)
	}
	d := &Decision{Networks: k}
	if owner := podnet.LauncherOf(pod); owner != "" {
		b, err := r.Lookup.VMI(ctx, pod.Namespace, owner)
		if err != nil {
			return nil, fmt.Errorf("reading VirtualMachineInstance %s/%s: %w", pod.Namespace, owner, err)
		}
		v, err := vmi.Parse(b)
		if err != nil {
			return nil, err
		}
		q, _, err := v.Queues()
		if err != nil {
			return nil, fmt.Errorf("VirtualMachineInstance %s/%s: %w", pod.Namespace, owner, err)
		}
		d.Queues, d.Reason = q, "VirtualMachineInstance "+owner
	} else if s, ok := pod.Annotations[AnnotationQueues]; ok {
		d.Queues, _ = strconv.Atoi(s) // validated above
		d.Reason = "annotation " + AnnotationQueues
	} else {
		d.Queues, d.Reason = 1, "default"
	}
	d.Total = int64(k * d.Queues)
	ci := target(pod, r.ResourceName)
	if ci < 0 {
		return nil, fmt.Errorf("pod has no containers")
	}
	d.Container = pod.Spec.Containers[ci].Name
	d.Patch = r.patch(pod, ci, d)
	return d, nil
}

func validateAnnotations(a map[string]string) error {
	if s, ok := a[AnnotationQueues]; ok {
		if n, err := strconv.Atoi(s); err != nil || n < 1 || n > vmi.MaxQueuePairs {
			return fmt.Errorf("annotation %s: %q is not a number of queue pairs in 1..%d", AnnotationQueues, s, vmi.MaxQueuePairs)
		}
	}
	if s, ok := a[AnnotationSocketMode]; ok && s != "server" && s != "client" {
		return fmt.Errorf("annotation %s: %q is not server or client", AnnotationSocketMode, s)
	}
	if s, ok := a[AnnotationPolling]; ok && s != "interrupt" && s != "adaptive" && s != "busy" {
		return fmt.Errorf("annotation %s: %q is not interrupt, adaptive or busy", AnnotationPolling, s)
	}
	if s, ok := a[AnnotationPortSecurity]; ok && s != "true" && s != "false" {
		return fmt.Errorf("annotation %s: %q is not true or false", AnnotationPortSecurity, s)
	}
	return nil
}

// target is the container that asks for the queue pairs: virt-launcher's
// compute container, else the first one that already asks for the
// resource, else the first one.
func target(pod *corev1.Pod, res string) int {
	cs := pod.Spec.Containers
	for i, c := range cs {
		if c.Name == ComputeContainer {
			return i
		}
	}
	name := corev1.ResourceName(res)
	for i, c := range cs {
		if _, ok := c.Resources.Limits[name]; ok {
			return i
		}
		if _, ok := c.Resources.Requests[name]; ok {
			return i
		}
	}
	if len(cs) == 0 {
		return -1
	}
	return 0
}

// escape is JSON pointer escaping (RFC 6901).
func escape(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1") }

// patch raises the container's request and limit to d.Total (a larger
// value someone wrote stays) and records the queue count for the CNI.
func (r *Rule) patch(pod *corev1.Pod, ci int, d *Decision) []PatchOp {
	var ops []PatchOp
	c := pod.Spec.Containers[ci]
	name := corev1.ResourceName(r.ResourceName)
	want := d.Total
	for _, have := range []resource.Quantity{c.Resources.Limits[name], c.Resources.Requests[name]} {
		if have.Value() > want {
			want = have.Value()
		}
	}
	d.Total = want
	q := resource.NewQuantity(want, resource.DecimalSI).String()
	base := fmt.Sprintf("/spec/containers/%d/resources", ci)
	if c.Resources.Limits == nil && c.Resources.Requests == nil {
		ops = append(ops, PatchOp{Op: "add", Path: base, Value: map[string]any{}})
	}
	for _, kind := range []struct {
		key string
		m   corev1.ResourceList
	}{{"limits", c.Resources.Limits}, {"requests", c.Resources.Requests}} {
		if kind.m == nil {
			ops = append(ops, PatchOp{Op: "add", Path: base + "/" + kind.key, Value: map[string]string{r.ResourceName: q}})
			continue
		}
		op := "add"
		if _, ok := kind.m[name]; ok {
			op = "replace"
		}
		ops = append(ops, PatchOp{Op: op, Path: base + "/" + kind.key + "/" + escape(r.ResourceName), Value: q})
	}
	qs := strconv.Itoa(d.Queues)
	if pod.Annotations[AnnotationQueues] != qs {
		op := "add"
		if _, ok := pod.Annotations[AnnotationQueues]; ok {
			op = "replace"
		}
		ops = append(ops, PatchOp{Op: op, Path: "/metadata/annotations/" + escape(AnnotationQueues), Value: qs})
	}
	return ops
}
