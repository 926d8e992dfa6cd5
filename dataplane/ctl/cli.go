package ctl

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

var outputFormats = []string{"table", "wide", "json"}

// newRoot makes the cobra command tree of one Run, bound to c.
//
// TraverseChildren makes the flags before a command word belong to the
// command they follow, so that "vhostmqctl --socket API port add ID
// --socket PATH" names the API socket first and the port's socket last,
// as port add's help says.
func (c *cli) newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   prog,
		Short: "operate the vhostmq node agent",
		Long: prog + " operates the vhostmq node agent through its gRPC API socket.\n\n" +
			"The API socket is --socket (or --api-socket), else $" + EnvSocket + ", else " + DefaultSocket + ".\n" +
			"After 'port add', --socket is the port's vhost-user socket: there, use --api-socket or\n" +
			"put --socket before the command.\n\n" +
			"Exit status: 0 ok, 1 the request failed, 2 usage error, 3 cannot reach the agent.",
		Args:             cobra.ArbitraryArgs,
		TraverseChildren: true,
		SilenceErrors:    true,
		SilenceUsage:     true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				cmd.SetOut(c.stderr)
				_ = cmd.Help()
				return &usageError{}
			}
			return unknownCommand(cmd, args[0])
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&c.socket, "socket", DefaultSocket, "`PATH` of the agent's API socket")
	pf.StringVar(&c.socket, "api-socket", DefaultSocket, "`PATH` of the agent's API socket (same as --socket)")
	pf.VarP(&enumValue{p: &c.output, allowed: outputFormats}, "output", "o", "`FORMAT` of the output: table, wide or json")
	pf.Var(&durationValue{p: &c.timeout}, "timeout", "time limit of each request, a `DURATION`; 0 means none")
	_ = root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: err.Error()} })
	root.SetHelpCommand(c.helpCommand(root))

	parents := map[string]*cobra.Command{}
	for _, cmd := range commands {
		parent := root
		word := cmd.name
		if g, sub, ok := strings.Cut(cmd.name, " "); ok {
			parent, word = parents[g], sub
			if parent == nil {
				parent = groupCommand(g)
				parents[g] = parent
				root.AddCommand(parent)
			}
		}
		cc := c.leafCommand(cmd, word)
		parent.AddCommand(cc)
		parents[cmd.name] = cc
	}
	// -h on every command, so that "help CMD" lists it as "CMD -h" does
	// (cobra adds it only to the command it runs)
	var withHelp func(*cobra.Command)
	withHelp = func(cmd *cobra.Command) {
		cmd.InitDefaultHelpFlag()
		for _, sub := range cmd.Commands() {
			withHelp(sub)
		}
	}
	withHelp(root)
	return root
}

// leafCommand is cmd as a cobra command named word (its last word).
func (c *cli) leafCommand(cmd *command, word string) *cobra.Command {
	long := strings.ToUpper(cmd.summary[:1]) + cmd.summary[1:] + "."
	if cmd.details != "" {
		long += "\n\n" + cmd.details
	}
	cc := &cobra.Command{
		Use:   strings.TrimSpace(word + " " + cmd.args),
		Short: cmd.summary,
		Long:  long,
		Args:  positional(cmd),
	}
	run := cmd.setup(cc.Flags())
	cc.RunE = func(cc *cobra.Command, args []string) error {
		c.ran = true
		if err := c.resolveSocket(cc); err != nil {
			return err
		}
		return run(cc.Context(), c, args)
	}
	if cmd.ports {
		cc.ValidArgsFunction = c.completePorts(cmd.maxArgs)
	}
	if cmd.name == "port add" {
		_ = cc.RegisterFlagCompletionFunc("role", cobra.FixedCompletions([]string{"client", "server"}, cobra.ShellCompDirectiveNoFileComp))
		_ = cc.RegisterFlagCompletionFunc("polling", cobra.FixedCompletions([]string{"interrupt", "adaptive", "busy"}, cobra.ShellCompDirectiveNoFileComp))
		_ = cc.RegisterFlagCompletionFunc("uplink", cobra.FixedCompletions([]string{"none", "tap", "af_xdp", "vxlan"}, cobra.ShellCompDirectiveNoFileComp))
	}
	return cc
}

