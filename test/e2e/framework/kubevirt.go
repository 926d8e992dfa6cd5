//go:build e2e

package framework

// KubeVirt on the test bed of hack/kubevirt (testbed.sh up): VMs, VMIs and
// migrations through the dynamic client (kubevirt.io/api is not imported:
// see test/e2e/libvmi), the launcher pods, their guests' serial consoles
// (the guest-console-log container) and the second node's agent.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// KubeVirt's resources.
var (
	VMGVR       = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	VMIGVR      = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"}
	VMIMGVR     = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstancemigrations"}
	KubeVirtGVR = schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "kubevirts"}
)

// KubeVirtConfig is the test bed's side of the settings, exported by
// hack/kubevirt/test-vm.sh with the defaults of hack/kubevirt/lib.sh.
type KubeVirtConfig struct {
	Node2        string        // VHOSTMQ_E2E_NODE2: the second node ("" with one node)
	Node2MountNS string        // VHOSTMQ_E2E_NODE2_MNT: its mount namespace (its /run is its own)
	BinDir       string        // VHOSTMQ_E2E_KV_BIN: the binaries the test bed runs (the image's)
	NodeCNIBin   string        // VHOSTMQ_E2E_NODE_CNI_BIN: the node's CNI bin folder
	NodeCNIConf  string        // VHOSTMQ_E2E_NODE_CNI_CONF: the node's CNI config folder
	ImageRepo    string        // VHOSTMQ_E2E_IMAGE_REPO: the chart's image (tags dev and upgrade imported)
	SidecarImage string        // VHOSTMQ_E2E_SIDECAR_IMAGE: the binding's sidecar
	GuestImage   string        // VHOSTMQ_E2E_KV_GUEST_IMAGE: the guest's kernel-boot image
	VMTimeout    time.Duration // VHOSTMQ_KUBEVIRT_VM_TIMEOUT (s): each VM's start and boot
	Reclaim      time.Duration // VHOSTMQ_KUBEVIRT_RECLAIM_TIMEOUT (s): the allocations' reclaim
	MigrateMB    int           // VHOSTMQ_KUBEVIRT_MIGRATE_MB: the file streamed during the migration
}

// LoadKubeVirtConfig reads the environment.
func LoadKubeVirtConfig() (KubeVirtConfig, error) {
	run := env("VHOSTMQ_CLUSTER_RUN", "/run/vhostmq-cluster")
	c := KubeVirtConfig{
		Node2:        env("VHOSTMQ_E2E_NODE2", ""),
		Node2MountNS: env("VHOSTMQ_E2E_NODE2_MNT", run+"/node2/ns/mnt"),
		BinDir:       env("VHOSTMQ_E2E_KV_BIN", env("VHOSTMQ_KUBEVIRT_RUN", "/run/vhostmq-kubevirt")+"/bin"),
		NodeCNIBin:   env("VHOSTMQ_E2E_NODE_CNI_BIN", run+"/cni/bin"),
		NodeCNIConf:  env("VHOSTMQ_E2E_NODE_CNI_CONF", run+"/cni/net.d"),
		ImageRepo:    env("VHOSTMQ_E2E_IMAGE_REPO", "localhost/vhostmq"),
		SidecarImage: env("VHOSTMQ_E2E_SIDECAR_IMAGE", "localhost/vhostmq/kubevirt-binding:dev"),
		GuestImage:   env("VHOSTMQ_E2E_KV_GUEST_IMAGE", "localhost/vhostmq/guest-kernel:dev"),
	}
	for _, s := range []struct {
		name string
		def  int
		to   *time.Duration
	}{{"VHOSTMQ_KUBEVIRT_VM_TIMEOUT", 420, &c.VMTimeout}, {"VHOSTMQ_KUBEVIRT_RECLAIM_TIMEOUT", 120, &c.Reclaim}} {
		n, err := strconv.Atoi(env(s.name, strconv.Itoa(s.def)))
		if err != nil {
			return c, fmt.Errorf("%s: %w", s.name, err)
		}
		*s.to = time.Duration(n) * time.Second
	}
	n, err := strconv.Atoi(env("VHOSTMQ_KUBEVIRT_MIGRATE_MB", "200"))
	if err != nil {
		return c, fmt.Errorf("VHOSTMQ_KUBEVIRT_MIGRATE_MB: %w", err)
	}
	c.MigrateMB = n
	return c, nil
}

