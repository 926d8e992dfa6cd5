#!/usr/bin/env bash
# Regenerates the committed gRPC/protobuf code from dataplane/api/v1/*.proto
# and cni/kubevirt/hookapi/*/*.proto
# with pinned generator versions (protoc from Debian's protobuf-compiler).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
PROTOC_GEN_GO=v1.36.12
PROTOC_GEN_GO_GRPC=v1.6.2
if ! command -v protoc >/dev/null; then
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends protobuf-compiler >/dev/null
fi
bin=$(go env GOPATH)/bin
GOFLAGS="" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO"
GOFLAGS="" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC"
gen() { # gen DIR PROTO
    PATH=$bin:$PATH protoc -I "$1" \
        --go_out="$1" --go_opt=paths=source_relative \
        --go-grpc_out="$1" --go-grpc_opt=paths=source_relative \
        "$1/$2"
}
gen dataplane/api/v1 agent.proto
# KubeVirt's hook API, re-declared for wire compatibility
gen cni/kubevirt/hookapi/info info.proto
gen cni/kubevirt/hookapi/v1alpha3 callbacks.proto
echo "generated dataplane/api/v1 and cni/kubevirt/hookapi with protoc $(protoc --version | awk '{print $2}'), protoc-gen-go $PROTOC_GEN_GO, protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC"
