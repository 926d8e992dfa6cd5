// Package register adds vhostmq's network binding plugin to the KubeVirt
// CR and takes it out again, as the Helm chart's install and uninstall
// hooks do (what deploy/examples/kubevirt-binding.yaml says by hand).
// Only spec.configuration.network.binding.<name> is touched, with a JSON
// merge patch, so the rest of the CR, other bindings included, stays as
// the cluster's admin wrote it.
package register

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// KubeVirtResource is the KubeVirt CR's resource.
var KubeVirtResource = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}

// Binding is what the CR says of one binding plugin.
type Binding struct {
	// Name is what VMI interfaces use (binding: {name: ...}).
	Name string
	// SidecarImage is the image KubeVirt runs in every virt-launcher pod
	// of a VMI with this binding.
	SidecarImage string
	// MemoryOverhead is added to the virt-launcher pod's memory request
	// for the sidecar ("" for none).
	MemoryOverhead string
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Validate names the field that is wrong.
func (b Binding) Validate() error {
	if !dnsLabel.MatchString(b.Name) || len(b.Name) > 63 {
		return fmt.Errorf("binding name %q: must be a DNS label (lower-case letters, digits and '-')", b.Name)
	}
	if b.SidecarImage == "" {
		return fmt.Errorf("sidecar image: must be set")
	}
	if b.MemoryOverhead != "" {
		if _, err := resource.ParseQuantity(b.MemoryOverhead); err != nil {
			return fmt.Errorf("memory overhead %q: %v", b.MemoryOverhead, err)
		}
	}
	return nil
}

// entry is the binding as KubeVirt's InterfaceBindingPlugin has it: the
// socket path is the same in a migration target pod, so migration needs
// nothing but a reconnect; the device-info of the VMI's networks reaches
// the sidecar through the downward API.
func (b Binding) entry() map[string]any {
	e := map[string]any{
		"sidecarImage": b.SidecarImage,
		"downwardAPI":  "device-info",
		"migration":    map[string]any{},
	}
	if b.MemoryOverhead != "" {
		e["computeResourceOverhead"] = map[string]any{"requests": map[string]any{"memory": b.MemoryOverhead}}
	}
	return e
}

func bindingPatch(name string, entry any) ([]byte, error) {
	return json.Marshal(map[string]any{"spec": map[string]any{"configuration": map[string]any{"network": map[string]any{"binding": map[string]any{name: entry}}}}})
}

// Add registers b in the KubeVirt CR namespace/name.
func Add(ctx context.Context, c dynamic.Interface, namespace, name string, b Binding) error {
	if err := b.Validate(); err != nil {
		return err
	}
	patch, err := bindingPatch(b.Name, b.entry())
	if err != nil {
		return err
	}
	if _, err := c.Resource(KubeVirtResource).Namespace(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "vhostmq"}); err != nil {
		return fmt.Errorf("registering binding %q in KubeVirt %s/%s: %w", b.Name, namespace, name, err)
	}
	return nil
}

// Remove takes the binding bindingName out of the KubeVirt CR, if it is
// there; a CR that is gone is fine (KubeVirt was uninstalled first).
func Remove(ctx context.Context, c dynamic.Interface, namespace, name, bindingName string) error {
	kv, err := c.Resource(KubeVirtResource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading KubeVirt %s/%s: %w", namespace, name, err)
	}
	if _, ok, _ := unstructured.NestedFieldNoCopy(kv.Object, "spec", "configuration", "network", "binding", bindingName); !ok {
		return nil
	}
	patch, err := bindingPatch(bindingName, nil) // null deletes the key
	if err != nil {
		return err
	}
	if _, err := c.Resource(KubeVirtResource).Namespace(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "vhostmq"}); err != nil {
		return fmt.Errorf("removing binding %q from KubeVirt %s/%s: %w", bindingName, namespace, name, err)
	}
	return nil
}