// KubeVirt is the framework with the dynamic client KubeVirt's objects need.
type KubeVirt struct {
	*Framework
	KubeVirtConfig
	Dyn dynamic.Interface
}

// NewKubeVirt adds the dynamic client and the test bed's settings to f.
func NewKubeVirt(f *Framework) (*KubeVirt, error) {
	cfg, err := LoadKubeVirtConfig()
	if err != nil {
		return nil, err
	}
	d, err := dynamic.NewForConfig(f.Rest)
	if err != nil {
		return nil, err
	}
	return &KubeVirt{Framework: f, KubeVirtConfig: cfg, Dyn: d}, nil
}

// CreateVM creates a VM (libvmi.ToUnstructured) with strict field
// validation: a field KubeVirt does not know fails the create.
func (k *KubeVirt) CreateVM(ctx context.Context, vm *unstructured.Unstructured) error {
	_, err := k.Dyn.Resource(VMGVR).Namespace(vm.GetNamespace()).Create(ctx, vm, metav1.CreateOptions{FieldValidation: "Strict"})
	return err
}

// DeleteVMs deletes VMs (missing ones are fine) and, with timeout > 0,
// waits until they, their VMIs and their launcher pods are gone.
func (k *KubeVirt) DeleteVMs(ctx context.Context, ns string, timeout time.Duration, names ...string) error {
	for _, n := range names {
		err := k.Dyn.Resource(VMGVR).Namespace(ns).Delete(ctx, n, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete vm %s/%s: %w", ns, n, err)
		}
	}
	if timeout <= 0 {
		return nil
	}
	var left []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		left = left[:0]
		for _, n := range names {
			for _, gvr := range []schema.GroupVersionResource{VMGVR, VMIGVR} {
				if _, err := k.Dyn.Resource(gvr).Namespace(ns).Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					left = append(left, gvr.Resource+"/"+n)
				}
			}
			pods, err := k.Launchers(ctx, ns, n, true)
			if err != nil {
				return false, nil
			}
			for _, p := range pods {
				left = append(left, "pod/"+p)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("not gone within %s: %s: %w", timeout, strings.Join(left, ", "), err)
	}
	return nil
}

// VMI is what the specs read of a VirtualMachineInstance.
type VMI struct {
	metav1.ObjectMeta `json:"metadata"`
	Status            VMIStatus `json:"status"`
}

// VMIStatus is a VMI's status, the fields the specs read.
type VMIStatus struct {
	Phase          string          `json:"phase"`
	NodeName       string          `json:"nodeName"`
	Conditions     []VMICondition  `json:"conditions"`
	MigrationState *MigrationState `json:"migrationState"`
}

// VMICondition is one of a VMI's conditions (LiveMigratable, Ready, ...).
type VMICondition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// MigrationState is the VMI's last migration.
type MigrationState struct {
	Completed      bool         `json:"completed"`
	Failed         bool         `json:"failed"`
	FailureReason  string       `json:"failureReason,omitempty"`
	Mode           string       `json:"mode,omitempty"`
	StartTimestamp *metav1.Time `json:"startTimestamp,omitempty"`
	EndTimestamp   *metav1.Time `json:"endTimestamp,omitempty"`
	TargetPod      string       `json:"targetPod,omitempty"`
	TargetNode     string       `json:"targetNode,omitempty"`
}

// Condition is the VMI's condition of type t as "Status Reason Message"
// ("absent" when it has none).
func (v *VMI) Condition(t string) string {
	for _, c := range v.Status.Conditions {
		if c.Type == t {
			return strings.TrimSpace(c.Status + " " + c.Reason + " " + c.Message)
		}
	}
	return "absent"
}

// GetVMI reads a VMI.
func (k *KubeVirt) GetVMI(ctx context.Context, ns, name string) (*VMI, error) {
	u, err := k.Dyn.Resource(VMIGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var v VMI
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &v); err != nil {
		return nil, fmt.Errorf("vmi %s/%s: %w", ns, name, err)
	}
	return &v, nil
}

// VMIState is a VMI's UID, phase and node in one line.
type VMIState struct {
	UID   string
	Phase string
	Node  string
}

