package dataplane

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"

	"github.com/vhostmq/vhostmq/dataplane/virtq"
)

// Rate limits. A port may have a rate for each direction, in bits per
// second of Ethernet frames (header included, virtio header, preamble and
// FCS not), with a burst in bits, the way the CNI bandwidth plugin and
// Kubernetes' kubernetes.io/{ingress,egress}-bandwidth annotations give
// them:
//
//   - Egress (from the guest, its TX rings) is shaped: when the port's
//     bucket is empty the worker leaves the guest's chains in its ring and
//     comes back when the bucket has refilled (the guest's queue fills and
//     its stack backs off, nothing is dropped);
//   - Ingress (to the guest, its RX rings) is policed: a frame that finds
//     the bucket empty is dropped and counted (drops.rateLimited), as tc's
//     policer on a veth would.
//
// A port's pairs share one bucket per direction, whichever workers serve
// them. A port without a limit pays one nil check per burst (TX) and per
// frame delivered (RX).

// Rate is one direction's limit: 0 bits per second is none.
type Rate struct {
	BitsPerSecond uint64 `json:"bitsPerSecond,omitempty"`
	// BurstBits is how much may pass at once above the rate (the bucket's
	// depth); 0 takes DefaultBurst of the rate. It is raised to at least
	// two frames of the port's MTU and MinBurst of the rate, and capped at
	// MaxBurstBits.
	BurstBits uint64 `json:"burstBits,omitempty"`
}

// Bandwidth is a port's rate limits.
type Bandwidth struct {
	Ingress Rate `json:"ingress"` // to the guest: policed
	Egress  Rate `json:"egress"`  // from the guest: shaped
}

// Limits of a rate.
const (
	MinBitsPerSecond = 8_000             // 1 kB/s: slower is a mistake, not a limit
	MaxBitsPerSecond = 1_000_000_000_000 // 1 Tbit/s
	// MaxBurstBits caps the bucket: containerd passes math.MaxUint32 bits
	// (512 MiB) with every bandwidth annotation, which would let a VM send
	// half a gigabyte at full speed before the limit begins.
	MaxBurstBits = 1 << 30
)

// DefaultBurst is the burst of a rate given none: what the rate passes in
// this many seconds (at least two MTU frames).
const DefaultBurst = 0.010

// MinBurst is the smallest burst, in seconds of the rate: a worker comes
// back to a shaped ring with a sleep of whole milliseconds (epoll_wait),
// and a bucket smaller than that would lose what the rate gave meanwhile.
const MinBurst = 0.002

// ErrBadRate is a rate limit outside what the dataplane can enforce.
var ErrBadRate = errors.New("invalid rate limit")

// Validate checks both directions, naming the field that is wrong.
func (b Bandwidth) Validate() error {
	for _, r := range []struct {
		name string
		r    Rate
	}{{"ingress", b.Ingress}, {"egress", b.Egress}} {
		if r.r.BitsPerSecond == 0 {
			if r.r.BurstBits != 0 {
				return fmt.Errorf("bandwidth.%s: a burst (%d bits) without a rate: %w", r.name, r.r.BurstBits, ErrBadRate)
			}
			continue
		}
		if r.r.BitsPerSecond < MinBitsPerSecond || r.r.BitsPerSecond > MaxBitsPerSecond {
			return fmt.Errorf("bandwidth.%s: %d bits/s is outside %d..%d: %w", r.name, r.r.BitsPerSecond, uint64(MinBitsPerSecond), uint64(MaxBitsPerSecond), ErrBadRate)
		}
	}
	return nil
}

// IsZero reports whether neither direction is limited.
func (b Bandwidth) IsZero() bool { return b.Ingress.BitsPerSecond == 0 && b.Egress.BitsPerSecond == 0 }

// bucket is one direction's token bucket. Tokens are counted in
// nano-bits (a bit is 1e9 of them), so that a refill of elapsed ns × rate
// bits/s is an exact integer and the rate does not drift over time.
type bucket struct {
	mu     sync.Mutex
	rate   uint64 // bits per second
	depth  uint64 // nano-bits: the burst
	tokens uint64 // nano-bits
	last   int64  // ns: when tokens were last refilled
	limit  Rate   // as configured (BurstBits 0: the default)
}

