package register

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
)

func kubevirtCR(bindings map[string]any) *unstructured.Unstructured {
	spec := map[string]any{"configuration": map[string]any{
		"developerConfiguration": map[string]any{"useEmulation": true},
	}}
	if bindings != nil {
		spec["configuration"].(map[string]any)["network"] = map[string]any{"binding": bindings}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
		"metadata": map[string]any{"name": "kubevirt", "namespace": "kubevirt"},
		"spec":     spec,
	}}
}

func client(objs ...runtime.Object) *dynfake.FakeDynamicClient {
	return dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{KubeVirtResource: "KubeVirtList"}, objs...)
}

func get(t *testing.T, c *dynfake.FakeDynamicClient) map[string]any {
	t.Helper()
	kv, err := c.Resource(KubeVirtResource).Namespace("kubevirt").Get(context.Background(), "kubevirt", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return kv.Object
}

func TestAddKeepsTheRestAndRemoveUndoesIt(t *testing.T) {
	other := map[string]any{"passt": map[string]any{"sidecarImage": "quay.io/passt"}}
	c := client(kubevirtCR(other))
	b := Binding{Name: "vhostmq", SidecarImage: "localhost/vhostmq/kubevirt-binding:dev", MemoryOverhead: "20Mi"}
	if err := Add(context.Background(), c, "kubevirt", "kubevirt", b); err != nil {
		t.Fatal(err)
	}
	obj := get(t, c)
	img, _, _ := unstructured.NestedString(obj, "spec", "configuration", "network", "binding", "vhostmq", "sidecarImage")
	api, _, _ := unstructured.NestedString(obj, "spec", "configuration", "network", "binding", "vhostmq", "downwardAPI")
	mem, _, _ := unstructured.NestedString(obj, "spec", "configuration", "network", "binding", "vhostmq", "computeResourceOverhead", "requests", "memory")
	if img != b.SidecarImage || api != "device-info" || mem != "20Mi" {
		t.Fatalf("registered binding: image %q downwardAPI %q memory %q", img, api, mem)
	}
	if _, ok, _ := unstructured.NestedMap(obj, "spec", "configuration", "network", "binding", "passt"); !ok {
		t.Fatal("the admin's other binding was lost")
	}
	if emu, _, _ := unstructured.NestedBool(obj, "spec", "configuration", "developerConfiguration", "useEmulation"); !emu {
		t.Fatal("the rest of the configuration was lost")
	}
	// again: idempotent
	if err := Add(context.Background(), c, "kubevirt", "kubevirt", b); err != nil {
		t.Fatal(err)
	}
	if err := Remove(context.Background(), c, "kubevirt", "kubevirt", "vhostmq"); err != nil {
		t.Fatal(err)
	}
	obj = get(t, c)
	if _, ok, _ := unstructured.NestedFieldNoCopy(obj, "spec", "configuration", "network", "binding", "vhostmq"); ok {
		t.Fatal("binding still registered after Remove")
	}
	if _, ok, _ := unstructured.NestedMap(obj, "spec", "configuration", "network", "binding", "passt"); !ok {
		t.Fatal("Remove took the admin's other binding")
	}
	// removing what is not there, or from a cluster without KubeVirt, is fine
	if err := Remove(context.Background(), c, "kubevirt", "kubevirt", "vhostmq"); err != nil {
		t.Fatal(err)
	}
	if err := Remove(context.Background(), client(), "kubevirt", "kubevirt", "vhostmq"); err != nil {
		t.Fatalf("no KubeVirt CR: %v", err)
	}
}

func TestAddWithoutKubeVirtSaysSo(t *testing.T) {
	err := Add(context.Background(), client(), "kubevirt", "kubevirt", Binding{Name: "vhostmq", SidecarImage: "x"})
	if err == nil || !strings.Contains(err.Error(), "KubeVirt kubevirt/kubevirt") {
		t.Fatalf("err = %v, want one naming the KubeVirt CR", err)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		b    Binding
		want string
	}{
		{Binding{Name: "Vhost_MQ", SidecarImage: "x"}, "binding name"},
		{Binding{Name: "vhostmq"}, "sidecar image"},
		{Binding{Name: "vhostmq", SidecarImage: "x", MemoryOverhead: "lots"}, "memory overhead"},
	} {
		err := tc.b.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want it to start with %q", tc.b, err, tc.want)
		}
		if err := Add(context.Background(), client(kubevirtCR(nil)), "kubevirt", "kubevirt", tc.b); err == nil {
			t.Errorf("%+v: Add accepted it", tc.b)
		}
	}
}
