package agentv1

// The dataplane's bounds on a port's rate limits (dataplane.MinBitsPerSecond
// and the rest), here so that the API's clients (the CNI plugin, the
// webhook, vhostmqctl) check them without linking the dataplane; the
// agent's tests check that they are the dataplane's.
const (
	MinBitsPerSecond = 8_000             // 1 kB/s
	MaxBitsPerSecond = 1_000_000_000_000 // 1 Tbit/s
	// MaxBurstBits caps a burst: a larger one is accepted and capped.
	MaxBurstBits = 1 << 30
	// DefaultBurstMillis is the burst of a rate given none, in
	// milliseconds of the rate (at least two frames of the port's MTU).
	DefaultBurstMillis = 10
)

// IsZero reports whether b limits neither direction; unset counts as
// no limit.
func (x *Bandwidth) IsZero() bool {
	return x.GetIngress().GetBitsPerSecond() == 0 && x.GetEgress().GetBitsPerSecond() == 0
}