const nanoBits = 1_000_000_000

// newBucket makes a full bucket for r (nil for no limit); mtu frames
// bound the burst from below.
func newBucket(r Rate, mtu int, now int64) *bucket {
	if r.BitsPerSecond == 0 {
		return nil
	}
	burst := r.BurstBits
	if burst == 0 {
		burst = uint64(float64(r.BitsPerSecond) * DefaultBurst)
	}
	floor := max(2*uint64(mtu+ethHeader+vlanTag)*8, uint64(float64(r.BitsPerSecond)*MinBurst))
	burst = min(max(burst, floor), MaxBurstBits)
	b := &bucket{rate: r.BitsPerSecond, depth: burst * nanoBits, last: now, limit: r}
	b.tokens = b.depth
	return b
}

// refill adds what the rate gave since last; under mu.
func (b *bucket) refill(now int64) {
	if now <= b.last {
		return
	}
	el := uint64(now - b.last)
	b.last = now
	room := b.depth - b.tokens
	if room == 0 {
		return
	}
	hi, lo := bits.Mul64(el, b.rate)
	if hi != 0 || lo >= room {
		b.tokens = b.depth
		return
	}
	b.tokens += lo
}

// take reports whether a frame of n bytes conforms, and takes its tokens
// if so (policing: ingress). A frame larger than the whole bucket (a GSO
// frame delivered whole to a port with a small burst) conforms when the
// bucket is full, and leaves it in debt: it is paid back before the next
// frame passes.
func (b *bucket) take(n int, now int64) bool {
	cost := uint64(n) * 8 * nanoBits
	b.mu.Lock()
	b.refill(now)
	ok := b.last <= now && (b.tokens >= cost || b.tokens == b.depth)
	if ok {
		b.debit(cost, now)
	}
	b.mu.Unlock()
	return ok
}

// debit takes cost from the tokens, going into debt (refill resumes
// later) for what they lack; under mu.
func (b *bucket) debit(cost uint64, now int64) {
	if cost <= b.tokens {
		b.tokens -= cost
		return
	}
	debt := cost - b.tokens
	b.tokens = 0
	b.last = max(b.last, now) + int64(debt/b.rate)
}

// budget returns how many bytes may be sent now (shaping: egress): the
// bucket's tokens, which the caller spends with spend. A frame may take
// the bucket below zero by its own size at most: the caller sends while
// the budget is positive, so an MTU frame is never stuck behind a bucket
// smaller than itself.
func (b *bucket) budget(now int64) int64 {
	b.mu.Lock()
	b.refill(now)
	t := b.tokens / (8 * nanoBits)
	b.mu.Unlock()
	return int64(min(t, math.MaxInt32))
}

// spend takes n bytes' tokens (after a budget), going into debt if the
// last frame was larger than what was left: the refill pays it back
// before the next budget is positive.
func (b *bucket) spend(n uint64, now int64) {
	b.mu.Lock()
	b.refill(now)
	b.debit(n*8*nanoBits, now)
	b.mu.Unlock()
}

// wait returns how long (ns) until the bucket holds bytes' worth, 0 if it
// already does.
func (b *bucket) wait(n int, now int64) int64 {
	cost := uint64(n) * 8 * nanoBits
	b.mu.Lock()
	b.refill(now)
	var d int64
	if b.last > now {
		d = b.last - now
	}
	if b.tokens < cost {
		d += int64((cost - b.tokens + b.rate - 1) / b.rate)
	}
	b.mu.Unlock()
	return d
}

// limits is a port's buckets; replaced whole by SetBandwidth.
type limits struct {
	bw      Bandwidth
	ingress *bucket // nil: not limited
	egress  *bucket
}

func newLimits(bw Bandwidth, mtu int) *limits {
	if bw.IsZero() {
		return nil
	}
	now := nanotime()
	return &limits{bw: bw, ingress: newBucket(bw.Ingress, mtu, now), egress: newBucket(bw.Egress, mtu, now)}
}

