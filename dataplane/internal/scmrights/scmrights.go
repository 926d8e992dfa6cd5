// Package scmrights reads the file descriptors a unix socket message
// carries (SCM_RIGHTS), for the two protocols that pass them: vhost-user
// and the dataplane handoff.
package scmrights

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Parse returns the fds in a message's ancillary data, in order. On an
// error it closes those it had parsed.
func Parse(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parsing ancillary data: %w", err)
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			Close(fds)
			return nil, fmt.Errorf("parsing SCM_RIGHTS: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// Close closes every fd of fds that is not negative.
func Close(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}
