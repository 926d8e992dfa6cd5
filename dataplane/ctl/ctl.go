// Package ctl implements vhostmqctl, the operator CLI of the vhostmq node
// agent: it speaks the agent's gRPC API (dataplane/api/v1) over the agent's
// unix socket and prints aligned tables for people or JSON for scripts.
//
// cmd/vhostmqctl only calls Run; everything else, flags included, is here so
// that tests can drive the whole CLI against an in-process agent.
package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
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
	now            func() time.Time
	sleep          func(context.Context, time.Duration) error

	socket  string
	output  string // table, wide or json
	timeout time.Duration

	cmd  *command // nil until the command is known
	conn *conn    // nil until the first request
}

// Run is the package-level Run with r's clock and sleep.
func (r *Runner) Run(ctx context.Context, args []string) int {
	c := &cli{stdout: r.Stdout, stderr: r.Stderr, now: r.Now, sleep: r.Sleep, output: "table", timeout: DefaultTimeout}
	if c.stdout == nil {
		c.stdout = io.Discard
	}
	if c.stderr == nil {
		c.stderr = io.Discard
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.sleep == nil {
		c.sleep = sleepCtx
	}
	getenv := r.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	c.socket = getenv(EnvSocket)
	if c.socket == "" {
		c.socket = DefaultSocket
	}
	defer func() {
		if c.conn != nil {
			c.conn.close()
		}
	}()
	return c.exit(c.run(ctx, args))
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

// errHelp: help was asked for and printed.
var errHelp = errors.New("help")

func (c *cli) run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.globalFlags(fs, true)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.mainUsage(c.stdout)
			return errHelp
		}
		return usageErrorf("%s", flagError(err))
	}
	args = fs.Args()
	if len(args) == 0 {
		c.mainUsage(c.stderr)
		return &usageError{}
	}
	if args[0] == "help" {
		return c.help(args[1:])
	}
	if len(args) == 2 && len(group(args[0])) > 0 && (args[1] == "-h" || args[1] == "-help" || args[1] == "--help") {
		return c.help(args[:1]) // port -h
	}
	cmd, rest, err := lookup(args)
	if err != nil {
		return err
	}
	c.cmd = cmd

	fs = flag.NewFlagSet(prog+" "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.globalFlags(fs, !cmd.ownsSocketFlag)
	run := cmd.setup(fs)
	pos, err := parseInterspersed(fs, rest)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.commandUsage(c.stdout, cmd)
			return errHelp
		}
		return usageErrorf("%s", flagError(err))
	}
	switch {
	case len(pos) < cmd.minArgs:
		return usageErrorf("missing %s", strings.Fields(cmd.args)[len(pos)])
	case cmd.maxArgs >= 0 && len(pos) > cmd.maxArgs:
		return usageErrorf("unexpected argument %q", pos[cmd.maxArgs])
	}
	if c.socket == "" {
		return usageErrorf("the agent's API socket path is empty (--socket)")
	}
	if !filepath.IsAbs(c.socket) {
		if abs, err := filepath.Abs(c.socket); err == nil {
			c.socket = abs
		}
	}
	return run(ctx, c, pos)
}

// globalFlags adds the flags every command takes to fs. A command whose
// own --socket means something else (port add) gets only --api-socket.
func (c *cli) globalFlags(fs *flag.FlagSet, socket bool) {
	if socket {
		fs.StringVar(&c.socket, "socket", c.socket, "`PATH` of the agent's API socket (default $"+EnvSocket+", else "+DefaultSocket+")")
	}
	fs.StringVar(&c.socket, "api-socket", c.socket, "`PATH` of the agent's API socket (same as --socket)")
	fs.Var(&enumValue{p: &c.output, allowed: []string{"table", "wide", "json"}}, "o", "`FORMAT` of the output: table, wide or json")
	fs.Var(&enumValue{p: &c.output, allowed: []string{"table", "wide", "json"}}, "output", "`FORMAT` of the output (same as -o)")
	fs.Var(&durationValue{p: &c.timeout}, "timeout", "time limit of each request, a `DURATION`; 0 means none")
}

// exit prints err and maps it to an exit code.
func (c *cli) exit(err error) int {
	if err == nil || errors.Is(err, errHelp) {
		return ExitOK
	}
	where := prog + ": "
	if c.cmd != nil {
		where += c.cmd.name + ": "
	}
	var ue *usageError
	var un *unreachableError
	switch {
	case errors.As(err, &ue):
		if ue.msg == "" {
			return ExitUsage // the usage is printed already
		}
		fmt.Fprintf(c.stderr, "%s%s\n", where, ue.msg)
		switch {
		case len(ue.group) > 0:
			for _, cmd := range ue.group {
				fmt.Fprintf(c.stderr, "usage: %s %s\n", prog, cmd.synopsis())
			}
		case c.cmd != nil:
			fmt.Fprintf(c.stderr, "usage: %s %s\n", prog, c.cmd.synopsis())
			fmt.Fprintf(c.stderr, "Run '%s help %s' for its flags.\n", prog, c.cmd.name)
		default:
			fmt.Fprintf(c.stderr, "usage: %s [global flags] COMMAND [flags] [ARGS]\n", prog)
			fmt.Fprintf(c.stderr, "Run '%s help' for the commands.\n", prog)
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
	group []*command // print the usage of these commands (of a group like port)
}

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}
