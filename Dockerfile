# vhostmq images, multi-stage, static Go binaries on an empty base.
#   docker build -t vhostmq:dev .                                   # every binary; entrypoint: the dataplane
#   docker build --target kubevirt-binding -t vhostmq/kubevirt-binding:dev .
# The chart runs each binary by its path, so one image serves the node
# DaemonSet and the webhook; KubeVirt starts binding sidecars without
# arguments, so the sidecar image differs only in its entrypoint.
# hack/cluster/images.sh builds the same binaries into OCI tarballs without a
# container engine (no registry or Docker here) and imports them into containerd;
# hack/image.sh (in make test) builds this file with podman and checks that both
# hold the same bytes.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/...

FROM scratch AS kubevirt-binding
COPY --from=build /out/vhostmq-kubevirt-binding /usr/local/bin/
# KubeVirt runs sidecars as QEMU's user
USER 107:107
ENTRYPOINT ["/usr/local/bin/vhostmq-kubevirt-binding"]

FROM scratch AS vhostmq
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/vhostmq-dataplane"]
