package ctl

import (
	"context"

	"github.com/spf13/pflag"
)

type runFunc func(ctx context.Context, c *cli, args []string) error

// command is one vhostmqctl command; newRoot makes the cobra tree from
// the list, a group (port) for each first word that is no command itself.
type command struct {
	name    string // "port add"
	args    string // positional arguments (and required flags) after the name
	summary string
	details string // paragraph for --help

	minArgs, maxArgs int // positional arguments; maxArgs -1 = any number
	// ownsSocketFlag: the command's --socket is its own (port add's
	// vhost-user socket); the API socket is then --api-socket.
	ownsSocketFlag bool
	// setup adds the command's flags to fs and returns the command bound
	// to them.
	setup func(fs *pflag.FlagSet) runFunc
	// ports: the positional arguments are port IDs, completed from the
	// agent's ports (at most maxArgs of them).
	ports bool
}

// groups are the command words that only gather subcommands.
var groups = map[string]string{
	"port": "create, delete, list and show vhost-user ports, and set their rate limits",
}

var commands = []*command{
	{
		name:    "port add",
		args:    "ID --socket PATH",
		summary: "create a vhost-user port and show it",
		details: "The same spec again shows the existing port (a repeated add is a no-op); a\n" +
			"different spec for an existing ID fails. Here --socket is the port's vhost-user\n" +
			"socket: name the agent's API socket with --api-socket, or with --socket before\n" +
			"the command (vhostmqctl --socket API-PATH port add ...).",
		minArgs: 1, maxArgs: 1, ownsSocketFlag: true,
		setup: portAddSetup,
	},
	{
		name:    "port del",
		args:    "ID",
		summary: "delete a port (succeeds when it does not exist)",
		minArgs: 1, maxArgs: 1, ports: true,
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
		minArgs: 1, maxArgs: 1, ports: true,
		setup: portShowSetup,
	},
	{
		name:    "port bandwidth",
		args:    "ID",
		summary: "set or clear a live port's rate limits and show the port",
		details: "--ingress and --egress are bits per second, Kubernetes quantities like 100M or 1G\n" +
			"(0 removes that direction's limit); the bursts are bits (default: 10 ms of the\n" +
			"rate). A direction not given keeps its limits; --clear removes both. Ingress (to\n" +
			"the guest) is policed: frames above it are dropped, counted as rate_limited.\n" +
			"Egress (from the guest) is shaped: its frames wait in its ring, nothing is\n" +
			"dropped. The agent stores the limits with the port (a restart keeps them); a\n" +
			"port from the agent's config file takes its limits there.",
		minArgs: 1, maxArgs: 1, ports: true,
		setup: portBandwidthSetup,
	},
	{
		name:    "queues",
		args:    "[ID]",
		summary: "per CPU slot: the port queue pairs it serves and their load",
		details: "Like ovs-appctl dpif-netdev/pmd-rxq-show. WORKER is the CPU whose worker\n" +
			"serves the pair (moved: the rebalancer took it off its slot's CPU). BUSY is\n" +
			"the share of the interval that worker spent on the pair, NS/BURST what one\n" +
			"burst of its frames cost; RX is toward the guest, TX from it. Then each\n" +
			"worker's load (UPLINK: the part its uplink queue took, which cannot move),\n" +
			"the rebalancer's settings and its last moves. --interval 0 shows the\n" +
			"cumulative busy time and packet counters instead. -o wide adds OFFLOAD,\n" +
			"whole/seg/csum for frames toward the guest (as in stats -o wide).",
		maxArgs: 1, ports: true,
		setup: queuesSetup,
	},
	{
		name:    "queues rebalance",
		args:    "",
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
		args:    "[ID...]",
		summary: "per port and queue pair: packet and bit rates, drops by reason",
		details: "Rates are measured between two samples --interval apart (timed by the agent's\n" +
			"clock); --interval 0 prints the absolute counters. RX is toward the guest, TX\n" +
			"from it. -o wide adds which directions are enabled, kicks, calls, BUSY, the\n" +
			"share of a CPU the pair took (summed over the pairs on a total line), and\n" +
			"OFFLOAD, whole/seg/csum for frames toward the guest: GSO frames delivered\n" +
			"whole, GSO frames segmented and checksums completed in software for it.",
		maxArgs: -1, ports: true,
		setup: statsSetup,
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
		name:    "overlay",
		args:    "",
		summary: "the vxlan uplink: its VTEPs (the other nodes) with their counters, and with --macs the addresses learned behind each",
		details: "Like ovs-appctl tnl/ports/show and fdb/show for a tunnel. TX_ERRORS are datagrams the\n" +
			"kernel refused (no route to the VTEP, or larger than the path's MTU: never\n" +
			"fragmented); TX_DROPPED, datagrams the socket's full send buffer dropped.",
		maxArgs: 0,
		setup:   overlaySetup,
	},
	{
		name:    "top",
		args:    "",
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
		args:    "",
		summary: "agent and slot health; --watch streams changes until interrupted",
		details: "With --watch, one line per update (one JSON object per line with -o json).",
		maxArgs: 0,
		setup:   healthSetup,
	},
}
