package vxlan

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Burst is the most datagrams a Queue receives at once, and the most
// frames it holds for sending between two flushes.
const Burst = 32

// BufSize is one datagram buffer: an underlay MTU of up to 9000 (jumbo
// frames) less the outer IPv4 header fits, with room to spare.
const BufSize = 9216

// MaxUnderlayMTU is the largest underlay MTU a Queue's buffers carry.
const MaxUnderlayMTU = BufSize - 216

// HeadLen is what a Queue writes in front of an inner frame: the outer
// UDP header and the VXLAN header (the kernel adds the IPv4 header).
const HeadLen = UDPLen + HdrLen

// maxMsgs bounds the datagrams queued between two sendmmsg calls; a flood
// to many VTEPs sends early when it fills.
const maxMsgs = 128

// Peer is a remote VTEP: a node's underlay address. Its counters are the
// per-VTEP metrics; every worker adds to them.
type Peer struct {
	Addr netip.Addr
	name unix.RawSockaddrInet4
	PeerCounters
}

// PeerCounters count one VTEP's traffic.
type PeerCounters struct {
	RxPackets, RxBytes, TxPackets, TxBytes atomic.Uint64
	// TxErrors counts datagrams the kernel refused for this VTEP: no
	// route, or larger than the route's MTU (never fragmented).
	TxErrors atomic.Uint64
	// TxDropped counts datagrams dropped because the socket's send
	// buffer was full.
	TxDropped atomic.Uint64
}

// NewPeer returns the VTEP at addr (IPv4).
func NewPeer(addr netip.Addr) (*Peer, error) {
	if !addr.Is4() {
		return nil, fmt.Errorf("vxlan: VTEP %s is not an IPv4 address", addr)
	}
	p := &Peer{Addr: addr}
	p.name.Family = unix.AF_INET
	p.name.Addr = addr.As4()
	return p, nil
}

// QueueCounters count what a Queue refused on receipt.
type QueueCounters struct {
	RxInvalid  atomic.Uint64 // not a VXLAN datagram with a valid VNI and an inner frame
	RxTooLarge atomic.Uint64 // truncated: longer than BufSize
}

// Queue is one worker's share of the overlay: a UDP socket on the node's
// address and the VXLAN port (SO_REUSEPORT: the kernel spreads the flows
// of remote VTEPs over the workers by their outer ports) and a raw UDP
// socket to send from, whose UDP header the Queue writes itself so that
// the source port follows the inner flow. Only its worker calls it.
type Queue struct {
	rxFD, txFD int
	port       uint16

	rxBuf   []byte
	rxMsgs  [Burst]mmsghdr
	rxIov   [Burst]unix.Iovec
	rxNames [Burst]unix.RawSockaddrInet4
	rxVNI   [Burst]uint32
	rxSrc   [Burst][4]byte

	txBuf   []byte
	used    int // slots of txBuf handed out since the last flush
	cur     int // the slot TxFrame handed out, -1: none
	txMsgs  [maxMsgs]mmsghdr
	txIov   [maxMsgs]unix.Iovec
	txPeers [maxMsgs]*Peer
	queued  int

	QueueCounters
}

// mmsghdr is struct mmsghdr (x/sys has the type but no recvmmsg or
// sendmmsg call).
type mmsghdr = unix.Mmsghdr

