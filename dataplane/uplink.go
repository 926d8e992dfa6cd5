package dataplane

// The tap uplink: networks that ask for it reach the node's network through
// one multiqueue tap (dataplane/tap), one queue per worker. A network is
// untagged on the tap, or tagged with its VLAN (802.1Q push on the way out,
// pop on the way in); frames from the tap are learned into the network's MAC
// table as living behind the uplink and switched like a guest's. Each
// worker reads its own tap queue (in its epoll set, level-triggered) and
// writes the frames its guests send to the uplink into the same queue.

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/tap"
	"github.com/vhostmq/vhostmq/dataplane/virtq"
	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// tapToken marks a tap queue in a worker's epoll set.
const tapToken = -2

// maxUplinkFrame bounds a frame on the tap: the largest port MTU, a VLAN
// tag and the Ethernet header.
const maxUplinkFrame = 9702 + ethHeader + vlanTag

// uplink is the dataplane's tap uplink.
type uplink struct {
	dev *tap.Device
	// byVLAN maps a VLAN ID (0: untagged) to the network using it on the
	// uplink; copy on write under Dataplane.mu.
	byVLAN atomic.Pointer[map[int]*network]
	UplinkCounters
}

// UplinkCounters count the uplink's traffic; "rx" is from the tap (toward
// the guests), "tx" toward the tap.
type UplinkCounters struct {
	RxPackets, RxBytes, TxPackets, TxBytes atomic.Uint64
	RxNoNetwork                            atomic.Uint64 // a VLAN (or untagged) no network uses
	RxRunt                                 atomic.Uint64 // shorter than an Ethernet header
	RxNoDestination                        atomic.Uint64 // no port on the network to deliver to
	TxDropped                              atomic.Uint64 // the tap queue was full (EAGAIN) or refused the frame
	TxOversize                             atomic.Uint64 // larger than the uplink carries
}

// UplinkStats is a snapshot of the uplink.
type UplinkStats struct {
	Kind            string `json:"kind"`
	Name            string `json:"name"`
	Attach          string `json:"attach,omitempty"`
	Queues          int    `json:"queues"`
	Healthy         bool   `json:"healthy"`
	Reason          string `json:"reason,omitempty"`
	RxPackets       uint64 `json:"rxPackets"`
	RxBytes         uint64 `json:"rxBytes"`
	TxPackets       uint64 `json:"txPackets"`
	TxBytes         uint64 `json:"txBytes"`
	RxNoNetwork     uint64 `json:"rxNoNetwork"`
	RxRunt          uint64 `json:"rxRunt"`
	RxNoDestination uint64 `json:"rxNoDestination"`
	TxDropped       uint64 `json:"txDropped"`
	TxOversize      uint64 `json:"txOversize"`
}

// workerUplink is a worker's tap queue and its frame buffers.
type workerUplink struct {
	u   *uplink
	fd  int
	rx  [tap.HdrLen + maxUplinkFrame]byte
	tx  [tap.HdrLen + vlanTag + maxUplinkFrame]byte
	hdr [tap.HdrLen]byte // all zero: no offload metadata (see package tap)
}

// openUplink creates the tap with one queue per worker and puts each
// queue into its worker's epoll set.
func (d *Dataplane) openUplink(cfg tap.Config) error {
	dev, err := tap.Open(cfg, len(d.workers))
	if err != nil {
		return fmt.Errorf("uplink.tap.%w", err)
	}
	u := &uplink{dev: dev}
	u.byVLAN.Store(&map[int]*network{})
	for i, w := range d.workers {
		fd := dev.Queue(i)
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd), Pad: tapToken}
		if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			dev.Close()
			return fmt.Errorf("uplink: epoll_ctl: %w", err)
		}
	}
	for i, w := range d.workers {
		w.up = &workerUplink{u: u, fd: dev.Queue(i)}
		w.wake()
	}
	d.up = u
	d.log.Info("tap uplink up", "tap", cfg.Name, "attach", cfg.Attach, "queues", dev.Queues(), "mtu", dev.Config().MTU)
	return nil
}

