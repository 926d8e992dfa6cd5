//go:build e2e

package framework

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// CreatePod creates p.
func (f *Framework) CreatePod(ctx context.Context, p *corev1.Pod) (*corev1.Pod, error) {
	return f.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
}

// DeletePods deletes pods with a 1 s grace period (missing ones are fine)
// and waits until they are gone, at most timeout.
func (f *Framework) DeletePods(ctx context.Context, ns string, timeout time.Duration, names ...string) error {
	grace := int64(1)
	for _, n := range names {
		err := f.Client.CoreV1().Pods(ns).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: &grace})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s/%s: %w", ns, n, err)
		}
	}
	var left []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		left = left[:0]
		for _, n := range names {
			_, err := f.Client.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
			if err == nil {
				left = append(left, n)
			} else if !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("pods %s/{%s} not gone within %s: %w", ns, strings.Join(left, ","), timeout, err)
	}
	return nil
}

// DeleteLabelled deletes every pod of a label selector and waits until
// they are gone (the specs' clean-up: DeferCleanup(f.DeleteLabelled, ...)).
func (f *Framework) DeleteLabelled(ctx context.Context, ns, selector string) error {
	l, err := f.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err
	}
	var names []string
	for _, p := range l.Items {
		names = append(names, p.Name)
	}
	return f.DeletePods(ctx, ns, 60*time.Second, names...)
}

// PodEnv is one environment variable as a process started in the pod's
// (first) container sees it (kubectl exec POD -- env).
func (f *Framework) PodEnv(ctx context.Context, ns, pod, name string) (string, error) {
	out, err := f.Kubectl(ctx, "-n", ns, "exec", pod, "--", "env")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, name+"="); ok {
			return v, nil
		}
	}
	return "", nil
}