// Open opens a worker's queue on the node's address local and the VXLAN
// UDP port.
func Open(local netip.Addr, port uint16) (_ *Queue, err error) {
	if !local.Is4() {
		return nil, fmt.Errorf("vxlan: local address %s is not IPv4", local)
	}
	q := newQueue(port)
	defer func() {
		if err != nil {
			q.Close()
		}
	}()
	sa := &unix.SockaddrInet4{Addr: local.As4(), Port: int(port)}
	q.rxFD, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("vxlan: UDP socket: %w", err)
	}
	if err := unix.SetsockoptInt(q.rxFD, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return nil, fmt.Errorf("vxlan: SO_REUSEPORT: %w", err)
	}
	setBuffer(q.rxFD, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF)
	if err := unix.Bind(q.rxFD, sa); err != nil {
		return nil, fmt.Errorf("vxlan: bind %s:%d: %w", local, port, err)
	}
	// the raw socket sends UDP datagrams with our own UDP header; it would
	// also get a copy of every UDP datagram the node receives: a filter
	// that accepts nothing keeps its receive queue empty
	q.txFD, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("vxlan: raw UDP socket (needs CAP_NET_RAW): %w", err)
	}
	drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
	if err := unix.SetsockoptSockFprog(q.txFD, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: 1, Filter: &drop[0]}); err != nil {
		return nil, fmt.Errorf("vxlan: filter on the raw socket: %w", err)
	}
	setBuffer(q.txFD, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF)
	// never fragmented: a datagram over the route's MTU is refused
	if err := unix.SetsockoptInt(q.txFD, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil {
		return nil, fmt.Errorf("vxlan: IP_MTU_DISCOVER: %w", err)
	}
	if err := unix.Bind(q.txFD, &unix.SockaddrInet4{Addr: local.As4()}); err != nil {
		return nil, fmt.Errorf("vxlan: bind the raw socket to %s: %w", local, err)
	}
	return q, nil
}

// newQueue is a Queue without sockets, its buffers and messages set up.
func newQueue(port uint16) *Queue {
	q := &Queue{rxFD: -1, txFD: -1, port: port, cur: -1,
		rxBuf: make([]byte, Burst*BufSize), txBuf: make([]byte, Burst*BufSize)}
	for i := range q.rxMsgs {
		q.rxIov[i] = unix.Iovec{Base: &q.rxBuf[i*BufSize]}
		q.rxIov[i].SetLen(BufSize)
		h := &q.rxMsgs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&q.rxNames[i]))
		h.Iov = &q.rxIov[i]
		h.SetIovlen(1)
	}
	for i := range q.txMsgs {
		q.txMsgs[i].Hdr.Iov = &q.txIov[i]
		q.txMsgs[i].Hdr.SetIovlen(1)
	}
	return q
}

// Adopt makes a Queue of a predecessor's sockets (an upgrade without a
// gap: datagrams that came in meanwhile wait in them). It owns the fds
// from then on, also on error.
func Adopt(rxFD, txFD int, port uint16) (*Queue, error) {
	q := newQueue(port)
	q.rxFD, q.txFD = rxFD, txFD
	for _, fd := range []int{rxFD, txFD} {
		if err := unix.SetNonblock(fd, true); err != nil {
			q.Close()
			return nil, fmt.Errorf("vxlan: adopted socket %d: %w", fd, err)
		}
	}
	return q, nil
}

// FDs returns the queue's sockets (a handoff duplicates them).
func (q *Queue) FDs() (rx, tx int) { return q.rxFD, q.txFD }

// SocketBuffer is the receive and send buffer a Queue asks for: a TCP
// flow's 64 KiB GSO frames arrive as bursts of some 45 datagrams each, and
// the default (net.core.rmem_default, 208 KiB) drops some of them while
// the worker serves its other rings.
const SocketBuffer = 4 << 20

// setBuffer sets a socket buffer to SocketBuffer: past the sysctl cap
// where the process may (CAP_NET_ADMIN), else up to the cap.
func setBuffer(fd, force, plain int) {
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, SocketBuffer) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, plain, SocketBuffer)
	}
}

