// Command vhostmqctl is the operator CLI of the vhostmq node agent: ports,
// queue placement and load, stats, capacity and health over the agent's
// gRPC API socket. Run "vhostmqctl help" for the commands; the
// implementation is in package dataplane/ctl.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/vhostmq/vhostmq/dataplane/ctl"
)

func main() {
	// Interrupt ends health --watch (exit 0) or cuts a stats interval short.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := ctl.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
