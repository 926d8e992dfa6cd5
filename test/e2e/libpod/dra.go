//go:build e2e

package libpod

import corev1 "k8s.io/api/core/v1"

// WithClaimTemplate gives the pod a ResourceClaim made from template (the
// pod's claim entry called entry) and the container its use.
func WithClaimTemplate(entry, template string) Option {
	return func(p *corev1.Pod) {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: entry, ResourceClaimTemplateName: &template})
		c := &p.Spec.Containers[0]
		c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: entry})
	}
}
