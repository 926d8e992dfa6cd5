// Package tap is the tap uplink's device: a multiqueue tap (one queue per
// dataplane worker) with a virtio-net header on every frame, enslaved to a
// Linux bridge named in the node's config, through which vhostmq networks
// reach the node's network and other nodes.
//
// Offloads are on (TUNSETOFFLOAD: partial checksums, TCP GSO with ECN,
// and USO where the kernel has it): the vnet header is struct
// virtio_net_hdr, so a guest's GSO frame goes into the tap whole, and the
// kernel hands over GSO frames up to 64 KiB (MaxFrame) that the dataplane
// passes whole to guests that accept them, or segments (package offload).
package tap

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/offload"
)

// HdrLen is the vnet header on every frame: struct virtio_net_hdr_mrg_rxbuf,
// the size virtio 1.0 guests use, so headers map 1:1.
const HdrLen = 12

// Offloads are the TUNSETOFFLOAD flags asked for; kernels before 6.2
// refuse USO, and get the others.
const (
	Offloads      = unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6 | unix.TUN_F_TSO_ECN | unix.TUN_F_USO4 | unix.TUN_F_USO6
	offloadsNoUSO = Offloads &^ (unix.TUN_F_USO4 | unix.TUN_F_USO6)
)

// MaxFrame is the longest frame read from or written to the tap (behind
// the vnet header): a GSO frame of a 64 KiB IP packet.
const MaxFrame = offload.MaxFrame

// MaxQueues is the kernel's limit on a multiqueue tap's queues.
const MaxQueues = 256

// Config names the tap and where it is attached.
type Config struct {
	// Name of the tap device the dataplane creates (and removes).
	Name string
	// Attach is the Linux bridge the tap joins; "" = none: the tap is a
	// plain host interface (the host routes or bridges it itself).
	Attach string
	// MTU of the tap; 0 = 1500. Give room for the networks' MTU plus a
	// VLAN tag when networks are tagged (the bridge's MTU is the limit).
	MTU int
}

// Validate checks the names and the MTU, naming the field.
func (c *Config) Validate() error {
	if c.Name == "" || len(c.Name) >= unix.IFNAMSIZ {
		return fmt.Errorf("name: %q must be 1..%d bytes", c.Name, unix.IFNAMSIZ-1)
	}
	if len(c.Attach) >= unix.IFNAMSIZ {
		return fmt.Errorf("attach: %q is longer than %d bytes", c.Attach, unix.IFNAMSIZ-1)
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65521) {
		return fmt.Errorf("mtu: %d is outside 68..65521", c.MTU)
	}
	return nil
}

// Device is an open multiqueue tap.
type Device struct {
	cfg Config
	fds []int
	nl  *netlink.Handle // in the network namespace the tap was made in
	uso bool            // the kernel took TUN_F_USO4/6
}

// Open creates the tap with one queue per worker, sets it up and attaches
// it. A missing or down bridge is an error naming it; nothing is left
// behind on failure.
func Open(cfg Config, queues int) (_ *Device, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if queues < 1 || queues > MaxQueues {
		return nil, fmt.Errorf("queues: %d is outside 1..%d", queues, MaxQueues)
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
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
	var br netlink.Link
	if cfg.Attach != "" {
		if br, err = d.bridge(); err != nil {
			return nil, err
		}
	}
	if _, err := nl.LinkByName(cfg.Name); err == nil {
		return nil, fmt.Errorf("name: an interface %q exists already", cfg.Name)
	}
	for range queues {
		fd, uso, err := openQueue(cfg.Name)
		d.uso = uso
		if err != nil {
			return nil, fmt.Errorf("tap %s: %w", cfg.Name, err)
		}
		d.fds = append(d.fds, fd)
	}
	if err := d.configure(br); err != nil {
		return nil, err
	}
	return d, nil
}

// configure sets the tap's MTU, puts it on its bridge (br, nil: none) and
// sets it up.
func (d *Device) configure(br netlink.Link) error {
	cfg := d.cfg
	link, err := d.nl.LinkByName(cfg.Name)
	if err != nil {
		return fmt.Errorf("tap %s: %w", cfg.Name, err)
	}
	if err := d.nl.LinkSetMTU(link, cfg.MTU); err != nil {
		return fmt.Errorf("tap %s: mtu %d: %w", cfg.Name, cfg.MTU, err)
	}
	if br != nil {
		if err := d.nl.LinkSetMaster(link, br); err != nil {
			return fmt.Errorf("tap %s: attaching to %s: %w", cfg.Name, cfg.Attach, err)
		}
	}
	if err := d.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("tap %s: set up: %w", cfg.Name, err)
	}
	return nil
}

// bridge returns the attach bridge, or an error saying why it cannot be
// used.
func (d *Device) bridge() (netlink.Link, error) {
	br, err := d.nl.LinkByName(d.cfg.Attach)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("attach: no interface %q", d.cfg.Attach)
		}
		return nil, fmt.Errorf("attach: %q: %w", d.cfg.Attach, err)
	}
	if br.Type() != "bridge" {
		return nil, fmt.Errorf("attach: %q is a %s interface, not a Linux bridge", d.cfg.Attach, br.Type())
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		return nil, fmt.Errorf("attach: bridge %q is down", d.cfg.Attach)
	}
	return br, nil
}

// openQueue opens one queue of the multiqueue tap name (creating the tap
// with the first) and reports whether the kernel took USO.
func openQueue(name string) (fd int, uso bool, err error) {
	fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false, fmt.Errorf("/dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, false, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, false, fmt.Errorf("TUNSETIFF: %w", err)
	}
	if uso, err = setOffloads(fd); err != nil {
		unix.Close(fd)
		return -1, false, err
	}
	return fd, uso, nil
}