// groupCommand is a word like port that only gathers subcommands: alone
// or with an unknown subcommand it is a usage error.
func groupCommand(word string) *cobra.Command {
	return &cobra.Command{
		Use:   word + " COMMAND",
		Short: groups[word],
		Long:  strings.ToUpper(groups[word][:1]) + groups[word][1:] + ".",
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var subs []string
			var usage []string
			for _, sub := range cmd.Commands() {
				if sub.IsAvailableCommand() {
					subs = append(subs, sub.Name())
					usage = append(usage, sub.UseLine())
				}
			}
			if len(args) == 0 {
				return &usageError{msg: fmt.Sprintf("missing subcommand: %s", orList(subs)), usage: usage}
			}
			msg := fmt.Sprintf("unknown subcommand %q: %s takes %s", args[0], word, orList(subs))
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf(" (did you mean %q?)", s[0])
			}
			return &usageError{msg: msg, usage: usage}
		},
	}
}

func unknownCommand(root *cobra.Command, word string) error {
	msg := fmt.Sprintf("unknown command %q", word)
	if s := root.SuggestionsFor(word); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %q?)", s[0])
	}
	return &usageError{msg: msg}
}

// positional checks the number of positional arguments and names the
// first one missing.
func positional(cmd *command) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		switch {
		case len(args) < cmd.minArgs:
			return usageErrorf("missing %s", strings.Fields(cmd.args)[len(args)])
		case cmd.maxArgs >= 0 && len(args) > cmd.maxArgs:
			return usageErrorf("unexpected argument %q", args[cmd.maxArgs])
		}
		return nil
	}
}

// helpCommand is "help [COMMAND]", which unlike cobra's own fails (exit
// 2) on a command that does not exist.
func (c *cli) helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND]",
		Short: "help about any command",
		Long:  "Help about any command: its arguments, flags and subcommands.",
		ValidArgsFunction: func(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			cmd, rest, err := root.Find(args)
			if err != nil || len(rest) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []cobra.Completion
			for _, sub := range cmd.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					names = append(names, cobra.CompletionWithDesc(sub.Name(), sub.Short))
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			c.ran = true
			target, rest, err := root.Find(args)
			if err != nil || len(rest) > 0 {
				return &usageError{msg: fmt.Sprintf("unknown command %q", strings.Join(args, " ")),
					usage: []string{prog + " help [COMMAND]", prog + " --help (the commands)"}}
			}
			target.SetOut(c.stdout)
			return target.Help()
		},
	}
}

// resolveSocket picks the API socket: the flag if given, else
// $VHOSTMQ_API_SOCKET, else DefaultSocket; made absolute.
func (c *cli) resolveSocket(cmd *cobra.Command) error {
	pf := cmd.Root().PersistentFlags()
	if !pf.Changed("socket") && !pf.Changed("api-socket") {
		if env := c.getenv(EnvSocket); env != "" {
			c.socket = env
		}
	}
	if c.socket == "" {
		return usageErrorf("the agent's API socket path is empty (--socket)")
	}
	if !filepath.IsAbs(c.socket) {
		if abs, err := filepath.Abs(c.socket); err == nil {
			c.socket = abs
		}
	}
	return nil
}

// completionTimeout bounds the agent request behind a shell completion:
// a tab press must not hang on an agent that does not answer.
const completionTimeout = 2 * time.Second

// completePorts completes port IDs from the agent's ports, up to max
// arguments (-1: any number), each at most once.
func (c *cli) completePorts(max int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if max >= 0 && len(args) >= max {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		if err := c.resolveSocket(cmd); err != nil {
			return nil, cobra.ShellCompDirectiveError
		}
		if c.timeout <= 0 || c.timeout > completionTimeout {
			c.timeout = completionTimeout
		}
		resp, err := call(cmd.Context(), c, agentv1.AgentClient.ListPorts, &agentv1.ListPortsRequest{})
		if err != nil {
			cobra.CompDebugln("vhostmqctl: "+err.Error(), false) // $BASH_COMP_DEBUG_FILE
			return nil, cobra.ShellCompDirectiveError | cobra.ShellCompDirectiveNoFileComp
		}
		var ids []cobra.Completion
		for _, p := range resp.GetPorts() {
			id := p.GetSpec().GetId()
			if !strings.HasPrefix(id, toComplete) || slices.Contains(args, id) {
				continue
			}
			if owner := pod(p.GetSpec().GetLabels()); owner != "" {
				id = cobra.CompletionWithDesc(id, owner)
			}
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return ids, cobra.ShellCompDirectiveNoFileComp
	}
}

// exitContext is how the command an error came from is named in front of
// it: "port add: ", or "" for vhostmqctl itself.
func exitContext(cmd *cobra.Command) string {
	if cmd == nil || !cmd.HasParent() {
		return ""
	}
	return strings.TrimPrefix(cmd.CommandPath(), prog+" ") + ": "
}
