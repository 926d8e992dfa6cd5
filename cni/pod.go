package cni

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/containernetworking/cni/pkg/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

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

// podAnnotations reads the pod's annotations. ok is false when no
// kubeconfig is configured (annotations are then not read) or the pod is
// not named in CNI_ARGS.
func podAnnotations(conf *NetConf, pod podArgs) (map[string]string, bool, error) {
	path := kubeconfigPath(conf)
	if path == "" || pod.Name == "" || pod.Namespace == "" {
		return nil, false, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, false, configError("kubeconfig: %s: %v", path, err)
	}
	rc.Timeout = Timeout
	rc.UserAgent = "vhostmq-cni"
	return getAnnotations(rc, pod)
}

func getAnnotations(rc *rest.Config, pod podArgs) (map[string]string, bool, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, false, configError("kubeconfig: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	p, err := cs.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		code := ErrPodLookup
		if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			code = types.ErrTryAgainLater
		}
		return nil, false, types.NewError(code, fmt.Sprintf("reading pod %s/%s for its vhostmq.io annotations", pod.Namespace, pod.Name), err.Error())
	}
	if pod.UID != "" && string(p.UID) != pod.UID {
		return nil, false, types.NewError(ErrPodLookup, fmt.Sprintf("pod %s/%s has UID %s, CNI_ARGS say %s (the pod was replaced)", pod.Namespace, pod.Name, p.UID, pod.UID), "")
	}
	return p.Annotations, true, nil
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
	return s, nil
}