// HasUplink reports whether the dataplane has an uplink of that kind.
func (d *Dataplane) HasUplink(kind string) bool { return kind == "tap" && d.up != nil }

// UplinkHealth says why the uplink cannot carry traffic (missing or down
// bridge or tap), or nil; nil too without an uplink.
func (d *Dataplane) UplinkHealth() error {
	if d.up == nil {
		return nil
	}
	return d.up.dev.Check()
}

// UplinkStats returns the uplink's counters, or false without one.
func (d *Dataplane) UplinkStats() (UplinkStats, bool) {
	u := d.up
	if u == nil {
		return UplinkStats{}, false
	}
	cfg := u.dev.Config()
	s := UplinkStats{Kind: "tap", Name: cfg.Name, Attach: cfg.Attach, Queues: u.dev.Queues(), Healthy: true,
		RxPackets: u.RxPackets.Load(), RxBytes: u.RxBytes.Load(), TxPackets: u.TxPackets.Load(), TxBytes: u.TxBytes.Load(),
		RxNoNetwork: u.RxNoNetwork.Load(), RxRunt: u.RxRunt.Load(), RxNoDestination: u.RxNoDestination.Load(),
		TxDropped: u.TxDropped.Load(), TxOversize: u.TxOversize.Load()}
	if err := u.dev.Check(); err != nil {
		s.Healthy, s.Reason = false, err.Error()
	}
	return s, true
}

// checkUplink refuses a network on the uplink when there is none, when it
// is down, or when another network uses the VLAN there. Caller holds d.mu.
func (d *Dataplane) checkUplink(name string, vlan int, want bool) error {
	if n, ok := d.nets[name]; ok {
		if (n.up != nil) != want {
			return fmt.Errorf("uplink: network %q is %s the uplink", name, map[bool]string{true: "on", false: "not on"}[n.up != nil])
		}
		return nil
	}
	if !want {
		return nil
	}
	if d.up == nil {
		return errors.New("uplink: this dataplane has no tap uplink")
	}
	if err := d.up.dev.Check(); err != nil {
		return fmt.Errorf("uplink: %w", err)
	}
	if other, ok := (*d.up.byVLAN.Load())[vlan]; ok {
		return fmt.Errorf("vlan: %d is used on the uplink by network %q", vlan, other.name)
	}
	return nil
}

// attachUplink puts a new network on the uplink. Caller holds d.mu.
func (d *Dataplane) attachUplink(n *network) {
	n.up = &port{net: n, up: d.up}
	m := map[int]*network{}
	for k, v := range *d.up.byVLAN.Load() {
		m[k] = v
	}
	m[n.vlan] = n
	d.up.byVLAN.Store(&m)
}

// detachUplink takes a network that lost its last port off the uplink.
// Caller holds d.mu.
func (d *Dataplane) detachUplink(n *network) {
	if n.up == nil {
		return
	}
	m := map[int]*network{}
	for k, v := range *d.up.byVLAN.Load() {
		if v != n {
			m[k] = v
		}
	}
	d.up.byVLAN.Store(&m)
}

// serveUplinkSafely confines a fault in a guest's memory while delivering
// frames from the tap to that guest's RX ring.
func (w *worker) serveUplinkSafely() (worked bool) {
	defer func() {
		if r := recover(); r != nil {
			w.panics.Add(1)
			if h := &w.s.rx; h.v != nil {
				h.v.Unlock()
				*h = rxHold{}
			}
			if v := w.s.culprit; v != nil {
				w.s.culprit = nil
				v.Lock()
				w.breakVring(v, fmt.Errorf("fault while delivering from the uplink: %v", r))
				v.Unlock()
				w.untouch(v)
			}
			w.s.nt = 0
			worked = true
		}
	}()
	return w.serveUplink()
}

