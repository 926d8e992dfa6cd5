package dhcp

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestBusyboxClient: a stock DHCP client (busybox udhcpc) in a network
// namespace, behind a veth pair this test creates, configures itself from
// the server: address, prefix, router, DNS, search domains, classless
// routes and MTU.
func TestBusyboxClient(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox")
	}
	ns := fmt.Sprintf("vmqdhcp%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	host, guest := fmt.Sprintf("vdh%d", os.Getpid()%100000), fmt.Sprintf("vdg%d", os.Getpid()%100000)
	run("ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run("ip", "link", "add", host, "type", "veth", "peer", "name", guest, "netns", ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	run("ip", "netns", "exec", ns, "ip", "link", "set", guest, "address", net.HardwareAddr(guestMAC[:]).String(), "up")
	run("ip", "link", "set", host, "up")

	ifi, err := net.InterfaceByName(host)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
	s := newServer(t, testLease())
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		buf, out := make([]byte, 2048), make([]byte, FrameSize)
		for ctx.Err() == nil {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || !IsClientFrame(buf[:n]) {
				continue
			}
			if m := s.Handle(buf[:n], out); m > 0 {
				unix.Write(fd, out[:m])
			}
		}
	}()
	defer func() { cancel(); <-served }()

	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	env := filepath.Join(dir, "env")
	os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] && env > "+env+"\nexit 0\n"), 0o755)
	cmd := exec.Command("ip", "netns", "exec", ns, busybox, "udhcpc", "-i", guest, "-f", "-q", "-n", "-t", "5", "-T", "1",
		"-O", "staticroutes", "-O", "search", "-O", "mtu", "-s", script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("udhcpc: %v\n%s", err, out)
	}
	b, err := os.ReadFile(env)
	if err != nil {
		t.Fatalf("udhcpc never bound: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			got[k] = v
		}
	}
	for k, v := range map[string]string{
		"ip": "10.1.2.3", "mask": "24", "subnet": "255.255.255.0", "router": "10.1.2.1", "dns": "10.96.0.10",
		"serverid": "10.1.2.1", "lease": "3600", "mtu": "1450", "domain": "default.svc.cluster.local",
		"search":       "default.svc.cluster.local svc.cluster.local",
		"staticroutes": "192.168.0.0/16 10.1.2.254 172.16.0.0/12 10.1.2.1 0.0.0.0/0 10.1.2.1",
		"broadcast":    "10.1.2.255",
	} {
		if got[k] != v {
			t.Errorf("udhcpc's %s = %q, want %q", k, got[k], v)
		}
	}
	if s.Counters.Offers.Load() < 1 || s.Counters.Acks.Load() < 1 || s.Counters.Malformed.Load() != 0 {
		t.Errorf("offers %d acks %d malformed %d", s.Counters.Offers.Load(), s.Counters.Acks.Load(), s.Counters.Malformed.Load())
	}
	t.Logf("udhcpc: %s", strings.TrimSpace(string(out)))
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
