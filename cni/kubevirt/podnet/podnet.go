// Package podnet reads what a pod's secondary networks are and how many
// of them are vhostmq's: the pod's k8s.v1.cni.cncf.io/networks annotation,
// the NetworkAttachmentDefinitions it names, and the VMI behind a
// virt-launcher pod. The webhook and the CNI plugin count the same way.
package podnet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// Annotations Multus defines.
const (
	AnnotationNetworks     = "k8s.v1.cni.cncf.io/networks"
	AnnotationResourceName = "k8s.v1.cni.cncf.io/resourceName"
)

// Lookup reads the objects the rules need from the API server.
type Lookup interface {
	// NADResourceName returns the k8s.v1.cni.cncf.io/resourceName
	// annotation of a NetworkAttachmentDefinition; found is false if it
	// does not exist.
	NADResourceName(ctx context.Context, namespace, name string) (resourceName string, found bool, err error)
	// VMI returns a VirtualMachineInstance as JSON.
	VMI(ctx context.Context, namespace, name string) ([]byte, error)
}

// NetworkRef is one entry of k8s.v1.cni.cncf.io/networks.
type NetworkRef struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Interface string `json:"interface,omitempty"`
	MAC       string `json:"mac,omitempty"`
}

// ParseNetworks reads k8s.v1.cni.cncf.io/networks in either of Multus'
// forms: a JSON list, or "name", "ns/name", "name@ifname" separated by
// commas.
func ParseNetworks(s, podNamespace string) ([]NetworkRef, error) {
	s = strings.TrimSpace(s)
	var refs []NetworkRef
	if strings.HasPrefix(s, "[") {
		if err := json.Unmarshal([]byte(s), &refs); err != nil {
			return nil, fmt.Errorf("annotation %s: %v", AnnotationNetworks, err)
		}
	} else {
		for _, e := range strings.Split(s, ",") {
			e = strings.TrimSpace(e)
			if e == "" {
				continue
			}
			var r NetworkRef
			r.Name, r.Interface, _ = strings.Cut(e, "@")
			if ns, n, ok := strings.Cut(r.Name, "/"); ok {
				r.Namespace, r.Name = ns, n
			}
			refs = append(refs, r)
		}
	}
	for i := range refs {
		if refs[i].Name == "" {
			return nil, fmt.Errorf("annotation %s: entry %d has no network name", AnnotationNetworks, i)
		}
		if refs[i].Namespace == "" {
			refs[i].Namespace = podNamespace
		}
	}
	return refs, nil
}

// CountNetworks is how many of the pod's networks use resourceName.
// NADs that do not exist are not counted (Multus reports them).
func CountNetworks(ctx context.Context, l Lookup, pod *corev1.Pod, resourceName string) (int, error) {
	s, ok := pod.Annotations[AnnotationNetworks]
	if !ok {
		return 0, nil
	}
	refs, err := ParseNetworks(s, pod.Namespace)
	if err != nil {
		return 0, err
	}
	k := 0
	for _, ref := range refs {
		res, found, err := l.NADResourceName(ctx, ref.Namespace, ref.Name)
		if err != nil {
			return 0, fmt.Errorf("reading NetworkAttachmentDefinition %s/%s: %w", ref.Namespace, ref.Name, err)
		}
		if found && res == resourceName {
			k++
		}
	}
	return k, nil
}

// LauncherOf returns the name of the VMI owning a virt-launcher pod, or "".
func LauncherOf(pod *corev1.Pod) string {
	for _, o := range pod.OwnerReferences {
		if o.Kind == "VirtualMachineInstance" && strings.HasPrefix(o.APIVersion, "kubevirt.io/") {
			return o.Name
		}
	}
	return ""
}

// ClusterLookup reads NADs and VMIs with client-go's dynamic client.
type ClusterLookup struct {
	Client dynamic.Interface
}

var (
	nadGVR = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}
	vmiGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
)

// NADResourceName implements Lookup.
func (l *ClusterLookup) NADResourceName(ctx context.Context, ns, name string) (string, bool, error) {
	u, err := l.Client.Resource(nadGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return u.GetAnnotations()[AnnotationResourceName], true, nil
}

// VMI implements Lookup.
func (l *ClusterLookup) VMI(ctx context.Context, ns, name string) ([]byte, error) {
	u, err := l.Client.Resource(vmiGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return u.MarshalJSON()
}
