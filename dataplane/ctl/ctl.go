// Package ctl implements vhostmqctl, the operator CLI of the vhostmq node
// agent: it speaks the agent's gRPC API (dataplane/api/v1) over the agent's
// unix socket and prints aligned tables for people or JSON for scripts.
//
// The commands are a cobra tree (flags, --help, shell completion with port
// IDs from the agent). cmd/vhostmqctl only calls Run; everything else is
// here so that tests can drive the whole CLI against an in-process agent.
package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
)

// Exit codes of Run.
const (
	ExitOK          = 0 // the command succeeded
	ExitFailed      = 1 // the request failed (the agent said no, or a timeout)
	ExitUsage       = 2 // bad command line
	ExitUnreachable = 3 // cannot connect to the agent's API socket
)

const (
	// DefaultSocket is the agent's API socket when neither --socket nor
	// EnvSocket names one.
	DefaultSocket = "/run/vhostmq/api.sock"
	// EnvSocket overrides DefaultSocket.
	EnvSocket = "VHOSTMQ_API_SOCKET"
	// DefaultTimeout bounds each request.
	DefaultTimeout = 5 * time.Second
	// DefaultInterval is how long stats and queues sample for rates.
	DefaultInterval = time.Second
)

const prog = "vhostmqctl"

// Runner runs vhostmqctl commands. The zero value of every field but
// Stdout and Stderr means the real thing (os.Getenv, time.Now, a sleep
// that ends early when the context is done).
type Runner struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// Now stamps health --watch updates, and times the sampling interval
	// when the agent does not stamp its stats.
	Now func() time.Time
	// Sleep waits between the two stats samples of stats and queues.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Run runs the vhostmqctl command line args (without the program name)
// and returns the process exit code (ExitOK, ExitFailed, ExitUsage or
// ExitUnreachable). Results go to stdout, errors to stderr. env looks up
// environment variables (os.Getenv; nil means os.Getenv). Cancelling ctx
// ends health --watch with ExitOK.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) int {
	r := Runner{Stdout: stdout, Stderr: stderr, Getenv: env}
	return r.Run(ctx, args)
}

// cli is the state of one Run.
type cli struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time
	sleep          func(context.Context, time.Duration) error

	socket  string
	output  string // table, wide or json
	timeout time.Duration

	ran  bool  // a command's own code started (errors before are usage errors)
	conn *conn // nil until the first request
}

// Run is the package-level Run with r's clock and sleep.
func (r *Runner) Run(ctx context.Context, args []string) int {
	c := &cli{stdout: r.Stdout, stderr: r.Stderr, getenv: r.Getenv, now: r.Now, sleep: r.Sleep, output: "table", timeout: DefaultTimeout}
	if c.stdout == nil {
		c.stdout = io.Discard
	}
	if c.stderr == nil {
		c.stderr = io.Discard
	}
	if c.getenv == nil {
		c.getenv = os.Getenv
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.sleep == nil {
		c.sleep = sleepCtx
	}
	defer func() {
		if c.conn != nil {
			c.conn.close()
		}
	}()
	root := c.newRoot()
	root.SetArgs(append([]string{}, args...)) // never nil: cobra would read os.Args
	root.SetOut(c.stdout)
	root.SetErr(c.stderr)
	cmd, err := root.ExecuteContextC(ctx)
	return c.exit(cmd, err)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// exit prints err, which cmd returned, and maps it to an exit code.
func (c *cli) exit(cmd *cobra.Command, err error) int {
	if err == nil {
		return ExitOK
	}
	where := prog + ": " + exitContext(cmd)
	var ue *usageError
	var un *unreachableError
	if !errors.As(err, &ue) && !c.ran {
		// cobra's own errors come before any command runs: flags it
		// could not parse before a command word, for one
		ue = &usageError{msg: err.Error()}
	}
	switch {
	case ue != nil:
		if ue.msg == "" {
			return ExitUsage // the usage is printed already
		}
		fmt.Fprintf(c.stderr, "%s%s\n", where, ue.msg)
		switch {
		case len(ue.usage) > 0:
			for _, u := range ue.usage {
				fmt.Fprintf(c.stderr, "usage: %s\n", u)
			}
		case cmd != nil && cmd.HasParent():
			fmt.Fprintf(c.stderr, "usage: %s\n", cmd.UseLine())
			fmt.Fprintf(c.stderr, "Run '%s --help' for its flags.\n", cmd.CommandPath())
		default:
			fmt.Fprintf(c.stderr, "usage: %s [flags] COMMAND [flags] [ARGS]\n", prog)
			fmt.Fprintf(c.stderr, "Run '%s --help' for the commands.\n", prog)
		}
		return ExitUsage
	case errors.As(err, &un):
		fmt.Fprintf(c.stderr, "%s%v\n", where, un)
		fmt.Fprintf(c.stderr, "%s\n", un.hint())
		return ExitUnreachable
	case errors.Is(err, context.Canceled):
		fmt.Fprintf(c.stderr, "%sinterrupted\n", where)
		return ExitFailed
	default:
		fmt.Fprintf(c.stderr, "%s%v\n", where, err)
		return ExitFailed
	}
}

// usageError is a bad command line: exit code 2 with a usage line.
type usageError struct {
	msg   string
	usage []string // usage lines to print instead of the command's (a group's subcommands)
}

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}
