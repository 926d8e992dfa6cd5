// Package flags parses the command-line values the node's Kubernetes
// plugins (device plugin, DRA driver) share, with errors naming the flag.
package flags

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// Owner parses --socket-owner "uid:gid".
func Owner(v string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(v, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("--socket-owner: %q is not uid:gid", v)
	}
	return uid, gid, nil
}

// Mode parses --socket-mode, an octal mode (the plugins check its bounds).
func Mode(v string) (os.FileMode, error) {
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("--socket-mode: %q is not an octal mode", v)
	}
	return os.FileMode(m), nil
}

// Logger makes the text logger of --log-level.
func Logger(level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %q is not debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv})), nil
}