// VMIStateOf observes a VMI ("NotFound" as the phase when there is none).
func (k *KubeVirt) VMIStateOf(ctx context.Context, ns, name string) func() (VMIState, error) {
	return func() (VMIState, error) {
		v, err := k.GetVMI(ctx, ns, name)
		if apierrors.IsNotFound(err) {
			return VMIState{Phase: "NotFound"}, nil
		}
		if err != nil {
			return VMIState{}, err
		}
		return VMIState{UID: string(v.UID), Phase: v.Status.Phase, Node: v.Status.NodeName}, nil
	}
}

// Launchers lists the virt-launcher pods of a VM, oldest first; with all,
// also those being deleted.
func (k *KubeVirt) Launchers(ctx context.Context, ns, vm string, all bool) ([]string, error) {
	l, err := k.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher,vm.kubevirt.io/name=" + vm})
	if err != nil {
		return nil, err
	}
	var names []string
	for i := range l.Items {
		if all || l.Items[i].DeletionTimestamp == nil {
			names = append(names, l.Items[i].Name)
		}
	}
	return names, nil
}

// Launcher observes the VM's launcher pod that is not being deleted (an
// error while there is none).
func (k *KubeVirt) Launcher(ctx context.Context, ns, vm string) func() (string, error) {
	return func() (string, error) {
		ps, err := k.Launchers(ctx, ns, vm, false)
		if err != nil {
			return "", err
		}
		if len(ps) == 0 {
			return "", fmt.Errorf("no virt-launcher pod of vm %s/%s", ns, vm)
		}
		return ps[0], nil
	}
}

// ConsoleFile is where Console keeps a guest's serial console, the file
// f.Guest(name) reads.
func (k *KubeVirt) ConsoleFile(name string) string {
	return filepath.Join(k.LogDir, "guests", "serial-"+name+".log")
}

// Console copies the guest's serial console so far (the launcher pod's
// guest-console-log container) into ConsoleFile(name).
func (k *KubeVirt) Console(ctx context.Context, ns, pod, name string) error {
	b, err := k.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "guest-console-log"}).DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("console of %s/%s: %w", ns, pod, err)
	}
	if err := os.MkdirAll(filepath.Dir(k.ConsoleFile(name)), 0o755); err != nil {
		return err
	}
	tmp := k.ConsoleFile(name) + ".part"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, k.ConsoleFile(name))
}

// FollowLauncher keeps the launcher's compute (virt-launcher, libvirt,
// QEMU) and hook-sidecar-0 logs in LogDir/<vm>-<pod>-<container>.log while
// the pod lives: when KubeVirt replaces a failed VMI, its pod and logs go
// within seconds. It waits (in the background, at most 2 min) for each
// container to start; ctx ends the copies.
func (k *KubeVirt) FollowLauncher(ctx context.Context, ns, vm, pod string) {
	for _, c := range []string{"compute", "hook-sidecar-0"} {
		go func() {
			// (the copy lives on the outer ctx, not the poll's)
			_ = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
				_, err := k.FollowLogs(ctx, ns, pod, c, fmt.Sprintf("%s-%s-%s.log", vm, pod, c))
				return err == nil, nil
			})
		}()
	}
}

// LauncherLog is the followed log of a launcher's container ("" if none).
func (k *KubeVirt) LauncherLog(vm, pod, container string) string {
	b, _ := os.ReadFile(filepath.Join(k.LogDir, fmt.Sprintf("%s-%s-%s.log", vm, pod, container)))
	return string(b)
}

