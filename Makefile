# vhostmq — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
STATICCHECK_VERSION ?= v0.8.2
FUZZTIME ?= 30s

.DEFAULT_GOAL := help

##@ Main

.PHONY: demo
demo: build ## Boot two QEMU guests on the dataplane, ping and iperf3 between them, show per-queue counters
	hack/demo.sh

.PHONY: test
test: verify test-unit test-race test-e2e test-cluster test-kubevirt ## Everything CI runs: checks, unit/integration tests, fuzz seeds, QEMU, DPDK, CNI and libvirt end-to-end tests, device plugin and CNI on a real Kubernetes node, VMs on a real KubeVirt

##@ Build

.PHONY: build
build: ## Build every binary into bin/
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/...

##@ Tests

.PHONY: test-unit
test-unit: ## Go unit and integration tests (runs the fuzz seed corpora too), and the chart's alerts under promtool
	$(GO) test -count=1 ./...
	hack/test-alerts.sh

.PHONY: test-race
test-race: ## Go tests of the dataplane under the race detector
	$(GO) test -count=1 -race ./dataplane/... ./plugin/... ./cni/...

.PHONY: test-e2e
test-e2e: build ## Real peers: two QEMU guests (server and client roles, kill -9 and reconnect; queue counts changed under traffic), a guest spoofing another's addresses (port security on, and off for a bridging guest), a guest live-migrated to another QEMU while it receives a file (both roles), live ports handed to a rebuilt dataplane under traffic (both roles), DPDK virtio-user, the alerts in a real Prometheus and vhostmqctl top in tmux, the CNI under cnitool and containerd+crictl, two nodes joined by tap uplinks (DHCP, VLANs), nodes on three subnets behind a router joined by the vxlan uplink (the kernel's vxlan device as a peer), the KubeVirt binding's domain booted by libvirtd, the Dockerfile built by podman
	hack/install-deps.sh
	hack/e2e-qemu.sh --role both --reconnect yes
	hack/e2e-security.sh
	hack/e2e-queues.sh
	hack/e2e-migrate.sh --role both
	hack/e2e-handoff.sh --role both --baseline client
	hack/soak.sh --duration 120
	hack/e2e-dpdk.sh
	hack/e2e-observe.sh
	hack/e2e-cni.sh
	hack/e2e-uplink.sh
	hack/e2e-overlay.sh
	hack/e2e-kubevirt-libvirt.sh
	hack/image.sh
	hack/bench/run.sh --smoke
	hack/bench/flows.sh --smoke
	hack/bench/instructions.sh --smoke --budget hack/bench/instructions-budget.tsv

.PHONY: test-cluster
test-cluster: build ## Device plugin, CNI and DRA driver on a real one-node Kubernetes (hack/cluster/; Kubernetes and containerd are built once per machine: 13-20 min cold, ~1 min after)
	hack/cluster/test-deviceplugin.sh
	hack/cluster/test-cni.sh
	hack/cluster/test-dra.sh

.PHONY: test-kubevirt
test-kubevirt: build ## VMs on vhostmq under a real KubeVirt v1.7.0 on two nodes, one live-migrated between them while it receives a file (hack/kubevirt/; KubeVirt and its images are built once per machine and cached)
	hack/kubevirt/test.sh

.PHONY: soak
soak: build ## QEMU guests changing their queue counts under iperf3, DPDK frontends on ports created, reconnected and deleted through the API, the dataplane killed and restarted; asserts no stall and no fd/goroutine/RSS growth (SOAK_SECONDS, default 1800; make test runs 120 s)
	hack/install-deps.sh
	hack/soak.sh --duration $(or $(SOAK_SECONDS),1800)

