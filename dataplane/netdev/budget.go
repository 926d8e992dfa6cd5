package netdev

import (
	"context"
	"time"

	"golang.org/x/time/rate"
)

// A port's control budget: how fast its frontends' vhost-user messages
// are handled. A message can be costly for the whole process (a memory
// table maps and unmaps, and an unmap interrupts every CPU the
// dataplane's threads ran on; a ring change takes the port's ring locks),
// so a frontend that floods them is slowed to this rate: its messages
// wait in its socket, and its own send blocks. QEMU sends a few hundred
// messages when a VM starts (more with many queue pairs and memory
// slots), well within the burst, and a handful afterwards.
const (
	ControlRate  = 1000 // messages per second, sustained
	ControlBurst = 4096 // messages handled at once before the rate applies
)

// budget is the port's, not the session's: reconnecting does not refill it.
type budget struct {
	lim     *rate.Limiter
	lastLog time.Time // the session goroutine's alone
}

func newBudget() budget { return budget{lim: rate.NewLimiter(ControlRate, ControlBurst)} }

// spend takes one message's token, waiting for it when the budget is
// spent; false when ctx ended first.
func (p *Port) spend(ctx context.Context) bool {
	d := p.budget.lim.Reserve().Delay()
	if d <= 0 {
		return true
	}
	p.throttledCount.Add(1)
	if now := time.Now(); now.Sub(p.budget.lastLog) >= 10*time.Second {
		p.budget.lastLog = now
		p.log.Warn("frontend sends control messages faster than the port's budget: slowed down",
			"socket", p.cfg.Socket, "rate", ControlRate, "burst", ControlBurst, "throttledSoFar", p.throttledCount.Load())
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// ControlThrottled counts control messages that waited for the port's
// budget.
func (p *Port) ControlThrottled() uint64 { return p.throttledCount.Load() }
