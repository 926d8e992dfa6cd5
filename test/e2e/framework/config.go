//go:build e2e

// Package framework is the cluster end-to-end tests' plumbing: the settings
// the bash bring-up exports, the clients (API server, the node agent's gRPC
// API, kubectl, the node's containerd), the Eventually helpers and the
// failure reporter. The specs live in test/e2e; see test/e2e/README.md.
package framework

import (
	"os"
	"path/filepath"
	"time"

	"github.com/vhostmq/vhostmq/internal/repo"
)

// Config is where the cluster is. Every field comes from an environment
// variable that hack/cluster/e2e.sh exports, with the default of
// hack/cluster/lib.sh, so `go test -tags e2e ./test/e2e/` works by hand
// against a cluster brought up by hack/cluster/cluster.sh up.
type Config struct {
	Kubeconfig  string // VHOSTMQ_E2E_KUBECONFIG
	NetNS       string // VHOSTMQ_E2E_NETNS: the API server's network namespace ("" = this one)
	KubectlBin  string // VHOSTMQ_E2E_KUBECTL: a kubectl of the cluster's version
	Node        string // VHOSTMQ_E2E_NODE
	AgentSocket string // VHOSTMQ_E2E_AGENT_SOCKET: the node agent's gRPC API (a hostPath)
	CtrBin      string // VHOSTMQ_E2E_CTR: containerd's ctr
	CtrSocket   string // VHOSTMQ_E2E_CTR_SOCKET: the node's containerd
	ClusterSh   string // VHOSTMQ_E2E_CLUSTER_SH: hack/cluster/cluster.sh (restart-kubelet)
	ClusterRun  string // VHOSTMQ_CLUSTER_RUN: kubelet.start lives there
	ClusterLogs string // VHOSTMQ_CLUSTER_LOGS: kubelet.log lives there
	Manifest    string // VHOSTMQ_E2E_MANIFEST: the vhostmq DaemonSet the bring-up applied
	Image       string // VHOSTMQ_E2E_TEST_IMAGE: the test pods' image (imported, never pulled)
	LogDir      string // VHOSTMQ_E2E_LOGS: this run's folder for diagnostics and saved logs
	Namespace   string // VHOSTMQ_E2E_NAMESPACE: where the vhostmq DaemonSet runs
	HelmBin     string // VHOSTMQ_E2E_HELM: helm (hack/manifests.sh builds it)
	Chart       string // VHOSTMQ_E2E_CHART: the chart the DRA specs install
	CDIDir      string // VHOSTMQ_E2E_CDI_DIR: the CDI spec folder of the node's containerd
	CNIDir      string // VHOSTMQ_E2E_CNI_DIR: multus-lite's state (state/) when the node's CNI is multus-lite (e2e.sh --cni)
	MultusLog   string // VHOSTMQ_E2E_MULTUS_LOG: multus-lite's log of every ADD and DEL
	GuestImage  string // VHOSTMQ_E2E_GUEST_IMAGE: the folder with the test guest's vmlinux and initramfs (hack/guest/build.sh)
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// LoadConfig reads the environment.
func LoadConfig() Config {
	root, err := repo.Root()
	if err != nil {
		root = "."
	}
	run := env("VHOSTMQ_CLUSTER_RUN", "/run/vhostmq-cluster")
	logs := env("VHOSTMQ_CLUSTER_LOGS", "/var/log/vhostmq-cluster")
	netns := env("VHOSTMQ_CLUSTER_NETNS", "vhostmq-cluster")
	k8s := env("VHOSTMQ_K8S_VERSION", "v1.37.2")
	cache := env("VHOSTMQ_K8S_CACHE", "/var/cache/vhostmq/k8s")
	return Config{
		Kubeconfig:  env("VHOSTMQ_E2E_KUBECONFIG", env("VHOSTMQ_CLUSTER_DATA", "/var/lib/vhostmq-cluster")+"/admin.kubeconfig"),
		NetNS:       env("VHOSTMQ_E2E_NETNS", "/run/netns/"+netns),
		KubectlBin:  env("VHOSTMQ_E2E_KUBECTL", filepath.Join(cache, "bin", k8s, "kubectl")),
		Node:        env("VHOSTMQ_E2E_NODE", "vhostmq-node"),
		AgentSocket: env("VHOSTMQ_E2E_AGENT_SOCKET", "/run/vhostmq/api.sock"),
		CtrBin:      env("VHOSTMQ_E2E_CTR", filepath.Join(cache, "containerd", env("VHOSTMQ_CONTAINERD_VERSION", "v2.4.2"), "ctr")),
		CtrSocket:   env("VHOSTMQ_E2E_CTR_SOCKET", run+"/containerd/containerd.sock"),
		ClusterSh:   env("VHOSTMQ_E2E_CLUSTER_SH", filepath.Join(root, "hack/cluster/cluster.sh")),
		ClusterRun:  run,
		ClusterLogs: logs,
		Manifest:    env("VHOSTMQ_E2E_MANIFEST", filepath.Join(root, "hack/cluster/manifests/vhostmq.yaml")),
		Image:       env("VHOSTMQ_E2E_TEST_IMAGE", "localhost/vhostmq/busybox:dev"),
		LogDir:      env("VHOSTMQ_E2E_LOGS", filepath.Join(logs, "e2e", time.Now().UTC().Format("20060102T150405Z"))),
		Namespace:   env("VHOSTMQ_E2E_NAMESPACE", "vhostmq-system"),
		HelmBin:     env("VHOSTMQ_E2E_HELM", filepath.Join(env("VHOSTMQ_TOOLS", "/var/cache/vhostmq/tools"), "helm-v3.22.0")),
		Chart:       env("VHOSTMQ_E2E_CHART", filepath.Join(root, "charts/vhostmq")),
		CDIDir:      env("VHOSTMQ_E2E_CDI_DIR", run+"/cdi"),
		CNIDir:      env("VHOSTMQ_E2E_CNI_DIR", "/run/vhostmq-test-cni"),
		MultusLog:   env("VHOSTMQ_E2E_MULTUS_LOG", filepath.Join(logs, "multus-lite.log")),
		GuestImage:  env("VHOSTMQ_E2E_GUEST_IMAGE", filepath.Join(root, "_output/guest")),
	}
}
