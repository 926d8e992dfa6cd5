// Package inproc holds what the in-process benchmarks (hack/bench/wakeup,
// hack/bench/density) share: the machine's CPU pressure for judging the
// noise, the process's CPU time, and the test frames their Go frontends
// send.
package inproc

import (
	"os"
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

// Frame is a 64-byte frame from src to dst with a local experimental
// ethertype: port security checks its source MAC only.
func Frame(dst, src [6]byte) []byte {
	f := make([]byte, 64)
	copy(f, dst[:])
	copy(f[6:], src[:])
	f[12], f[13] = 0x88, 0xb5
	return f
}
