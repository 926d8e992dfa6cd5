package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

type healthJSON struct {
	Time    string           `json:"time,omitempty"` // --watch only: when the update arrived
	Healthy bool             `json:"healthy"`
	Reason  string           `json:"reason"`
	Slots   []slotHealthJSON `json:"slots"`
}

type slotHealthJSON struct {
	ID      string `json:"id"`
	Healthy bool   `json:"healthy"`
	Reason  string `json:"reason"`
}

func toHealthJSON(h *agentv1.Health) healthJSON {
	j := healthJSON{Healthy: h.GetHealthy(), Reason: h.GetReason(), Slots: []slotHealthJSON{}}
	for _, s := range h.GetSlots() {
		j.Slots = append(j.Slots, slotHealthJSON{ID: s.GetId(), Healthy: s.GetHealthy(), Reason: s.GetReason()})
	}
	return j
}

// errNoFirstUpdate: the agent sent no health within --timeout.
var errNoFirstUpdate = errors.New("no first update")

func healthSetup(fs *pflag.FlagSet) runFunc {
	var watch bool
	fs.BoolVar(&watch, "watch", false, "stream every change until interrupted")
	return func(ctx context.Context, c *cli, _ []string) error {
		agent, err := c.agent()
		if err != nil {
			return err
		}
		// --timeout bounds the wait for the first update only.
		sctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		var timer *time.Timer
		if c.timeout > 0 {
			timer = time.AfterFunc(c.timeout, func() { cancel(errNoFirstUpdate) })
			defer timer.Stop()
		}
		fail := func(err error) error {
			if ctx.Err() != nil {
				if watch {
					return nil // interrupted: the normal end of --watch
				}
				return ctx.Err()
			}
			if errors.Is(context.Cause(sctx), errNoFirstUpdate) {
				return c.timeoutError()
			}
			return c.rpcError(ctx, err)
		}
		stream, err := agent.WatchHealth(sctx, &agentv1.WatchHealthRequest{})
		if err != nil {
			return fail(err)
		}
		for first := true; ; first = false {
			h, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					return errors.New("the agent ended the health stream")
				}
				return fail(err)
			}
			if first && timer != nil {
				timer.Stop()
			}
			if !watch {
				return c.printHealth(h)
			}
			if err := c.printHealthUpdate(h); err != nil {
				return err
			}
		}
	}
}

func (c *cli) printHealth(h *agentv1.Health) error {
	j := toHealthJSON(h)
	if c.output == "json" {
		return writeJSON(c.stdout, j)
	}
	t := newTable(c.stdout)
	t.line("Agent: %s", healthWord(j.Healthy, j.Reason))
	t.line("")
	t.row("SLOT", "HEALTHY", "REASON")
	for _, s := range j.Slots {
		t.row(s.ID, yesNo(s.Healthy), s.Reason)
	}
	return t.flush()
}

// printHealthUpdate prints one --watch update in one write: a line, or
// with -o json one JSON object on a line.
func (c *cli) printHealthUpdate(h *agentv1.Health) error {
	j := toHealthJSON(h)
	j.Time = c.now().Format(time.RFC3339)
	var b bytes.Buffer
	if c.output == "json" {
		line, err := json.Marshal(j)
		if err != nil {
			return err
		}
		b.Write(line)
	} else {
		healthy := 0
		var bad []string
		for _, s := range j.Slots {
			if s.Healthy {
				healthy++
			} else if s.Reason != "" {
				bad = append(bad, s.ID+" ("+s.Reason+")")
			} else {
				bad = append(bad, s.ID)
			}
		}
		fmt.Fprintf(&b, "%s  agent %s; slots %d/%d healthy", j.Time, healthWord(j.Healthy, j.Reason), healthy, len(j.Slots))
		if len(bad) > 0 {
			fmt.Fprintf(&b, "; unhealthy: %s", strings.Join(bad, ", "))
		}
	}
	b.WriteByte('\n')
	_, err := c.stdout.Write(b.Bytes())
	return err
}

func healthWord(healthy bool, reason string) string {
	w := "healthy"
	if !healthy {
		w = "UNHEALTHY"
	}
	if reason != "" {
		w += " (" + reason + ")"
	}
	return w
}
