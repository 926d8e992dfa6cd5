#!/usr/bin/env bash
# Regenerates the committed gRPC/protobuf code from dataplane/api/v1/*.proto
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
PATH=$bin:$PATH protoc -I dataplane/api/v1 \
    --go_out=dataplane/api/v1 --go_opt=paths=source_relative \
    --go-grpc_out=dataplane/api/v1 --go-grpc_opt=paths=source_relative \
    dataplane/api/v1/agent.proto
echo "generated dataplane/api/v1 with protoc $(protoc --version | awk '{print $2}'), protoc-gen-go $PROTOC_GEN_GO, protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC"
