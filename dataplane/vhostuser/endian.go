//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package vhostuser

// vhost-user messages are host-endian and virtio 1.x rings little-endian;
// this code decodes both with binary.LittleEndian, so it refuses to build on
// big-endian hosts rather than misread every message.
var _ = bigEndianHostsAreNotSupported
