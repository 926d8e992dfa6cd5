# Multi-stage build of vhostmq's static binaries. The runtime image holds
# only the binaries; the dataplane needs no libc.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/...

FROM scratch
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/vhostmq-dataplane"]
