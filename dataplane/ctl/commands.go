package ctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

type runFunc func(ctx context.Context, c *cli, args []string) error

type command struct {
	name    string // "port add"
	args    string // synopsis after the name
	summary string
	details string // paragraph for help COMMAND

	minArgs, maxArgs int // positional arguments; maxArgs -1 = any number
	// ownsSocketFlag: the command's --socket is its own (port add's
	// vhost-user socket); the API socket is then --api-socket.
	ownsSocketFlag bool
	// setup adds the command's flags to fs and returns the command bound
	// to them.
	setup func(fs *flag.FlagSet) runFunc
}

var commands = []*command{
	{
		name:    "port add",
		args:    "ID --socket PATH [flags]",
		summary: "create a vhost-user port and show it",
		details: "The same spec again shows the existing port (a repeated add is a no-op); a\n" +
			"different spec for an existing ID fails. Here --socket is the port's vhost-user\n" +
			"socket: name the agent's API socket with --api-socket, or before the command\n" +
			"(vhostmqctl --socket API-PATH port add ...).",
		minArgs: 1, maxArgs: 1, ownsSocketFlag: true,
		setup: portAddSetup,
	},
	{
		name:    "port del",
		args:    "ID",
		summary: "delete a port (succeeds when it does not exist)",
		minArgs: 1, maxArgs: 1,
		setup: portDelSetup,
	},
	{
		name:    "port list",
		args:    "",
		summary: "list the ports: role, socket, queues, connection, pod",
		details: "QUEUES is enabled/configured queue pairs; POD comes from the labels\n" +
			"k8s.pod.namespace and k8s.pod.name. -o wide adds MAC, polling mode and CPUs.",
		maxArgs: 0,
		setup:   portListSetup,
	},
	{
		name:    "port show",
		args:    "ID",
		summary: "show a port: spec, status, labels, queue pair to slot and CPU",
		minArgs: 1, maxArgs: 1,
		setup: portShowSetup,
	},
	{
		name:    "queues",
		args:    "[ID] [--interval D]",
		summary: "per CPU slot: the port queue pairs it serves and their load",
		details: "Like ovs-appctl dpif-netdev/pmd-rxq-show. WORKER is the CPU whose worker\n" +
			"serves the pair (moved: the rebalancer took it off its slot's CPU). BUSY is\n" +
			"the share of the interval that worker spent on the pair, NS/BURST what one\n" +
			"burst of its frames cost; RX is toward the guest, TX from it. Then each\n" +
			"worker's load (UPLINK: the part its uplink queue took, which cannot move),\n" +
			"the rebalancer's settings and its last moves. --interval 0 shows the\n" +
			"cumulative busy time and packet counters instead. -o wide adds OFFLOAD,\n" +
			"whole/seg/csum for frames toward the guest (as in stats -o wide).",
		maxArgs: 1,
		setup:   queuesSetup,
	},
	{
		name:    "queues rebalance",
		args:    "[--window D]",
		summary: "measure the queue loads now and move pairs between workers if that evens them out",
		details: "Like ovs-appctl dpif-netdev/pmd-rxq-rebalance. The agent measures every pair's\n" +
			"busy time over --window (default 1s), plans as the automatic rebalancer does\n" +
			"but without waiting for a worker to be overloaded, and moves a pair only\n" +
			"within its NUMA node (unless the agent's rebalance.crossNUMA) and only if the\n" +
			"variance of the worker loads drops by the configured improvement.",
		maxArgs: 0,
		setup:   queuesRebalanceSetup,
	},
	{
		name:    "stats",
		args:    "[ID...] [--interval D]",
		summary: "per port and queue pair: packet and bit rates, drops by reason",
		details: "Rates are measured between two samples --interval apart (timed by the agent's\n" +
			"clock); --interval 0 prints the absolute counters. RX is toward the guest, TX\n" +
			"from it. -o wide adds which directions are enabled, kicks, calls, BUSY, the\n" +
			"share of a CPU the pair took (summed over the pairs on a total line), and\n" +
			"OFFLOAD, whole/seg/csum for frames toward the guest: GSO frames delivered\n" +
			"whole, GSO frames segmented and checksums completed in software for it.",
		maxArgs: -1,
		setup:   statsSetup,
	},
	{
		name:    "capacity",
		args:    "",
		summary: "CPUs, NUMA nodes, worker slots and the port queue pairs using them",
		maxArgs: 0,
		setup:   capacitySetup,
	},
	{
		name:    "handoff",
		args:    "",
		summary: "the last handoff of the live ports between two dataplane processes (an upgrade)",
		details: "An adopting process says how many live sessions it took over and how many stored\n" +
			"ports it created afresh (their frontends reconnected); a handing one, that it\n" +
			"serves nothing any more. PAUSE is how long the ports were stopped.",
		maxArgs: 0,
		setup:   handoffSetup,
	},
	{
		name:    "top",
		args:    "[--interval D] [--once]",
		summary: "a full-screen view of ports, queue pairs or workers, refreshed every --interval",
		details: "Rates are over the last refresh. Keys: p ports, u queue pairs, w workers, tab the\n" +
			"next view, s sort by the next column (marked *), r reverse, q quit. PORTS lists\n" +
			"drops per second by reason, stalls (the watchdog's, since the port was made) and\n" +
			"frames held per second at their source for a full RX ring. It ends when the agent\n" +
			"goes away, exit status 3. --once prints one screen to stdout and exits.",
		maxArgs: 0,
		setup:   topSetup,
	},
	{
		name:    "health",
		args:    "[--watch]",
		summary: "agent and slot health; --watch streams changes until interrupted",
		details: "With --watch, one line per update (one JSON object per line with -o json).",
		maxArgs: 0,
		setup:   healthSetup,
	},
}