// serveUplink moves up to a burst of frames from the worker's tap queue to
// the guests and reports whether there were any.
func (w *worker) serveUplink() bool {
	wu := w.up
	u := wu.u
	now := time.Now().UnixNano()
	got := 0
	for range burstSize {
		n, err := unix.Read(wu.fd, wu.rx[:])
		if err != nil || n <= 0 {
			break // EAGAIN: empty
		}
		got++
		frame := wu.rx[tap.HdrLen:n]
		if len(frame) < ethHeader {
			u.RxRunt.Add(1)
			continue
		}
		u.RxPackets.Add(1)
		u.RxBytes.Add(uint64(len(frame)))
		vid, frame := vswitch.PopVLAN(frame)
		nw := (*u.byVLAN.Load())[vid]
		if nw == nil {
			u.RxNoNetwork.Add(1)
			continue
		}
		var dmac, smac vswitch.MAC
		copy(dmac[:], frame[0:6])
		copy(smac[:], frame[6:12])
		nw.macs.Learn(smac, nw.up, now)
		hash := vswitch.FlowHash(frame)
		if !dmac.IsMulticast() {
			if p, ok := nw.macs.Lookup(dmac); ok {
				if p.up != nil {
					u.RxNoDestination.Add(1) // back where it came from
				} else {
					w.deliverBuf(p, frame, hash)
				}
				continue
			}
		}
		ports := *nw.ports.Load()
		if len(ports) == 0 {
			u.RxNoDestination.Add(1)
		}
		for _, p := range ports {
			w.deliverBuf(p, frame, hash)
		}
	}
	if got == 0 {
		return false
	}
	w.s.culprit = nil
	w.releaseRX(true)
	w.callTouched()
	return true
}

// forwardUplink sends a unicast frame from a guest's TX chain to the
// uplink: the prefix already read, then the rest of r, up to limit bytes.
// It returns the frame length (more than limit: too long, not sent). The
// caller checks r.Err().
func (w *worker) forwardUplink(nw *network, r *virtq.Reader, prefix []byte, limit int) int {
	wu := w.up
	if wu == nil { // the network is on the uplink only if there is one
		return len(prefix) + r.Skip(limit+1-len(prefix))
	}
	start := tap.HdrLen + vlanTag
	n := copy(wu.tx[start:start+limit], prefix)
	for n < limit && r.More() {
		n += r.Read(wu.tx[start+n : start+limit])
	}
	if n == limit {
		n += r.Skip(1) // one more byte means too long
	}
	if n > limit || r.Err() != nil {
		return n
	}
	w.sendUplink(nw, start, n)
	return n
}

// floodUplink sends a flooded frame from a guest's TX chain (walked again)
// to the uplink.
func (w *worker) floodUplink(nw *network, src *virtq.Queue, head uint16, hdrLen, frameLen int) {
	wu := w.up
	if wu == nil {
		return
	}
	start := tap.HdrLen + vlanTag
	r := src.NewReader(head)
	r.Skip(hdrLen)
	if r.Read(wu.tx[start:start+frameLen]) != frameLen || r.Err() != nil {
		return // the chain changed under us
	}
	w.sendUplink(nw, start, frameLen)
}

// sendUplink tags the frame at wu.tx[start:start+n] with the network's
// VLAN, prepends the vnet header and writes it to the worker's tap queue.
func (w *worker) sendUplink(nw *network, start, n int) {
	wu := w.up
	u := wu.u
	if n > u.dev.Config().MTU+ethHeader {
		u.TxOversize.Add(1)
		return
	}
	if nw.vlan != 0 {
		start = vswitch.PushVLAN(wu.tx[:], start, nw.vlan)
		n += vlanTag
	}
	copy(wu.tx[start-tap.HdrLen:start], wu.hdr[:])
	if _, err := unix.Write(wu.fd, wu.tx[start-tap.HdrLen:start+n]); err != nil {
		u.TxDropped.Add(1)
		return
	}
	u.TxPackets.Add(1)
	u.TxBytes.Add(uint64(n))
}