// ContainerEnv is one variable of a container's environment on the first
// node (its OCI spec through ctr), such as the device plugin's
// VHOSTMQ_QUEUE_SLOTS, which the pod spec does not show.
func (f *Framework) ContainerEnv(ctx context.Context, containerID, name string) (string, error) {
	out, err := f.Ctr(ctx, "containers", "info", strings.TrimPrefix(containerID, "containerd://"))
	if err != nil {
		return "", err
	}
	var info struct {
		Spec struct {
			Process struct {
				Env []string `json:"env"`
			} `json:"process"`
		} `json:"Spec"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		return "", fmt.Errorf("ctr containers info %.12s: %w", containerID, err)
	}
	for _, e := range info.Spec.Process.Env {
		if v, ok := strings.CutPrefix(e, name+"="); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("no %s in the environment of container %.12s", name, containerID)
}

// BindingImage is the sidecar image of the vhostmq binding in the KubeVirt
// CR kubevirt/kubevirt ("" when it is not registered).
func (k *KubeVirt) BindingImage(ctx context.Context) (string, error) {
	u, err := k.Dyn.Resource(KubeVirtGVR).Namespace("kubevirt").Get(ctx, "kubevirt", metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	s, _, err := unstructured.NestedString(u.Object, "spec", "configuration", "network", "binding", "vhostmq", "sidecarImage")
	return s, err
}

// CreateMigration makes a VirtualMachineInstanceMigration of vmi (what
// virtctl migrate makes).
func (k *KubeVirt) CreateMigration(ctx context.Context, ns, name, vmi string) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"vmiName": vmi},
	}}
	_, err := k.Dyn.Resource(VMIMGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{FieldValidation: "Strict"})
	return err
}

// MigrationPhase observes a migration's phase ("NotFound" when gone).
func (k *KubeVirt) MigrationPhase(ctx context.Context, ns, name string) func() (string, error) {
	return func() (string, error) {
		u, err := k.Dyn.Resource(VMIMGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "NotFound", nil
		}
		if err != nil {
			return "", err
		}
		p, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return p, nil
	}
}

// DeleteMigration deletes a migration (a missing one is fine) and waits
// until it is gone, at most timeout.
func (k *KubeVirt) DeleteMigration(ctx context.Context, ns, name string, timeout time.Duration) error {
	err := k.Dyn.Resource(VMIMGVR).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := k.MigrationPhase(ctx, ns, name)()
		return err == nil && p == "NotFound", nil
	})
}

// AgentOn connects to the node agent of node: the first node's socket is
// the host's (f.AgentSocket); the second node's is in its own mount
// namespace, reached through /proc/PID/root of a process in it.
func (k *KubeVirt) AgentOn(node string) (agentv1.AgentClient, func() error, error) {
	if node != k.Node2 || k.Node2 == "" {
		a, cc, err := k.Agent()
		if err != nil {
			return nil, nil, err
		}
		return a, cc.Close, nil
	}
	pid, err := pidInMountNS(k.Node2MountNS)
	if err != nil {
		return nil, nil, err
	}
	f2 := *k.Framework
	f2.AgentSocket = fmt.Sprintf("/proc/%d/root%s", pid, k.AgentSocket)
	a, cc, err := f2.Agent()
	if err != nil {
		return nil, nil, err
	}
	return a, cc.Close, nil
}

// pidInMountNS finds a process in the mount namespace whose nsfs file is
// nsFile (a bind mount of /proc/PID/ns/mnt, as cluster.sh keeps it).
func pidInMountNS(nsFile string) (int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(nsFile, &want); err != nil {
		return 0, fmt.Errorf("mount namespace %s: %w", nsFile, err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat(fmt.Sprintf("/proc/%d/ns/mnt", pid), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process in the mount namespace of %s", nsFile)
}

// saveKubeVirt adds the VMs' side to a failed spec's diagnostics: VMs and
// VMIs (status and conditions), migrations, the virt-launcher pods' logs
// (compute, hook-sidecar-0, the guest's console) and virt-handler's and
// virt-controller's. Nothing when KubeVirt is not installed.
func (f *Framework) saveKubeVirt(ctx context.Context, save func(name, content string, err error)) {
	if _, err := f.Client.Discovery().ServerResourcesForGroupVersion("kubevirt.io/v1"); err != nil {
		return
	}
	out, err := f.Kubectl(ctx, "get", "vm,vmi,vmim", "-A", "-o", "yaml")
	save("kubevirt-vmis.yaml", out, err)
	l, err := f.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: "kubevirt.io=virt-launcher"})
	if err != nil {
		save("launchers.log", "", err)
		return
	}
	for _, p := range l.Items {
		var b strings.Builder
		for _, c := range []string{"compute", "hook-sidecar-0", "guest-console-log"} {
			out, err := f.Kubectl(ctx, "-n", p.Namespace, "logs", p.Name, "-c", c, "--tail", "200")
			fmt.Fprintf(&b, "=== %s/%s -c %s\n%s\n", p.Namespace, p.Name, c, out)
			if err != nil {
				fmt.Fprintf(&b, "--- error: %v\n", err)
			}
		}
		save("launcher-"+p.Name+".log", b.String(), nil)
	}
	for _, c := range []string{"ds/virt-handler", "deploy/virt-controller"} {
		out, err := f.Kubectl(ctx, "-n", "kubevirt", "logs", c, "--tail", "150", "--all-containers")
		save(strings.ReplaceAll(c, "/", "-")+".log", out, err)
	}
}
