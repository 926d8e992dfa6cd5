package afxdp

import (
	"errors"
	"fmt"
	"net"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Config names the NIC and how it is shared with the host.
type Config struct {
	// Interface is the NIC (or veth) the sockets bind to.
	Interface string
	// Dedicated says the host does not use the NIC itself: broadcast and
	// multicast frames go to the dataplane only. Otherwise (the default)
	// they go to the kernel, and the dataplane reads a copy.
	Dedicated bool
	// Generic attaches the program in generic (SKB) mode even where the
	// driver offers native XDP (for a driver whose native XDP misbehaves).
	Generic bool
}

// Validate checks the names, naming the field.
func (c *Config) Validate() error {
	if c.Interface == "" || len(c.Interface) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface: %q must be 1..%d bytes", c.Interface, unix.IFNAMSIZ-1)
	}
	return nil
}

// Mode says how the program and the sockets run, and why not faster.
type Mode struct {
	// XDP is "native" (in the driver) or "generic" (SKB mode, after the
	// kernel built a socket buffer: slower, works on every interface).
	XDP string
	// NativeError is why native mode was refused ("" when native).
	NativeError string
	// ZeroCopy reports zero-copy sockets; ZeroCopyError is why the
	// kernel refused them ("" when zero-copy).
	ZeroCopy      bool
	ZeroCopyError string
}

func (m Mode) String() string {
	s := "XDP " + m.XDP
	if m.NativeError != "" {
		s += " (native refused: " + m.NativeError + ")"
	}
	if m.ZeroCopy {
		return s + ", zero-copy sockets"
	}
	return s + ", copy-mode sockets (zero-copy refused: " + m.ZeroCopyError + ")"
}

// Device is the AF_XDP uplink on one NIC: the XDP program, one socket per
// NIC queue, and the queues the dataplane's workers use.
type Device struct {
	cfg        Config
	ifindex    int
	nl         *netlink.Handle
	macs, xsks *ebpf.Map
	prog       *ebpf.Program
	link       link.Link
	socks      []*Socket
	group      *groupSocket
	queues     []*Queue
	mode       Mode
	mtu        int
	promisc    bool // we turned promiscuous mode on (and turn it off at Close)
}

// Open attaches the program to cfg.Interface and opens a socket on each
// of its queues, dividing them among workers queues. A missing or down
// interface is an error naming it; nothing is left behind on failure.
func Open(cfg Config, workers int) (_ *Device, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if workers < 1 {
		return nil, fmt.Errorf("workers: %d, want at least 1", workers)
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	d := &Device{cfg: cfg, nl: nl}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	l, err := d.checkLink()
	if err != nil {
		return nil, err
	}
	d.ifindex, d.mtu = l.Attrs().Index, l.Attrs().MTU
	nq := nicQueues(cfg.Interface, l)
	if d.macs, d.xsks, err = newMaps(nq); err != nil {
		return nil, fmt.Errorf("interface %s: %w", cfg.Interface, err)
	}
	if d.prog, err = loadProgram(d.macs, d.xsks, cfg.Dedicated); err != nil {
		return nil, fmt.Errorf("interface %s: %w", cfg.Interface, err)
	}
	d.mode.XDP = "native"
	err = errors.New("not tried: the configuration asks for generic mode")
	if !cfg.Generic {
		d.link, err = link.AttachXDP(link.XDPOptions{Program: d.prog, Interface: d.ifindex, Flags: link.XDPDriverMode})
	}
	if err != nil {
		d.mode.XDP, d.mode.NativeError = "generic", errText(err)
		d.link, err = link.AttachXDP(link.XDPOptions{Program: d.prog, Interface: d.ifindex, Flags: link.XDPGenericMode})
		if err != nil {
			return nil, fmt.Errorf("interface %s: attaching XDP (native: %s; generic): %w", cfg.Interface, d.mode.NativeError, err)
		}
	}
	zeroCopy := true
	for q := range nq {
		s, err := openSocket(d.ifindex, q, zeroCopy)
		if err != nil && zeroCopy {
			d.mode.ZeroCopyError = errText(err)
			zeroCopy = false
			s, err = openSocket(d.ifindex, q, false)
		}
		if err != nil {
			return nil, fmt.Errorf("interface %s: AF_XDP socket on queue %d: %w", cfg.Interface, q, err)
		}
		d.socks = append(d.socks, s)
		if err := d.xsks.Put(uint32(q), uint32(s.FD())); err != nil {
			return nil, fmt.Errorf("interface %s: XSKMAP entry for queue %d: %w", cfg.Interface, q, err)
		}
	}
	d.mode.ZeroCopy = zeroCopy
	if !cfg.Dedicated {
		if d.group, err = openGroupSocket(d.ifindex); err != nil {
			return nil, fmt.Errorf("interface %s: %w", cfg.Interface, err)
		}
	}
	// Frames to guest MACs must get past the NIC's address filter.
	if l.Attrs().Promisc == 0 {
		if err := nl.SetPromiscOn(l); err != nil {
			return nil, fmt.Errorf("interface %s: promiscuous mode: %w", cfg.Interface, err)
		}
		d.promisc = true
	}
	if d.queues, err = d.makeQueues(workers); err != nil {
		return nil, fmt.Errorf("interface %s: %w", cfg.Interface, err)
	}
	return d, nil
}

func errText(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return fmt.Sprintf("%v (%s)", err, unix.ErrnoName(errno))
	}
	return err.Error()
}

