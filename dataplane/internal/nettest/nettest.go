// Package nettest is what the dataplane's tests share: network namespaces
// they make and enter, commands they run in them, the few frames they
// build by hand, and connected unix socket pairs (an in-process stand-in
// for a vhost-user or handoff connection). Test support only; nothing
// outside dataplane imports it.
package nettest

import (
	"encoding/binary"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// SocketPair returns both ends of a socketpair(AF_UNIX, SOCK_STREAM); a
// failure ends the test.
func SocketPair(tb testing.TB) (*net.UnixConn, *net.UnixConn) {
	tb.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	var cs [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			tb.Fatal(err)
		}
		cs[i] = c.(*net.UnixConn)
	}
	return cs[0], cs[1]
}

// Run runs a command and returns its output; a failure ends the test.
func Run(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// AddNetns makes the named network namespaces, removed when the test
// ends; without root the test is skipped.
func AddNetns(tb testing.TB, names ...string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root for network namespaces")
	}
	for _, ns := range names {
		Run(tb, "ip", "netns", "add", ns)
		tb.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
}

// In runs f with this thread in the named namespace (a tap or a socket
// is made where it runs).
func In(tb testing.TB, name string, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.GetFromName(name)
	if err != nil {
		tb.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(ns); err != nil {
		tb.Fatal(err)
	}
	defer netns.Set(orig)
	f()
}

// ARPRequest is a broadcast "who has dstIP, tell srcIP" from src.
func ARPRequest(src [6]byte, srcIP, dstIP [4]byte) []byte {
	f := make([]byte, 42)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:], src[:])
	binary.BigEndian.PutUint16(f[12:], 0x0806)
	copy(f[14:], []byte{0, 1, 8, 0, 6, 4, 0, 1})
	copy(f[22:], src[:])
	copy(f[28:], srcIP[:])
	copy(f[38:], dstIP[:])
	return f
}

// Checksum is the Internet checksum of b (RFC 1071).
func Checksum(b []byte) uint16 {
	var s uint32
	for ; len(b) >= 2; b = b[2:] {
		s += uint32(binary.BigEndian.Uint16(b))
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// IPv4 is an Ethernet frame from src to dst carrying an IPv4 packet
// (TTL 64, header checksum set) of protocol proto with l4 as its payload.
func IPv4(dst, src [6]byte, srcIP, dstIP [4]byte, proto byte, l4 []byte) []byte {
	f := make([]byte, 14+20+len(l4))
	copy(f, dst[:])
	copy(f[6:], src[:])
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:], srcIP[:])
	copy(ip[16:], dstIP[:])
	binary.BigEndian.PutUint16(ip[10:], Checksum(ip[:20]))
	copy(ip[20:], l4)
	return f
}
