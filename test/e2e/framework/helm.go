//go:build e2e

package framework

import (
	"context"
	"path/filepath"
)

// Helm runs helm on the cluster, in the API server's network namespace as
// Kubectl does, with its cache and config under the cluster's run folder
// (as hack/cluster/test-dra.sh ran it: nothing in ~/.cache or ~/.config).
// For the specs whose check is the chart's install or upgrade itself.
func (f *Framework) Helm(ctx context.Context, args ...string) (string, error) {
	home := filepath.Join(f.ClusterRun, "helm")
	base := []string{"env", "HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config",
		"HELM_DATA_HOME=" + home + "/data", f.HelmBin, "--kubeconfig", f.Kubeconfig}
	if f.NetNS != "" {
		base = append([]string{"nsenter", "--net=" + f.NetNS, "--"}, base...)
	}
	base = append(base, args...)
	return Run(ctx, base[0], base[1:]...)
}