// checkLink returns the interface, or an error naming it when it is
// missing or down.
func (d *Device) checkLink() (netlink.Link, error) {
	l, err := d.nl.LinkByName(d.cfg.Interface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("interface: no interface %q", d.cfg.Interface)
		}
		return nil, fmt.Errorf("interface: %q: %w", d.cfg.Interface, err)
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("interface: %q is down", d.cfg.Interface)
	}
	return l, nil
}

// makeQueues divides the sockets among the workers: worker i receives on
// the NIC queues q with q % workers == i (and on the group socket if it is
// worker 0) and sends on socket i % sockets, shared (under a lock) only
// when there are more workers than NIC queues.
func (d *Device) makeQueues(workers int) ([]*Queue, error) {
	qs := make([]*Queue, workers)
	for i := range qs {
		q := &Queue{fd: -1, epfd: -1, tx: d.socks[i%len(d.socks)], txShared: workers > len(d.socks)}
		for j := i; j < len(d.socks); j += workers {
			q.rx = append(q.rx, d.socks[j])
		}
		if i == 0 && d.group != nil {
			q.group = d.group
		}
		fds := q.fds()
		switch len(fds) {
		case 0:
		case 1:
			q.fd = fds[0]
		default:
			// several sources: one epoll fd over them, itself pollable
			epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
			if err != nil {
				return nil, fmt.Errorf("epoll_create: %w", err)
			}
			q.epfd, q.fd = epfd, epfd
			for _, fd := range fds {
				ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
				if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
					unix.Close(epfd)
					return nil, fmt.Errorf("epoll_ctl: %w", err)
				}
			}
		}
		qs[i] = q
	}
	return qs, nil
}

// Queue returns worker i's queue.
func (d *Device) Queue(i int) *Queue { return d.queues[i] }

// Queues returns the number of NIC queues with a socket.
func (d *Device) Queues() int { return len(d.socks) }

// Mode returns how the program and sockets run.
func (d *Device) Mode() Mode { return d.mode }

// MTU is the interface's MTU when the device was opened. Frames are
// limited to MaxFrame besides.
func (d *Device) MTU() int { return d.mtu }

// Config returns the configuration.
func (d *Device) Config() Config { return d.cfg }

// AddMAC makes frames to mac ours (a guest's address).
func (d *Device) AddMAC(mac [6]byte) error {
	if err := d.macs.Put(mac, uint8(1)); err != nil {
		return fmt.Errorf("interface %s: guest MAC %x: %w", d.cfg.Interface, mac, err)
	}
	return nil
}

// DeleteMAC gives frames to mac back to the kernel.
func (d *Device) DeleteMAC(mac [6]byte) error {
	if err := d.macs.Delete(mac); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("interface %s: guest MAC %x: %w", d.cfg.Interface, mac, err)
	}
	return nil
}

// Check reports why the uplink cannot carry traffic, or nil: the
// interface exists, is up and still runs our program.
func (d *Device) Check() error {
	l, err := d.checkLink()
	if err != nil {
		return err
	}
	if l.Attrs().Index != d.ifindex {
		return fmt.Errorf("interface: %q was re-created (index %d, was %d)", d.cfg.Interface, l.Attrs().Index, d.ifindex)
	}
	if x := l.Attrs().Xdp; x == nil || !x.Attached {
		return fmt.Errorf("interface: %q runs no XDP program any more", d.cfg.Interface)
	}
	return nil
}