// synopsis is the command's name and arguments: "port add ID --socket PATH [flags]".
func (cmd *command) synopsis() string { return strings.TrimSpace(cmd.name + " " + cmd.args) }

func findCommand(name string) *command {
	for _, cmd := range commands {
		if cmd.name == name {
			return cmd
		}
	}
	return nil
}

// group lists the subcommands of a command group such as "port".
func group(name string) []*command {
	var cmds []*command
	for _, cmd := range commands {
		if g, _, ok := strings.Cut(cmd.name, " "); ok && g == name {
			cmds = append(cmds, cmd)
		}
	}
	return cmds
}

func subcommandNames(cmds []*command) []string {
	var names []string
	for _, cmd := range cmds {
		_, sub, _ := strings.Cut(cmd.name, " ")
		names = append(names, sub)
	}
	return names
}

// lookup finds the command args start with and returns the arguments after
// its name.
func lookup(args []string) (*command, []string, error) {
	if len(args) >= 2 {
		if cmd := findCommand(args[0] + " " + args[1]); cmd != nil {
			return cmd, args[2:], nil
		}
	}
	if cmd := findCommand(args[0]); cmd != nil {
		return cmd, args[1:], nil
	}
	if subs := group(args[0]); len(subs) > 0 {
		names := orList(subcommandNames(subs))
		if len(args) == 1 || strings.HasPrefix(args[1], "-") {
			return nil, nil, &usageError{fmt.Sprintf("%s: missing subcommand: %s", args[0], names), subs}
		}
		return nil, nil, &usageError{fmt.Sprintf("unknown command %q: %s takes %s", args[0]+" "+args[1], args[0], names), subs}
	}
	return nil, nil, usageErrorf("unknown command %q", args[0])
}

// help prints vhostmqctl help [COMMAND].
func (c *cli) help(args []string) error {
	if len(args) == 0 {
		c.mainUsage(c.stdout)
		return errHelp
	}
	name := strings.Join(args, " ")
	if cmd := findCommand(name); cmd != nil {
		c.commandUsage(c.stdout, cmd)
		return errHelp
	}
	if subs := group(name); len(subs) > 0 {
		for i, cmd := range subs {
			if i > 0 {
				fmt.Fprintln(c.stdout)
			}
			c.commandUsage(c.stdout, cmd)
		}
		return errHelp
	}
	return usageErrorf("help: unknown command %q", name)
}

func (c *cli) mainUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s [global flags] COMMAND [flags] [ARGS]\n\n", prog)
	fmt.Fprintf(w, "%s operates the vhostmq node agent through its gRPC API socket.\n\n", prog)
	fmt.Fprintln(w, "Commands:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", cmd.synopsis(), cmd.summary)
	}
	fmt.Fprintf(tw, "  help [COMMAND]\tthis help, or a command's flags\n")
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Global flags (before the command, or after it):")
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	(&cli{socket: DefaultSocket, output: "table", timeout: DefaultTimeout}).globalFlags(fs, true)
	printFlags(w, fs, func(name string) bool { return name != "api-socket" && name != "output" })
	fmt.Fprintln(w, "  --socket after 'port add' is the port's vhost-user socket: there, use --api-socket\n"+
		"  or put --socket before the command. -o has the long form --output.")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Run '%s help COMMAND' or '%s COMMAND -h' for a command's flags.\n", prog, prog)
	fmt.Fprintln(w, "Exit status: 0 ok, 1 the request failed, 2 usage error, 3 cannot reach the agent.")
}

func (c *cli) commandUsage(w io.Writer, cmd *command) {
	fmt.Fprintf(w, "Usage: %s %s\n\n", prog, cmd.synopsis())
	summary := cmd.summary
	fmt.Fprintf(w, "%s%s.\n", strings.ToUpper(summary[:1]), summary[1:])
	if cmd.details != "" {
		fmt.Fprintf(w, "\n%s\n", cmd.details)
	}
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	cmd.setup(fs) // the command's own flags only: no globalFlags here
	if hasFlags(fs) {
		fmt.Fprintln(w, "\nFlags:")
		printFlags(w, fs, func(string) bool { return true })
	}
	api := "--socket PATH"
	if cmd.ownsSocketFlag {
		api = "--api-socket PATH"
	}
	fmt.Fprintf(w, "\nGlobal flags: %s, -o table|wide|json, --timeout DURATION (see '%s help').\n", api, prog)
}

// printFlags prints the flags of fs that keep selects, one a line.
func printFlags(w io.Writer, fs *flag.FlagSet, keep func(string) bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		if !keep(f.Name) {
			return
		}
		arg, usage := flag.UnquoteUsage(f)
		name := flagName(f.Name)
		if arg != "" {
			name += " " + arg
		}
		switch f.DefValue {
		case "", "0", "false", "0s":
		default:
			if !strings.Contains(usage, "(default") {
				usage += " (default " + f.DefValue + ")"
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, usage)
	})
	tw.Flush()
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}
