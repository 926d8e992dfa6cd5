package ctl

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

type handoffJSON struct {
	Build         string  `json:"build"`
	Happened      bool    `json:"happened"`
	Time          string  `json:"time,omitempty"`
	Role          string  `json:"role,omitempty"`
	PeerBuild     string  `json:"peer_build,omitempty"`
	Ports         uint32  `json:"ports"`
	PauseMs       float64 `json:"pause_ms"`
	Adopted       uint32  `json:"adopted"`
	CreatedAfresh uint32  `json:"created_afresh"`
}

func handoffSetup(*pflag.FlagSet) runFunc {
	return func(ctx context.Context, c *cli, _ []string) error {
		h, err := call(ctx, c, agentv1.AgentClient.GetHandoff, &agentv1.GetHandoffRequest{})
		if err != nil {
			return err
		}
		out := handoffJSON{Build: h.GetBuild(), Happened: h.GetHappened(), Role: h.GetRole(), PeerBuild: h.GetPeerBuild(),
			Ports: h.GetPorts(), PauseMs: float64(h.GetPauseUs()) / 1000, Adopted: h.GetAdopted(), CreatedAfresh: h.GetCreatedAfresh()}
		if h.GetHappened() {
			out.Time = time.Unix(0, h.GetTimeUnixNano()).UTC().Format(time.RFC3339Nano)
		}
		if c.output == "json" {
			return writeJSON(c.stdout, out)
		}
		t := newTable(c.stdout)
		t.row("BUILD", out.Build)
		if !out.Happened {
			t.row("LAST HANDOFF", "none (this process started without a predecessor and handed nothing over)")
			return t.flush()
		}
		t.row("LAST HANDOFF", out.Time)
		switch out.Role {
		case "adopted":
			t.row("ROLE", fmt.Sprintf("adopted the ports of build %s", out.PeerBuild))
			t.row("PORTS", fmt.Sprintf("%d handed, %d live sessions adopted, %d created afresh (reconnected)", out.Ports, out.Adopted, out.CreatedAfresh))
			t.row("PAUSE", fmt.Sprintf("%.1f ms (hello to serving)", out.PauseMs))
		default:
			t.row("ROLE", fmt.Sprintf("handed its ports to build %s; it serves nothing now", out.PeerBuild))
			t.row("PORTS", fmt.Sprint(out.Ports))
			t.row("PAUSE", fmt.Sprintf("%.1f ms (first parked session to the successor's answer)", out.PauseMs))
		}
		return t.flush()
	}
}
