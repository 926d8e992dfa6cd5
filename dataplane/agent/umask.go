package agent

import "golang.org/x/sys/unix"

// umask sets the process umask and returns the previous one. It is only
// called while the API socket is created, before any other file is.
func umask(m int) int { return unix.Umask(m) }