// Close detaches the program, closes the sockets and restores the
// interface's promiscuous flag.
func (d *Device) Close() {
	for _, q := range d.queues {
		if q != nil && q.epfd >= 0 {
			unix.Close(q.epfd)
		}
	}
	d.queues = nil
	if d.link != nil {
		d.link.Close()
		d.link = nil
	}
	for _, s := range d.socks {
		s.Close()
	}
	d.socks = nil
	if d.group != nil {
		d.group.close()
		d.group = nil
	}
	for _, c := range []interface{ Close() error }{d.prog, d.macs, d.xsks} {
		if c != nil && !isNil(c) {
			c.Close()
		}
	}
	d.prog, d.macs, d.xsks = nil, nil, nil
	if d.promisc {
		if l, err := d.nl.LinkByIndex(d.ifindex); err == nil {
			d.nl.SetPromiscOff(l)
		}
		d.promisc = false
	}
	if d.nl != nil {
		d.nl.Close()
		d.nl = nil
	}
}

func isNil(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case *ebpf.Program:
		return v == nil
	case *ebpf.Map:
		return v == nil
	}
	return false
}

// nicQueues is the number of receive queues the NIC uses (ethtool
// channels: rx + combined), else the number netlink reports.
func nicQueues(name string, l netlink.Link) int {
	if n := ethtoolRxQueues(name); n > 0 {
		return n
	}
	return max(l.Attrs().NumRxQueues, 1)
}

type ethtoolChannels struct {
	cmd                                         uint32
	maxRx, maxTx, maxOther, maxCombined         uint32
	rxCount, txCount, otherCount, combinedCount uint32
}

type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

func ethtoolRxQueues(name string) int {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	ch := ethtoolChannels{cmd: unix.ETHTOOL_GCHANNELS}
	var ifr ifreqData
	copy(ifr.name[:], name)
	ifr.data = unsafe.Pointer(&ch)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return 0
	}
	return int(ch.rxCount + ch.combinedCount)
}

// Queue is one worker's share of the device: the sockets it receives on
// and the socket it sends on. Its methods are for that worker only.
type Queue struct {
	rx       []*Socket
	group    *groupSocket
	tx       *Socket
	txShared bool
	locked   bool // holds tx.txMu between TxFrame and Send
	fd, epfd int
}

func (q *Queue) fds() []int {
	var fds []int
	for _, s := range q.rx {
		fds = append(fds, s.FD())
	}
	if q.group != nil {
		fds = append(fds, q.group.fd)
	}
	return fds
}

// FD is the fd to wait on for received frames (EPOLLIN, level-triggered);
// -1 when the worker only sends.
func (q *Queue) FD() int { return q.fd }

// Receive fills frames with up to len(frames) received frames and returns
// how many. They stay valid until Release.
func (q *Queue) Receive(frames [][]byte) int {
	n := 0
	for _, s := range q.rx {
		if n == len(frames) {
			return n
		}
		n += s.receive(frames[n:])
	}
	if q.group != nil && n < len(frames) {
		n += q.group.receive(frames[n:])
	}
	return n
}

// Release gives the frames of the last Receive back to the kernel.
func (q *Queue) Release() {
	for _, s := range q.rx {
		s.releaseRX()
	}
}

// TxFrame returns a buffer of FrameSize bytes to build the next frame in,
// or nil when every buffer is in flight. Send or Cancel must follow.
func (q *Queue) TxFrame() []byte {
	if q.txShared {
		q.tx.txMu.Lock()
		q.locked = true
	}
	b := q.tx.txFrame()
	if b == nil {
		q.unlock()
	}
	return b
}

// Send queues the frame at [off, off+n) of the TxFrame buffer; Flush sends
// it. It reports false (the frame dropped) if off and n do not fit.
func (q *Queue) Send(off, n int) bool {
	ok := q.tx.txQueue(off, n)
	q.unlock()
	return ok
}

// Cancel gives the TxFrame buffer back unsent. It is safe to call when no
// buffer is out (a worker recovering from a fault calls it).
func (q *Queue) Cancel() {
	if q.txShared && !q.locked {
		return
	}
	q.tx.txQueue(0, 0)
	q.unlock()
}

func (q *Queue) unlock() {
	if q.locked {
		q.locked = false
		q.tx.txMu.Unlock()
	}
}

// Flush sends the queued frames.
func (q *Queue) Flush() {
	if q.txShared {
		q.tx.txMu.Lock()
		defer q.tx.txMu.Unlock()
	}
	q.tx.flush()
}

// TxSocket is the socket the queue sends on.
func (q *Queue) TxSocket() *Socket { return q.tx }

// RxSockets are the sockets the queue receives on.
func (q *Queue) RxSockets() []*Socket { return q.rx }