.PHONY: bench
bench: build ## vhostmq vs DPDK's vhost backend with DPDK virtio-user traffic, interleaved trials (hack/bench/run.sh; BENCH_ARGS=--smoke for a short run), the flows x queue pairs scaling table through the switch (hack/bench/flows.sh; FLOWS_ARGS), callgrind instructions per frame against DPDK (hack/bench/instructions.sh), then the in-process Go benchmarks, idle CPU and wake-up latency per polling mode (hack/bench/wakeup), what idle ports cost a busy pair and the node (hack/bench/density), what a /metrics scrape costs at each number of ports (hack/bench/scrape), a request/response neighbour's round-trip p50/p99/p999 quiet, beside a flood on the same worker and beside the flood under an egress limit (hack/bench/neighbour), how closely the rate limits hold 512k-10G, egress and ingress, 64 and 1500 B (hack/bench/limiter), the same at 1G and 10G with DPDK virtio-user traffic, which offers more than the in-process generator (hack/bench/limiter-dpdk.sh; LIMITER_DPDK_ARGS, e.g. --trials 3), and CNI ADD p50/p99/max with 50 one-queue-pair pods created at once on the one-node test cluster, through multus-lite (hack/bench/cni-burst.sh; CNI_BURST_ARGS, e.g. --pods 20; brings the cluster up unless one with multus-lite is: Kubernetes is built once per machine, 10-17 min cold)
	hack/install-deps.sh --no-kernel
	hack/bench/run.sh $(BENCH_ARGS)
	hack/bench/flows.sh $(if $(findstring --smoke,$(BENCH_ARGS)),--smoke) $(FLOWS_ARGS)
	hack/bench/instructions.sh
	$(GO) test -run '^$$' -bench . -benchtime 200000x ./dataplane/
	$(GO) run ./hack/bench/wakeup
	$(GO) run ./hack/bench/density
	$(GO) run ./hack/bench/scrape
	$(GO) run ./hack/bench/neighbour
	$(GO) run ./hack/bench/limiter
	hack/bench/limiter-dpdk.sh $(LIMITER_DPDK_ARGS)
	hack/bench/cni-burst.sh $(CNI_BURST_ARGS)

.PHONY: bench-instructions
bench-instructions: ## Callgrind instructions per frame: vhostmq's per-frame path (worker.pass) vs DPDK's vhost backend (testpmd's forwarding lcore) on the same frames, and their ratio (hack/bench/instructions.sh; INSTR_ARGS, e.g. --smoke, --no-dpdk, --paths, --budget FILE)
	hack/install-deps.sh --no-kernel
	hack/bench/instructions.sh $(INSTR_ARGS)

.PHONY: bench-handoff
bench-handoff: build ## How long an upgrade stops the rings: 10 handoffs between two builds under QEMU traffic, quiet and beside stress-ng loads (cpu, vm, page faults, forks, mixed); frozen time and hello->serving, p50/max per load (hack/bench/handoff.sh; HANDOFF_ARGS, e.g. --runs 5 --loads none,cpu)
	hack/install-deps.sh
	hack/bench/handoff.sh $(HANDOFF_ARGS)

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 30s)
	hack/fuzz.sh $(FUZZTIME)

##@ Checks

.PHONY: doctor
doctor: ## Print what the tests will use on this machine (cgroups, hugepages, QEMU, DPDK, OCI runtime, caches) and fail early when something cannot work
	hack/doctor.sh

.PHONY: generate
generate: ## Regenerate the gRPC/protobuf code (agent API, KubeVirt hook API)
	hack/generate.sh

.PHONY: docs
docs: ## Regenerate docs/reference/helm-values.md from the chart's values.schema.json and values.yaml (go test ./hack/docsgen fails when it is stale)
	$(GO) run ./hack/docsgen

.PHONY: verify
verify: ## gofmt, go vet, staticcheck, shellcheck, generated code, every mermaid diagram in the docs parses, helm lint, deploy/ up to date with the chart, and the chart's exposure rules (go test ./charts/)
	hack/verify.sh $(STATICCHECK_VERSION)
	hack/manifests.sh --check
	hack/docscheck/mermaid.sh

.PHONY: manifests
manifests: ## Lint the Helm chart and render deploy/vhostmq.yaml from it
	hack/manifests.sh

.PHONY: image
image: ## Build the Dockerfile's images with podman and check they hold the offline path's exact binaries (hack/image.sh --keep)
	hack/install-deps.sh --no-kernel
	hack/image.sh --keep

##@ Misc

.PHONY: clean
clean: ## Remove build output
	rm -rf $(BIN) _output

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)
