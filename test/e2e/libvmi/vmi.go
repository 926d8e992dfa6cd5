//go:build e2e

// Package libvmi builds the test VMs, in the style of KubeVirt's
// pkg/libvmi: New(name, options...) gives a VirtualMachine that runs on the
// KubeVirt test bed (hack/kubevirt) as it is, and each option changes one
// thing:
//
//	vm := libvmi.New("vm1", libvmi.WithNamespace(ns), libvmi.WithCores(4), libvmi.WithMemory("1Gi"),
//		libvmi.WithVhostmqInterface("fast", "vhostmq-system/vhu-net"),
//		libvmi.WithKernelBoot(image, "vmq.ip=10.0.0.1/24 vmq.role=server"))
//
// The types are the few fields of kubevirt.io/api/core/v1 (v1.7) the tests
// set, with KubeVirt's JSON names; ToUnstructured turns a VM into what the
// dynamic client creates. kubevirt.io/api is not imported: it would add
// six modules to the main go.mod (k8s.io/apiextensions-apiserver v0.33,
// CDI's API, ...) for a dozen fields. The framework creates VMs with
// fieldValidation=Strict, so a misspelled field fails the create.
package libvmi

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestLabel is on every VM New makes and on its VMI ("app": TestLabel).
const TestLabel = "vhostmq-kv-test"

// VirtualMachine is kubevirt.io/v1 VirtualMachine, the fields the tests set.
type VirtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              VirtualMachineSpec `json:"spec"`
}

// VirtualMachineSpec is the VM's run strategy and its VMI template.
type VirtualMachineSpec struct {
	RunStrategy string       `json:"runStrategy"`
	Template    TemplateSpec `json:"template"`
}

// TemplateSpec is the VMI the VM makes.
type TemplateSpec struct {
	ObjectMeta metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec       VMISpec           `json:"spec"`
}

// VMISpec is a VMI's spec.
type VMISpec struct {
	TerminationGracePeriodSeconds *int64    `json:"terminationGracePeriodSeconds,omitempty"`
	Domain                        Domain    `json:"domain"`
	Networks                      []Network `json:"networks,omitempty"`
}

// Domain is the VMI's virtual hardware.
type Domain struct {
	CPU      *CPU      `json:"cpu,omitempty"`
	Memory   *Memory   `json:"memory,omitempty"`
	Devices  Devices   `json:"devices"`
	Firmware *Firmware `json:"firmware,omitempty"`
}

// CPU is the guest's topology.
type CPU struct {
	Cores uint32 `json:"cores,omitempty"`
}

// Memory is the guest's memory.
type Memory struct {
	Guest *resource.Quantity `json:"guest,omitempty"`
}

// Devices are the guest's NICs (no disks: the guest boots a kernel).
type Devices struct {
	NetworkInterfaceMultiQueue *bool       `json:"networkInterfaceMultiqueue,omitempty"`
	Interfaces                 []Interface `json:"interfaces"`
}

// Interface is a NIC bound by a network binding plugin.
type Interface struct {
	Name    string         `json:"name"`
	Binding *PluginBinding `json:"binding,omitempty"`
}

// PluginBinding names a binding registered in the KubeVirt CR.
type PluginBinding struct {
	Name string `json:"name"`
}

// Network is a Multus network a NIC joins.
type Network struct {
	Name   string         `json:"name"`
	Multus *MultusNetwork `json:"multus,omitempty"`
}

// MultusNetwork names a NetworkAttachmentDefinition ("ns/name").
type MultusNetwork struct {
	NetworkName string `json:"networkName"`
}

// Firmware is how the guest boots.
type Firmware struct {
	KernelBoot *KernelBoot `json:"kernelBoot,omitempty"`
}

// KernelBoot boots a kernel and initramfs from a container image.
type KernelBoot struct {
	KernelArgs string               `json:"kernelArgs,omitempty"`
	Container  *KernelBootContainer `json:"container,omitempty"`
}

// KernelBootContainer is the image holding the kernel and initramfs.
type KernelBootContainer struct {
	Image           string `json:"image"`
	ImagePullPolicy string `json:"imagePullPolicy,omitempty"`
	KernelPath      string `json:"kernelPath,omitempty"`
	InitrdPath      string `json:"initrdPath,omitempty"`
}

