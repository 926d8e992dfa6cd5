// Package inproc holds what the in-process benchmarks (hack/bench/wakeup,
// density, scrape, neighbour, limiter) share: the machine's CPU pressure
// for judging the noise, the process's CPU time and RSS, the test frames
// their Go frontends send, rates as flags spell them, the dataplane and
// its frontends (rig.go), and where their threads run (threads.go).
package inproc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Pressure is the kernel's CPU pressure line (some avg10...).
func Pressure() string {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return "cpu pressure unknown"
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return "cpu pressure: " + line
}

// CPUTime is the whole process's user and system time.
func CPUTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RSSMiB is the process's resident set (/proc/self/statm), 0 when unknown.
func RSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseFloat(f[1], 64)
	return pages * float64(os.Getpagesize()) / (1 << 20)
}

// Broadcast is the broadcast MAC address.
var Broadcast = [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Frame is a 64-byte frame from src to dst with a local experimental
// ethertype: port security checks its source MAC only.
func Frame(dst, src [6]byte) []byte { return FrameOf(dst, src, 64) }

// FrameOf is Frame of size bytes (Ethernet header included).
func FrameOf(dst, src [6]byte, size int) []byte {
	f := make([]byte, size)
	copy(f, dst[:])
	copy(f[6:], src[:])
	f[12], f[13] = 0x88, 0xb5
	return f
}

// ParseRate reads a rate in bits per second as the flags spell it: a
// number with an optional SI suffix (k, M, G, T: powers of 1000, as link
// speeds and the CNI bandwidth plugin count).
func ParseRate(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	num, mult := s, 1.0
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'k', 'K':
			mult = 1e3
		case 'M':
			mult = 1e6
		case 'G':
			mult = 1e9
		case 'T':
			mult = 1e12
		}
		if mult != 1 {
			num = s[:n-1]
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%q is not a rate (bits/s, e.g. 512k, 100M, 10G)", s)
	}
	return uint64(v * mult), nil
}
