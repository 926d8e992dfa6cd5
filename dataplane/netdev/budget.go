package netdev

import (
	"context"
	"time"

	"golang.org/x/time/rate"

	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
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
	ControlRate  = 200  // messages per second, sustained
	ControlBurst = 4096 // messages handled at once before the rate applies
)

// MemoryMessageCost is what a message that maps or unmaps memory spends
// of the budget (SET_MEM_TABLE, ADD_MEM_REG, REM_MEM_REG, SET_LOG_BASE):
// an unmap interrupts every CPU the dataplane's threads ran on, workers
// included, so these are held to an eighth of the rate.
const MemoryMessageCost = 8

func cost(r vhostuser.Request) int {
	switch r {
	case vhostuser.ReqSetMemTable, vhostuser.ReqAddMemReg, vhostuser.ReqRemMemReg, vhostuser.ReqSetLogBase:
		return MemoryMessageCost
	}
	return 1
}

// budget is the port's, not the session's: reconnecting does not refill it.
type budget struct {
	lim     *rate.Limiter
	lastLog time.Time // the session goroutine's alone
}

func newBudget(perSecond int) budget {
	switch {
	case perSecond < 0:
		return budget{lim: rate.NewLimiter(rate.Inf, ControlBurst)}
	case perSecond == 0:
		perSecond = ControlRate
	}
	return budget{lim: rate.NewLimiter(rate.Limit(perSecond), ControlBurst)}
}

// spend takes a message's tokens, waiting for them when the budget is
// spent; false when ctx ended first.
func (p *Port) spend(ctx context.Context, r vhostuser.Request) bool {
	d := p.budget.lim.ReserveN(time.Now(), cost(r)).Delay()
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