// Option changes a VM.
type Option func(*VirtualMachine)

// New returns a VM in namespace default with runStrategy Always, no
// devices and opts applied in order.
func New(name string, opts ...Option) *VirtualMachine {
	vm := &VirtualMachine{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: "default",
			Labels:    map[string]string{"app": TestLabel},
		},
		Spec: VirtualMachineSpec{
			RunStrategy: "Always",
			Template: TemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": TestLabel}},
				Spec:       VMISpec{Domain: Domain{Devices: Devices{Interfaces: []Interface{}}}},
			},
		},
	}
	for _, o := range opts {
		o(vm)
	}
	return vm
}

// WithNamespace puts the VM in ns.
func WithNamespace(ns string) Option { return func(vm *VirtualMachine) { vm.Namespace = ns } }

// WithCores gives the guest n vCPUs (one socket, n cores).
func WithCores(n uint32) Option {
	return func(vm *VirtualMachine) { vm.Spec.Template.Spec.Domain.CPU = &CPU{Cores: n} }
}

// WithMemory gives the guest q of memory ("1Gi").
func WithMemory(q string) Option {
	return func(vm *VirtualMachine) {
		m := resource.MustParse(q)
		vm.Spec.Template.Spec.Domain.Memory = &Memory{Guest: &m}
	}
}

// WithNetworkInterfaceMultiQueue sets networkInterfaceMultiqueue: a NIC
// gets as many queue pairs as the guest has vCPUs.
func WithNetworkInterfaceMultiQueue(on bool) Option {
	return func(vm *VirtualMachine) { vm.Spec.Template.Spec.Domain.Devices.NetworkInterfaceMultiQueue = &on }
}

// WithVhostmqInterface adds a NIC called name, bound by the vhostmq network
// binding, on the Multus network nad ("ns/name" of a vhostmq NAD).
func WithVhostmqInterface(name, nad string) Option {
	return func(vm *VirtualMachine) {
		s := &vm.Spec.Template.Spec
		s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, Interface{Name: name, Binding: &PluginBinding{Name: "vhostmq"}})
		s.Networks = append(s.Networks, Network{Name: name, Multus: &MultusNetwork{NetworkName: nad}})
	}
}

// WithKernelBoot boots the test guest (hack/guest) from image, with args
// on its kernel command line (its vmq.* keys say what it does).
func WithKernelBoot(image, args string) Option {
	return func(vm *VirtualMachine) {
		vm.Spec.Template.Spec.Domain.Firmware = &Firmware{KernelBoot: &KernelBoot{
			KernelArgs: args,
			Container: &KernelBootContainer{Image: image, ImagePullPolicy: "IfNotPresent",
				KernelPath: "/boot/vmlinux", InitrdPath: "/boot/initramfs.cpio.gz"},
		}}
	}
}

// WithAnnotation sets an annotation of the VMI (vhostmq.io/polling, ...):
// the launcher pod carries the VMI's annotations.
func WithAnnotation(k, v string) Option {
	return func(vm *VirtualMachine) {
		m := &vm.Spec.Template.ObjectMeta
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[k] = v
	}
}

// WithBandwidth limits the VM both ways, with the annotations
// kubernetes.io/{ingress,egress}-bandwidth as a user writes them (rate a
// Kubernetes quantity: "100M").
func WithBandwidth(rate string) Option {
	return func(vm *VirtualMachine) {
		WithAnnotation("kubernetes.io/ingress-bandwidth", rate)(vm)
		WithAnnotation("kubernetes.io/egress-bandwidth", rate)(vm)
	}
}

// WithTerminationGracePeriod sets the VMI's grace period: the test guest
// has no ACPI power-button handler, so a delete waits it out.
func WithTerminationGracePeriod(s int64) Option {
	return func(vm *VirtualMachine) { vm.Spec.Template.Spec.TerminationGracePeriodSeconds = &s }
}

// ToUnstructured is vm as the dynamic client takes it.
func ToUnstructured(vm *VirtualMachine) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vm)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	// ToUnstructured keeps a zero creationTimestamp as null: the API
	// server takes it, but it is no field the test sets
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
	return u, nil
}
