package cni

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vhostmq/vhostmq/cni/kubevirt/podnet"
	"github.com/vhostmq/vhostmq/cni/kubevirt/vmi"
	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// Pod annotations that tune a pod's vhostmq interfaces. They override the
// network configuration.
const (
	// AnnotationQueues is the number of queue pairs of each vhostmq
	// interface of the pod (≤ the pod's allocated queue pairs).
	AnnotationQueues = "vhostmq.io/queues"
	// AnnotationSocketMode is "server" (QEMU in the pod creates the
	// socket) or "client" (the dataplane does).
	AnnotationSocketMode = "vhostmq.io/socket-mode"
	// AnnotationPolling is "interrupt", "adaptive" or "busy".
	AnnotationPolling = "vhostmq.io/polling"
	// AnnotationPortSecurity is "true" (the guest may send only from its
	// own MAC and IPAM addresses) or "false" (from any: it bridges or
	// routes).
	AnnotationPortSecurity = "vhostmq.io/port-security"
)

// DefaultKubeconfig is read when the configuration names no kubeconfig
// and the file exists; without one the plugin reads no annotations.
const DefaultKubeconfig = "/etc/cni/net.d/vhostmq.d/vhostmq.kubeconfig"

// ErrBadAnnotation: a vhostmq.io/ pod annotation has an invalid value.
const ErrBadAnnotation uint = 104

// ErrPodLookup: the pod could not be read from the API server.
const ErrPodLookup uint = 105

// podSettings are the per-pod values from annotations; zero values mean
// "not set".
type podSettings struct {
	queues     uint32
	socketMode string
	role       agentv1.Role
	poll       agentv1.PollingMode
	pollSet    bool
	security   *bool // port security; nil: the network's
}

// kubeconfigPath returns the kubeconfig to use, "" for none.
func kubeconfigPath(conf *NetConf) string {
	if conf.Kubeconfig != "" {
		return conf.Kubeconfig
	}
	if _, err := os.Stat(DefaultKubeconfig); err == nil {
		return DefaultKubeconfig
	}
	return ""
}

// podView is the pod as the API server has it, and a way to read the
// NADs and VMI behind it.
type podView struct {
	pod    *corev1.Pod
	lookup podnet.Lookup
	vmi    *vmi.VMI // of a virt-launcher pod, once read
	// the clients, for a live migration's source (migration.go)
	core kubernetes.Interface
	dyn  dynamic.Interface
}

// readPod reads the pod named in CNI_ARGS. It returns nil (and no error)
// when no kubeconfig is configured or the pod is not named: annotations
// are then not read.
func readPod(conf *NetConf, pod podArgs) (*podView, error) {
	path := kubeconfigPath(conf)
	if path == "" || pod.Name == "" || pod.Namespace == "" {
		return nil, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, configError("kubeconfig: %s: %v", path, err)
	}
	rc.Timeout = Timeout
	rc.UserAgent = "vhostmq-cni"
	return getPod(rc, pod)
}

func getPod(rc *rest.Config, pod podArgs) (*podView, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, configError("kubeconfig: %v", err)
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, configError("kubeconfig: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	p, err := cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, apiError(fmt.Sprintf("reading pod %s/%s for its vhostmq.io annotations", pod.Namespace, pod.Name), err)
	}
	if pod.UID != "" && string(p.UID) != pod.UID {
		return nil, types.NewError(ErrPodLookup, fmt.Sprintf("pod %s/%s has UID %s, CNI_ARGS say %s (the pod was replaced)", pod.Namespace, pod.Name, p.UID, pod.UID), "")
	}
	return &podView{pod: p, lookup: &podnet.ClusterLookup{Client: dc}, core: cs, dyn: dc}, nil
}

// apiError is ErrPodLookup for answers that will not change (not found,
// forbidden), try-again-later for the rest.
func apiError(what string, err error) error {
	code := ErrPodLookup
	if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
		code = types.ErrTryAgainLater
	}
	return types.NewError(code, what, err.Error())
}

// launcherVMI returns the VMI behind a virt-launcher pod (read once), or
// nil for other pods.
func (v *podView) launcherVMI() (*vmi.VMI, error) {
	name := podnet.LauncherOf(v.pod)
	if name == "" || v.vmi != nil {
		return v.vmi, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	b, err := v.lookup.VMI(ctx, v.pod.Namespace, name)
	if err != nil {
		return nil, apiError("reading VirtualMachineInstance "+v.pod.Namespace+"/"+name, err)
	}
	x, err := vmi.Parse(b)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "VirtualMachineInstance "+name, err.Error())
	}
	v.vmi = x
	return x, nil
}

// vmiQueues applies the binding sidecar's queue rule to the VMI behind a
// virt-launcher pod; ok is false for other pods.
func (v *podView) vmiQueues() (q uint32, from string, ok bool, err error) {
	x, err := v.launcherVMI()
	if err != nil || x == nil {
		return 0, "", false, err
	}
	n, _, err := x.Queues()
	if err != nil {
		return 0, "", false, types.NewError(ErrBadAnnotation, "VirtualMachineInstance "+x.Metadata.Name+": "+err.Error(), "")
	}
	return uint32(n), "VirtualMachineInstance " + x.Metadata.Name, true, nil
}

// vmiMAC is the guest MAC of the VMI interface behind pod interface
// ifname, as the binding sidecar computes it; "" for other pods.
func (v *podView) vmiMAC(ifname string) (string, error) {
	x, err := v.launcherVMI()
	if err != nil || x == nil {
		return "", err
	}
	if network := x.NetworkOfPodInterface(ifname); network != "" {
		return x.MAC(network), nil
	}
	return "", nil
}

// networks counts the pod's networks that use resourceName.
func (v *podView) networks(resourceName string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	k, err := podnet.CountNetworks(ctx, v.lookup, v.pod, resourceName)
	if err != nil {
		return 0, apiError("counting the pod's "+resourceName+" networks", err)
	}
	return k, nil
}

func annotationError(key, value, want string) error {
	return types.NewError(ErrBadAnnotation, fmt.Sprintf("pod annotation %s: %q is not %s", key, value, want), "")
}

// parseAnnotations validates the vhostmq.io/ annotations.
func parseAnnotations(a map[string]string) (podSettings, error) {
	var s podSettings
	if v, ok := a[AnnotationQueues]; ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n < 1 || n > maxQueuePairs {
			return s, annotationError(AnnotationQueues, v, fmt.Sprintf("a number of queue pairs in 1..%d", maxQueuePairs))
		}
		s.queues = uint32(n)
	}
	if v, ok := a[AnnotationSocketMode]; ok {
		role, err := parseSocketMode(v)
		if err != nil {
			return s, annotationError(AnnotationSocketMode, v, `"server" (QEMU creates the socket) or "client" (the dataplane does)`)
		}
		s.socketMode, s.role = v, role
	}
	if v, ok := a[AnnotationPolling]; ok {
		p, err := parsePolling(v)
		if err != nil || v == "" {
			return s, annotationError(AnnotationPolling, v, "interrupt, adaptive or busy")
		}
		s.poll, s.pollSet = p, true
	}
	if v, ok := a[AnnotationPortSecurity]; ok {
		if v != "true" && v != "false" {
			return s, annotationError(AnnotationPortSecurity, v, `"true" (the guest sends only from its own addresses) or "false" (from any address)`)
		}
		on := v == "true"
		s.security = &on
	}
	return s, nil
}