// setOffloads turns the offloads on and reports whether the kernel took
// USO.
func setOffloads(fd int) (uso bool, err error) {
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, HdrLen); err != nil {
		return false, fmt.Errorf("TUNSETVNETHDRSZ: %w", err)
	}
	err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, Offloads)
	if errors.Is(err, unix.EINVAL) {
		err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, offloadsNoUSO)
		uso = false
	} else {
		uso = true
	}
	if err != nil {
		return false, fmt.Errorf("TUNSETOFFLOAD: %w", err)
	}
	return uso, nil
}

// Caps says what the tap takes whole from the dataplane: everything a
// vnet header can say (the kernel segments and checksums what its
// devices cannot), USO only where the kernel knows it.
func (d *Device) Caps() offload.Caps {
	c := offload.CapCsum | offload.CapTSO4 | offload.CapTSO6 | offload.CapECN
	if d.uso {
		c |= offload.CapUSO4 | offload.CapUSO6
	}
	return c
}

// Queue returns the file descriptor of queue i (non-blocking; read and
// write one frame with its vnet header per call).
func (d *Device) Queue(i int) int { return d.fds[i] }

// Queues returns the number of queues.
func (d *Device) Queues() int { return len(d.fds) }

// Name returns the tap's name.
func (d *Device) Name() string { return d.cfg.Name }

// Config returns the configuration.
func (d *Device) Config() Config { return d.cfg }

// Check reports why the uplink cannot carry traffic, or nil: the tap and
// its bridge exist and are up.
func (d *Device) Check() error {
	link, err := d.nl.LinkByName(d.cfg.Name)
	if err != nil {
		return fmt.Errorf("tap %s: %w", d.cfg.Name, err)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("tap %s is down", d.cfg.Name)
	}
	if d.cfg.Attach == "" {
		return nil
	}
	br, err := d.bridge()
	if err != nil {
		return err
	}
	if link.Attrs().MasterIndex != br.Attrs().Index {
		return fmt.Errorf("tap %s is no longer attached to %s", d.cfg.Name, d.cfg.Attach)
	}
	return nil
}

// Close closes every queue; the kernel removes the tap with the last one.
func (d *Device) Close() {
	for _, fd := range d.fds {
		unix.Close(fd)
	}
	d.fds = nil
	if d.nl != nil {
		d.nl.Close()
	}
}

// Adopt takes over the tap a predecessor process had open (an upgrade
// without a gap): fds are its queues, received over the handoff socket.
// Each must be a queue of the multiqueue tap cfg.Name with vnet headers;
// the tap is set to cfg (MTU, bridge, up) as Open would. More queues than
// fds are opened on the same tap, extra fds closed. Adopt takes every fd
// it is given (setting fds[i] to -1), used or closed, error or not.
func Adopt(cfg Config, fds []int, queues int) (_ *Device, err error) {
	var taken []int
	for i, fd := range fds {
		if fd >= 0 {
			taken = append(taken, fd)
		}
		fds[i] = -1
	}
	closeAll := func() {
		for _, fd := range taken {
			unix.Close(fd)
		}
	}
	if err := cfg.Validate(); err != nil {
		closeAll()
		return nil, err
	}
	if queues < 1 || queues > MaxQueues {
		closeAll()
		return nil, fmt.Errorf("queues: %d is outside 1..%d", queues, MaxQueues)
	}
	if len(taken) == 0 {
		return nil, errors.New("adopt: no tap queue was handed over")
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	nl, err := netlink.NewHandle()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	d := &Device{cfg: cfg, nl: nl}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	for i, fd := range taken {
		if i < queues {
			d.fds = append(d.fds, fd) // closed by d.Close on error
		} else {
			unix.Close(fd) // the kernel detaches the queue
		}
	}
	d.uso = true
	for i, fd := range d.fds {
		if err := checkQueue(fd, cfg.Name); err != nil {
			return nil, fmt.Errorf("adopt: handed queue %d: %w", i, err)
		}
		uso, err := setOffloads(fd)
		if err != nil {
			return nil, fmt.Errorf("adopt: handed queue %d: %w", i, err)
		}
		d.uso = d.uso && uso
	}
	for len(d.fds) < queues {
		fd, uso, err := openQueue(cfg.Name)
		if err != nil {
			return nil, fmt.Errorf("tap %s: another queue: %w", cfg.Name, err)
		}
		d.fds = append(d.fds, fd)
		d.uso = d.uso && uso
	}
	var br netlink.Link
	if cfg.Attach != "" {
		if br, err = d.bridge(); err != nil {
			return nil, err
		}
	}
	if err := d.configure(br); err != nil {
		return nil, err
	}
	return d, nil
}

// checkQueue verifies that fd is a queue of the multiqueue tap name with
// vnet headers (TUNGETIFF).
func checkQueue(fd int, name string) error {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return fmt.Errorf("not a tap queue: TUNGETIFF: %w", err)
	}
	const want = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE | unix.IFF_VNET_HDR
	if got := ifr.Name(); got != name {
		return fmt.Errorf("a queue of tap %q, this dataplane's tap is %q", got, name)
	}
	if flags := ifr.Uint16(); flags&want != want {
		return fmt.Errorf("tap %q has flags %#x, not a multiqueue tap with vnet headers (%#x)", name, flags, want)
	}
	return nil
}
