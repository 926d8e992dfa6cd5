package dataplane

// Announcements after a live migration. When the guest cannot announce
// itself (no VIRTIO_NET_F_GUEST_ANNOUNCE), the target QEMU sends
// SEND_RARP with the guest's MAC; the dataplane then broadcasts a RARP
// from that MAC on the port's network, as DPDK's vhost does, so that the
// other guests' switches, the uplink's bridge and, on the vxlan uplink,
// every other node learn where the guest is now: the remote VTEPs'
// tables move within one round trip. The frame leaves from the worker of
// the port's pair 0 (the uplink queue is its alone), woken for it.

import (
	"encoding/binary"

	"github.com/vhostmq/vhostmq/dataplane/vswitch"
)

// announcePending marks port.announce as not yet broadcast.
const announcePending = 1 << 63

// broadcastAnnounce asks the worker of p's pair 0 to broadcast a RARP
// from the MAC Key k.
func (d *Dataplane) broadcastAnnounce(p *port, k uint64) {
	p.announce.Store(k | announcePending)
	if w := p.workers[0].Load(); w != nil {
		w.announcing.Store(true)
		w.wake()
	}
}

// rarpLen is a RARP frame padded to Ethernet's minimum (no FCS).
const rarpLen = 60

// putRARP writes a RARP "reverse request" from mac into f[:rarpLen]: what
// QEMU sends for a guest after a migration (and DPDK's vhost for
// SEND_RARP).
func putRARP(f []byte, mac vswitch.MAC) {
	_ = f[rarpLen-1]
	clear(f[:rarpLen])
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac[:])
	binary.BigEndian.PutUint16(f[12:], 0x8035) // RARP
	binary.BigEndian.PutUint16(f[14:], 1)      // Ethernet
	binary.BigEndian.PutUint16(f[16:], 0x0800) // IPv4
	f[18], f[19] = 6, 4                        // address lengths
	binary.BigEndian.PutUint16(f[20:], 3)      // reverse request
	copy(f[22:28], mac[:])                     // sender MAC; its IP 0
	copy(f[32:38], mac[:])                     // target MAC; its IP 0
}

// sendAnnouncementsSafely confines a fault in a destination guest's
// memory to that guest (as serveUplinkSafely does).
func (w *worker) sendAnnouncementsSafely() {
	defer func() {
		if r := recover(); r != nil {
			w.panics.Add(1)
			culprit := w.s.rx.v
			if h := &w.s.rx; h.v != nil {
				h.unready()
				h.v.Unlock()
				*h = rxHold{}
			}
			w.s.inRX = false
			if culprit != nil {
				w.stopFaulted(r, "broadcasting an announcement", culprit)
				w.untouch(culprit)
			}
			w.callTouched()
		}
	}()
	w.sendAnnouncements()
}

// sendAnnouncements broadcasts the pending announcement of every port
// whose pair 0 this worker serves: to the other guests of its network and
// to the uplink.
func (w *worker) sendAnnouncements() {
	for _, a := range w.list.Load().list {
		p := a.port
		if a.pair != 0 {
			continue
		}
		k := p.announce.Load()
		if k&announcePending == 0 || !p.announce.CompareAndSwap(k, k&^announcePending) {
			continue
		}
		f := w.rarp[:]
		putRARP(f, vswitch.MACOf(k&^announcePending))
		nw := p.net
		for _, q := range *nw.ports.Load() {
			if q != p {
				if full := w.deliverBuf(q, f, 0); full != nil {
					full.Counters.DropNoBuf.Add(1)
				}
			}
		}
		w.s.inRX = false
		w.releaseRX(true)
		w.callTouched()
		if nw.up != nil && w.up != nil {
			w.uplinkCopy(nw, f)
			w.flushUplink()
		}
	}
}