// SetBandwidth replaces a port's rate limits (the zero Bandwidth removes
// them); the buckets start full.
func (d *Dataplane) SetBandwidth(name string, bw Bandwidth) error {
	if err := bw.Validate(); err != nil {
		return fmt.Errorf("port %q: %w", name, err)
	}
	d.mu.Lock()
	p, ok := d.byName[name]
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("port %q: %w", name, ErrNoPort)
	}
	p.setLimits(newLimits(bw, p.dev.MTU()))
	for _, w := range p.workersNow() {
		w.wake() // a shaped ring waiting for tokens is served at once
	}
	d.log.Info("port bandwidth set", "port", name, "ingressBitsPerSecond", bw.Ingress.BitsPerSecond, "ingressBurstBits", bw.Ingress.BurstBits,
		"egressBitsPerSecond", bw.Egress.BitsPerSecond, "egressBurstBits", bw.Egress.BurstBits)
	return nil
}

// Bandwidth returns a port's rate limits.
func (p *port) bandwidth() Bandwidth {
	if l := p.limits.Load(); l != nil {
		return l.bw
	}
	return Bandwidth{}
}

// workersNow returns the workers serving p's pairs now.
func (p *port) workersNow() []*worker {
	out := make([]*worker, 0, len(p.workers))
	for i := range p.workers {
		if w := p.workers[i].Load(); w != nil {
			out = append(out, w)
		}
	}
	return out
}

// setLimits installs l (nil: none), with the ingress bucket where the
// delivery paths look for it.
func (p *port) setLimits(l *limits) {
	p.limits.Store(l)
	var in *bucket
	if l != nil {
		in = l.ingress
	}
	p.ingress.Store(in)
}

// admit polices a frame of n bytes for dst's ingress limit: false drops
// it, counted at dst. One load and a nil check for a port without one.
func (w *worker) admit(dst *port, n int) bool {
	in := dst.ingress.Load()
	if in == nil || in.take(n, w.burstNow()) {
		return true
	}
	dst.dev.Vrings()[0].Counters.DropRateLimited.Add(1)
	return false
}

// egressBudget returns how many bytes the burst of a, from src, may move
// (-1: no limit), and the bucket to spend them from; 0 means the bucket is empty: a.shapedUntil says when to
// come back, and the burst is counted as shaped.
func (w *worker) egressBudget(a *assignment, src *port, now int64) (int64, *bucket) {
	l := src.limits.Load()
	if l == nil || l.egress == nil {
		return -1, nil
	}
	if n := l.egress.budget(now); n > 0 {
		return n, l.egress
	}
	w.shape(a, l.egress, now)
	return 0, nil
}

// shape stops a's ring until its port's egress bucket holds a small
// frame again; the ring stays active meanwhile (its chains wait in it).
func (w *worker) shape(a *assignment, eg *bucket, now int64) {
	a.shapedUntil = now + max(eg.wait(minShapedFrame, now), 1)
	a.shaped.Store(true)
	a.lastWork = now
	a.tx.Counters.Shaped.Add(1)
}

// minShapedFrame is what the egress bucket must hold before a shaped
// ring is served again: a small frame, so the worker does not come back
// for a few bytes at a time.
const minShapedFrame = 64

// burstNow is the time for policing: the burst's start (a burst is a few
// microseconds: the bucket's refill is exact either way), else the clock.
func (w *worker) burstNow() int64 {
	if t := w.s.start; t != 0 {
		return t
	}
	return nanotime()
}

// takeRun polices a run of frames to one port under one lock, as take
// each: it returns how many conform from the first on.
func (b *bucket) takeRun(frames []virtq.TXFrame, now int64) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	for i := range frames {
		cost := uint64(frames[i].Len) * 8 * nanoBits
		if b.last > now || (b.tokens < cost && b.tokens != b.depth) {
			return i
		}
		b.debit(cost, now)
	}
	return len(frames)
}

// refund gives back the tokens of frames takeRun admitted and the run did
// not deliver (the per-frame path takes them again).
func (b *bucket) refund(frames []virtq.TXFrame) {
	var bits uint64
	for i := range frames {
		bits += uint64(frames[i].Len) * 8
	}
	b.mu.Lock()
	b.tokens = min(b.depth, b.tokens+bits*nanoBits)
	b.mu.Unlock()
}