// Close closes the sockets.
func (q *Queue) Close() {
	for _, fd := range []*int{&q.rxFD, &q.txFD} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// FD is the socket a worker waits on for datagrams.
func (q *Queue) FD() int { return q.rxFD }

// Receive fills frames with the inner frames of received VXLAN datagrams,
// valid until the next Receive; Meta(i) says where frames[i] came from.
// Datagrams that are not VXLAN are counted and skipped.
func (q *Queue) Receive(frames [][]byte) int {
	n := min(len(frames), Burst)
	if n == 0 {
		return 0
	}
	for i := 0; i < n; i++ {
		q.rxMsgs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
		q.rxMsgs[i].Len = 0
	}
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(q.rxFD), uintptr(unsafe.Pointer(&q.rxMsgs[0])), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
	if e != 0 || int(r) <= 0 {
		return 0 // EAGAIN: empty
	}
	got := 0
	for i := 0; i < int(r); i++ {
		m := &q.rxMsgs[i]
		if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
			q.RxTooLarge.Add(1)
			continue
		}
		b := q.rxBuf[i*BufSize : i*BufSize+int(m.Len)]
		vni, inner, err := Parse(b)
		if err != nil {
			q.RxInvalid.Add(1)
			continue
		}
		frames[got] = inner
		q.rxVNI[got] = vni
		q.rxSrc[got] = q.rxNames[i].Addr
		got++
	}
	return got
}

// Meta returns the VNI and the sending VTEP's address of frames[i] of the
// last Receive.
func (q *Queue) Meta(i int) (vni uint32, src [4]byte) { return q.rxVNI[i], q.rxSrc[i] }

// Release is for the uplink's queue interface: received frames stay valid
// until the next Receive.
func (q *Queue) Release() {}

// TxFrame returns a buffer to build an inner frame in, at an offset of at
// least HeadLen (room for the headers SendTo writes in front of it).
func (q *Queue) TxFrame() []byte {
	if q.used == Burst {
		q.Flush()
	}
	q.cur = q.used
	q.used++
	return q.txBuf[q.cur*BufSize+HeadLen : (q.cur+1)*BufSize]
}

// Cancel gives back the buffer TxFrame handed out.
func (q *Queue) Cancel() {
	if q.cur >= 0 && q.cur == q.used-1 {
		q.used--
	}
	q.cur = -1
}

// Send is the uplink's queue interface; an overlay frame needs its VNI
// and VTEPs (SendTo). It refuses.
func (q *Queue) Send(off, n int) bool { q.Cancel(); return false }

// SendTo queues the inner frame at buf[off:off+n] of the buffer TxFrame
// handed out, encapsulated for vni with the source port of flow hash,
// once to each of peers (head-end replication). The datagrams leave at
// Flush.
func (q *Queue) SendTo(off, n int, vni, hash uint32, peers []*Peer) {
	if q.cur < 0 || len(peers) == 0 {
		q.Cancel()
		return
	}
	start := q.cur*BufSize + off // the frame is at start+HeadLen
	b := q.txBuf[start : start+HeadLen+n]
	PutUDP(b, SrcPort(hash), q.port, HdrLen+n)
	PutHeader(b[UDPLen:], vni)
	for _, p := range peers {
		if q.queued == maxMsgs {
			q.send()
		}
		i := q.queued
		q.txIov[i].Base = &b[0]
		q.txIov[i].SetLen(len(b))
		q.txMsgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&p.name))
		q.txMsgs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
		q.txPeers[i] = p
		q.queued++
	}
	q.cur = -1
}

// Flush sends the queued datagrams and frees every buffer.
func (q *Queue) Flush() {
	q.send()
	q.used, q.cur = 0, -1
}

// send hands the queued datagrams to the kernel and counts them per VTEP.
func (q *Queue) send() {
	for i := 0; i < q.queued; {
		r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(q.txFD), uintptr(unsafe.Pointer(&q.txMsgs[i])), uintptr(q.queued-i), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case e == 0 && int(r) > 0:
			for _, p := range q.txPeers[i : i+int(r)] {
				p.TxPackets.Add(1)
			}
			for j := i; j < i+int(r); j++ {
				q.txPeers[j].TxBytes.Add(q.txIov[j].Len - HeadLen)
			}
			i += int(r)
		case e == unix.EAGAIN || e == unix.ENOBUFS:
			for _, p := range q.txPeers[i:q.queued] {
				p.TxDropped.Add(1)
			}
			i = q.queued
		default: // this datagram: no route, too large for the path
			q.txPeers[i].TxErrors.Add(1)
			i++
		}
	}
	clear(q.txPeers[:q.queued])
	q.queued = 0
}
