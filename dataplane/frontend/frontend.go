// Package frontend is an in-repo vhost-user front-end: it plays the part of
// QEMU plus a guest virtio-net driver so that the backend can be tested and
// benchmarked from Go without a VM.
//
// A Frontend owns a memfd of "guest memory" mapped MAP_SHARED into this
// process. Its split virtqueues, RX buffers and TX buffers all live inside
// that memory, so the backend can map it from the fds passed with
// SET_MEM_TABLE. As in QEMU, ring addresses sent in SET_VRING_ADDR are the
// front-end's own user virtual addresses (the address of the mapping plus an
// offset), while descriptor addr fields are guest-physical addresses:
// Config.GPABase plus the offset into guest memory. The memory is one memfd
// described as Config.Regions regions at different mmap offsets (the same fd
// is attached once per region, so the backend receives Regions fds); GPAs
// and user addresses are contiguous across regions, but a backend that maps
// each region separately will see buffers straddling region boundaries.
//
// The setup sequence follows QEMU: SET_OWNER, GET_FEATURES,
// GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES, GET_QUEUE_NUM (in queue
// pairs), SET_FEATURES, SET_STATUS(FEATURES_OK), SET_MEM_TABLE (or
// GET_MAX_MEM_SLOTS + ADD_MEM_REG), then per vring SET_VRING_NUM,
// SET_VRING_BASE, SET_VRING_ADDR, SET_VRING_KICK, SET_VRING_CALL, then
// SET_VRING_ENABLE for every vring and SET_STATUS(DRIVER_OK). Setting
// messages carry NEED_REPLY when REPLY_ACK was negotiated and a non-zero ack
// is returned as a *NackError.
//
// Vring 2i is pair i's RX queue (backend → frontend) and 2i+1 its TX queue.
// Concurrency: every vring has its own lock, so any goroutine may use any
// method, but the natural pattern is one goroutine sending on a pair while
// another receives on it. Control-channel methods serialise on a separate
// lock. Close, Reattach and SetTxLayout must not run concurrently with
// data-path calls. Counters are atomic and may be read at any time.
//
// Kick and call eventfds are created EFD_NONBLOCK|EFD_CLOEXEC, as QEMU's
// are; O_NONBLOCK is shared with the backend's received copies.
//
// Only little-endian hosts are supported (the vhostuser package refuses to
// build elsewhere).
package frontend

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// DefaultFeatures is what the "driver" asks for when Config.Features is 0:
// what a modern Linux virtio-net driver with multiqueue typically acks.
const DefaultFeatures uint64 = 1<<virtio.FVersion1 | 1<<virtio.NetFMrgRxbuf |
	1<<virtio.FEventIdx | 1<<virtio.FIndirectDesc | 1<<virtio.NetFMQ |
	1<<virtio.NetFCtrlVQ | 1<<virtio.NetFMAC | 1<<virtio.NetFStatus

// NoFeatures, as Config.Features, requests no virtio features at all (bit 30
// is managed by the frontend itself, so it doubles as the "none" marker).
const NoFeatures uint64 = 1 << vhostuser.FeatureProtocolFeatures

// DefaultProtocolFeatures is what the frontend asks for when
// Config.ProtocolFeatures is 0.
const DefaultProtocolFeatures uint64 = 1<<vhostuser.ProtoMQ | 1<<vhostuser.ProtoReplyAck | 1<<vhostuser.ProtoStatus

// NoProtocolFeatures, as Config.ProtocolFeatures, requests none (bit 63 is
// not a protocol feature).
const NoProtocolFeatures uint64 = 1 << 63

// TxLayout says how Send lays out the virtio-net header and the frame.
type TxLayout int

const (
	// TxSeparate puts the header and the frame in two descriptors (Linux).
	TxSeparate TxLayout = iota
	// TxContiguous puts header+frame in a single descriptor (ANY_LAYOUT style).
	TxContiguous
	// TxSplitHeader splits the header itself across two descriptors, then
	// the frame in a third (CVE-2022-2132 style input).
	TxSplitHeader
)

// Config configures a Frontend. Zero values select the documented defaults.
type Config struct {
	QueuePairs int    // pairs to set up (vrings rx=2i, tx=2i+1); default 1
	QueueSize  int    // ring size, power of 2 in [2, 32768]; default 256
	MemSize    int    // guest memory bytes; default max(32 MiB, what the layout needs); an explicit value too small is an error
	Regions    int    // describe guest memory as this many regions; default 1 (max 8 for SET_MEM_TABLE)
	Features   uint64 // virtio features wanted; acked = wanted & offered, plus bit 30 if offered. 0 = DefaultFeatures, NoFeatures = none
	// ProtocolFeatures wanted; acked = wanted & offered. 0 =
	// DefaultProtocolFeatures, NoProtocolFeatures = none.
	ProtocolFeatures uint64
	EnablePairs      int    // pairs enabled with SET_VRING_ENABLE(1), the rest get (0); 0 = QueuePairs, negative = none
	RxBufSize        int    // bytes per posted RX buffer (one descriptor each); default 2048. Small values force mergeable spanning
	TxBufSize        int    // largest frame Send accepts; default 2048
	GPABase          uint64 // guest-physical address of offset 0; default 0x100000 (non-zero on purpose)
	TxLayout         TxLayout
	TxIndirect       bool          // put TX chains in an indirect table (needs INDIRECT_DESC negotiated)
	UseMemSlots      bool          // with CONFIGURE_MEM_SLOTS negotiated, set up memory with ADD_MEM_REG instead of SET_MEM_TABLE
	NoRxPrefill      bool          // don't post RX buffers during setup; the first Recv (or Refill) posts them
	RxPoll           bool          // Recv and WaitTx poll the used ring instead of sleeping on the call eventfd
	ReplyTimeout     time.Duration // how long to wait for a control reply; default 5s
	// UnsealedMemory leaves guest memory unsealed, as a hugetlbfs-backed
	// or hostile frontend does: ShrinkMemory can then take it back.
	UnsealedMemory bool
}

func (c Config) withDefaults() (Config, error) {
	if c.QueuePairs == 0 {
		c.QueuePairs = 1
	}
	if c.QueuePairs < 0 || c.QueuePairs > vhostuser.MaxQueuePairs {
		return c, fmt.Errorf("frontend: QueuePairs %d out of range 1..%d", c.QueuePairs, vhostuser.MaxQueuePairs)
	}
	if c.QueueSize == 0 {
		c.QueueSize = 256
	}
	if c.QueueSize < 2 || c.QueueSize > virtio.MaxQueueSize || c.QueueSize&(c.QueueSize-1) != 0 {
		return c, fmt.Errorf("frontend: QueueSize %d is not a power of 2 in [2, %d]", c.QueueSize, virtio.MaxQueueSize)
	}
	if c.Regions == 0 {
		c.Regions = 1
	}
	if c.Regions < 0 {
		return c, fmt.Errorf("frontend: Regions %d < 0", c.Regions)
	}
	if c.Features == 0 {
		c.Features = DefaultFeatures
	}
	if c.ProtocolFeatures == 0 {
		c.ProtocolFeatures = DefaultProtocolFeatures
	}
	c.ProtocolFeatures &^= NoProtocolFeatures
	if c.EnablePairs == 0 {
		c.EnablePairs = c.QueuePairs
	}
	if c.RxBufSize == 0 {
		c.RxBufSize = 2048
	}
	if c.TxBufSize == 0 {
		c.TxBufSize = 2048
	}
	if c.RxBufSize < 1 || c.TxBufSize < 1 {
		return c, fmt.Errorf("frontend: RxBufSize/TxBufSize must be positive")
	}
	if c.GPABase == 0 {
		c.GPABase = 0x100000
	}
	if c.ReplyTimeout == 0 {
		c.ReplyTimeout = 5 * time.Second
	}
	return c, nil
}

// Info records what was negotiated, for tests to assert.
type Info struct {
	OfferedFeatures         uint64 // GET_FEATURES reply
	Features                uint64 // sent with SET_FEATURES
	OfferedProtocolFeatures uint64 // GET_PROTOCOL_FEATURES reply (0 if bit 30 not offered)
	ProtocolFeatures        uint64 // sent with SET_PROTOCOL_FEATURES
	QueueNum                uint64 // GET_QUEUE_NUM reply (queue pairs), 0 if MQ not negotiated
	MaxMemSlots             uint64 // GET_MAX_MEM_SLOTS reply, 0 if not asked
	HdrLen                  int    // virtio-net header size in use: 12, or 10 for a legacy driver without MRG_RXBUF
}

// HasFeature reports whether virtio feature bit was acked.
func (i Info) HasFeature(bit uint) bool { return i.Features&(1<<bit) != 0 }

// HasProtocolFeature reports whether protocol feature bit was acked.
func (i Info) HasProtocolFeature(bit uint) bool { return i.ProtocolFeatures&(1<<bit) != 0 }

// NackError is a non-zero REPLY_ACK.
type NackError struct {
	Request vhostuser.Request
	Status  uint64
}

func (e *NackError) Error() string {
	return fmt.Sprintf("frontend: backend rejected %s (REPLY_ACK status %d)", e.Request, e.Status)
}

// Errors returned by the data path.
var (
	ErrRingFull     = errors.New("frontend: no free descriptors")
	ErrTimeout      = errors.New("frontend: timed out")
	ErrFrameTooBig  = errors.New("frontend: frame larger than TxBufSize")
	ErrBadUsed      = errors.New("frontend: backend published an invalid used-ring entry")
	ErrClosed       = errors.New("frontend: closed")
	ErrNotSupported = errors.New("frontend: feature not negotiated")
)

// Frontend is one vhost-user connection plus its guest memory and vrings.
type Frontend struct {
	cfg Config

	ctl      sync.Mutex // serialises control messages
	sock     *net.UnixConn
	conn     *vhostuser.Conn
	info     Info
	replyAck bool
	regions  []vhostuser.MemRegion

	// Negotiated data-path features, fixed after setup.
	eventIdx, mrg, indirect bool
	inOrder                 bool // VIRTIO_F_IN_ORDER: every used entry is checked to follow avail order (outOfOrder)
	hdrLen                  int

	memfd int
	mem   []byte
	base  uintptr // user virtual address of mem[0]
	rings []*vring

	allocMu               sync.Mutex
	scratchOff, scratchHi int

	closed atomic.Bool
}

// Dial connects to a backend listening on path (backend "server" role) and
// runs the setup.
func Dial(path string, cfg Config) (*Frontend, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("frontend: dial %s: %w", path, err)
	}
	return New(c, cfg)
}

// New runs the full setup on an established connection. It takes ownership
// of c: c is closed if setup fails, and by Close.
func New(c *net.UnixConn, cfg Config) (*Frontend, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		c.Close()
		return nil, err
	}
	f := &Frontend{cfg: cfg, sock: c, conn: vhostuser.NewConn(c), memfd: -1}
	if err := f.allocMemory(); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.setup(nil); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Listener is a frontend listening on a socket (QEMU server=on); the backend
// dials it (backend "client" role).
type Listener struct {
	l *net.UnixListener
}

// Listen listens on path; Close removes the socket file.
func Listen(path string) (*Listener, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("frontend: listen %s: %w", path, err)
	}
	return &Listener{l: l}, nil
}

// AcceptConn waits up to timeout for the backend to connect.
func (l *Listener) AcceptConn(timeout time.Duration) (*net.UnixConn, error) {
	if timeout > 0 {
		l.l.SetDeadline(time.Now().Add(timeout))
		defer l.l.SetDeadline(time.Time{})
	}
	c, err := l.l.AcceptUnix()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("frontend: accept: %w", ErrTimeout)
		}
		return nil, fmt.Errorf("frontend: accept: %w", err)
	}
	return c, nil
}

// Accept waits up to timeout for the backend to connect, then runs New.
func (l *Listener) Accept(cfg Config, timeout time.Duration) (*Frontend, error) {
	c, err := l.AcceptConn(timeout)
	if err != nil {
		return nil, err
	}
	return New(c, cfg)
}

// Close stops listening and removes the socket file.
func (l *Listener) Close() error { return l.l.Close() }

// Addr is the socket path.
func (l *Listener) Addr() string { return l.l.Addr().String() }

// SetTxLayout changes how later Sends lay out chains. Not safe concurrently
// with Send on any pair.
func (f *Frontend) SetTxLayout(layout TxLayout, indirect bool) error {
	if indirect && !f.indirect {
		return fmt.Errorf("frontend: TxIndirect: %w (INDIRECT_DESC)", ErrNotSupported)
	}
	f.cfg.TxLayout, f.cfg.TxIndirect = layout, indirect
	return nil
}

// Info returns what was negotiated.
func (f *Frontend) Info() Info {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	return f.info
}

// Config returns the effective configuration (defaults filled in).
func (f *Frontend) Config() Config { return f.cfg }

// Conn is the raw control channel, for adversarial tests. Don't use it while
// another control method runs.
func (f *Frontend) Conn() *vhostuser.Conn { return f.conn }

// Close closes the socket and eventfds and unmaps guest memory. The backend
// side keeps its own mapping and fds. Mem() must not be used afterwards.
func (f *Frontend) Close() error {
	if f.closed.Swap(true) {
		return nil
	}
	f.ctl.Lock()
	defer f.ctl.Unlock()
	if f.sock != nil {
		f.sock.Close()
	}
	for _, r := range f.rings {
		r.mu.Lock()
		unix.Close(r.kickFD)
		unix.Close(r.callFD)
		r.kickFD, r.callFD = -1, -1
		r.mu.Unlock()
	}
	if f.mem != nil {
		unix.Munmap(f.mem)
		f.mem = nil
	}
	if f.memfd >= 0 {
		unix.Close(f.memfd)
		f.memfd = -1
	}
	return nil
}

// Reattach replaces the control connection (after a backend restart or
// reconnect) and re-runs the setup on it with the same guest memory, rings
// and eventfds. Like QEMU after losing a backend, each vring's
// SET_VRING_BASE is the used idx currently in guest memory, so chains the
// old backend fetched but never completed are offered again. It must not run
// concurrently with data-path calls. c is owned as in New.
func (f *Frontend) Reattach(c *net.UnixConn) error {
	if f.closed.Load() {
		c.Close()
		return ErrClosed
	}
	f.ctl.Lock()
	old := f.sock
	f.sock, f.conn = c, vhostuser.NewConn(c)
	f.ctl.Unlock()
	old.Close()
	bases := make([]uint16, len(f.rings))
	for i, r := range f.rings {
		bases[i] = f.usedIdx(r)
	}
	return f.setup(bases)
}

// ---- control messages ----

// ctrl sends a setting message, asking for a REPLY_ACK when negotiated.
// Callers hold f.ctl.
func (f *Frontend) ctrl(req vhostuser.Request, payload []byte, fds []int) error {
	var flags uint32
	if f.replyAck {
		flags = vhostuser.FlagNeedReply
	}
	if err := f.conn.WriteMessage(req, flags, payload, fds); err != nil {
		return err
	}
	if !f.replyAck {
		return nil
	}
	p, err := f.readReply(req)
	if err != nil {
		return err
	}
	if len(p) != vhostuser.U64Size {
		return fmt.Errorf("frontend: %s REPLY_ACK payload is %d bytes, want 8", req, len(p))
	}
	if st := leU64(p); st != 0 {
		return &NackError{Request: req, Status: st}
	}
	return nil
}

// get sends a request whose reply is mandatory and returns its payload.
func (f *Frontend) get(req vhostuser.Request, payload []byte) ([]byte, error) {
	if err := f.conn.WriteMessage(req, 0, payload, nil); err != nil {
		return nil, err
	}
	return f.readReply(req)
}

func (f *Frontend) getU64(req vhostuser.Request) (uint64, error) {
	p, err := f.get(req, nil)
	if err != nil {
		return 0, err
	}
	if len(p) != vhostuser.U64Size {
		return 0, fmt.Errorf("frontend: %s reply payload is %d bytes, want 8", req, len(p))
	}
	return leU64(p), nil
}

// readReply reads one reply to req and returns a copy of its payload; any
// fds it carries are closed.
func (f *Frontend) readReply(req vhostuser.Request) ([]byte, error) {
	f.sock.SetReadDeadline(time.Now().Add(f.cfg.ReplyTimeout))
	defer f.sock.SetReadDeadline(time.Time{})
	m, err := f.conn.ReadReply()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("frontend: waiting for %s reply: %w", req, ErrTimeout)
		}
		return nil, fmt.Errorf("frontend: waiting for %s reply: %w", req, err)
	}
	m.CloseFDs()
	if m.Request != req {
		return nil, fmt.Errorf("frontend: sent %s, got reply for %s", req, m.Request)
	}
	if m.Flags&vhostuser.FlagReply == 0 {
		return nil, fmt.Errorf("frontend: %s reply lacks the REPLY flag (flags %#x)", req, m.Flags)
	}
	return bytes.Clone(m.Payload), nil
}

// Ctrl sends an arbitrary setting message (NEED_REPLY added and the ack
// checked when REPLY_ACK is negotiated). fds are not closed.
func (f *Frontend) Ctrl(req vhostuser.Request, payload []byte, fds []int) error {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	return f.ctrl(req, payload, fds)
}

// CtrlGet sends an arbitrary request whose reply is mandatory and returns the
// reply payload (fds in the reply are closed).
func (f *Frontend) CtrlGet(req vhostuser.Request, payload []byte) ([]byte, error) {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	return f.get(req, payload)
}

// SetLogBase sends SET_LOG_BASE with the dirty log's fd (LOG_SHMFD), as
// QEMU does when a migration starts, and waits for the backend's reply:
// an empty one, or with REPLY_ACK a NACK (a refused log). fd is not closed.
func (f *Frontend) SetLogBase(fd int, size, offset uint64) error {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	var flags uint32
	if f.replyAck {
		flags = vhostuser.FlagNeedReply
	}
	req := vhostuser.ReqSetLogBase
	if err := f.conn.WriteMessage(req, flags, vhostuser.LogDesc{Size: size, Offset: offset}.Encode(nil), []int{fd}); err != nil {
		return err
	}
	p, err := f.readReply(req)
	if err != nil {
		return err
	}
	if len(p) == vhostuser.U64Size && leU64(p) != 0 {
		return &NackError{Request: req, Status: leU64(p)}
	}
	return nil
}

// SetVringEnable sends SET_VRING_ENABLE.
func (f *Frontend) SetVringEnable(vring int, on bool) error {
	if vring < 0 || vring >= len(f.rings) {
		return fmt.Errorf("frontend: vring %d out of range", vring)
	}
	var n uint32
	if on {
		n = 1
	}
	return f.Ctrl(vhostuser.ReqSetVringEnable, vhostuser.VringState{Index: uint32(vring), Num: n}.Encode(nil), nil)
}

// SetPairsEnabled enables pairs [0, n) and disables the rest, as QEMU does
// for a guest VQ_PAIRS_SET.
func (f *Frontend) SetPairsEnabled(n int) error {
	for i := range f.rings {
		if err := f.SetVringEnable(i, i/2 < n); err != nil {
			return err
		}
	}
	return nil
}

// GetVringBase sends GET_VRING_BASE, which stops the ring on the backend, and
// returns the backend's next avail index.
func (f *Frontend) GetVringBase(vring int) (uint32, error) {
	p, err := f.CtrlGet(vhostuser.ReqGetVringBase, vhostuser.VringState{Index: uint32(vring)}.Encode(nil))
	if err != nil {
		return 0, err
	}
	st, err := vhostuser.DecodeVringState(p)
	if err != nil {
		return 0, fmt.Errorf("frontend: GET_VRING_BASE reply: %w", err)
	}
	if st.Index != uint32(vring) {
		return 0, fmt.Errorf("frontend: GET_VRING_BASE for vring %d answered for vring %d", vring, st.Index)
	}
	return st.Num, nil
}

// StopPair does what QEMU does when it stops one queue pair's vhost_dev
// (vhost_net_stop_one): GET_VRING_BASE on its RX and TX vring, which stops
// them on the backend. It returns the two bases, for StartPair. The driver
// side carries on meanwhile, as a guest does: it knows nothing of it.
func (f *Frontend) StopPair(pair int) (rxBase, txBase uint16, err error) {
	if pair < 0 || 2*pair+1 >= len(f.rings) {
		return 0, 0, fmt.Errorf("frontend: pair %d out of range", pair)
	}
	rb, err := f.GetVringBase(2 * pair)
	if err != nil {
		return 0, 0, err
	}
	tb, err := f.GetVringBase(2*pair + 1)
	if err != nil {
		return 0, 0, err
	}
	return uint16(rb), uint16(tb), nil
}

// StartPair does what QEMU does when it starts one queue pair's vhost_dev
// (vhost_net_start_one, vhost_dev_start): SET_FEATURES, the memory table
// again (SET_MEM_TABLE, or ADD_MEM_REG per region with UseMemSlots), then
// per vring SET_VRING_NUM, SET_VRING_BASE (the given base), SET_VRING_ADDR,
// SET_VRING_KICK and SET_VRING_CALL with the same eventfds, then
// SET_VRING_ENABLE. Same rings, same guest memory.
func (f *Frontend) StartPair(pair int, rxBase, txBase uint16, enable bool) error {
	if pair < 0 || 2*pair+1 >= len(f.rings) {
		return fmt.Errorf("frontend: pair %d out of range", pair)
	}
	f.ctl.Lock()
	defer f.ctl.Unlock()
	if err := f.ctrl(vhostuser.ReqSetFeatures, vhostuser.EncodeU64(nil, f.info.Features), nil); err != nil {
		return err
	}
	if f.cfg.UseMemSlots && f.info.HasProtocolFeature(vhostuser.ProtoConfigureMemSlots) {
		for _, r := range f.regions {
			if err := f.ctrl(vhostuser.ReqAddMemReg, vhostuser.EncodeSingleRegion(nil, r), []int{f.memfd}); err != nil {
				return err
			}
		}
	} else if err := f.setMemTable(append([]vhostuser.MemRegion(nil), f.regions...)); err != nil {
		return err
	}
	for k, base := range []uint16{rxBase, txBase} {
		r, idx := f.rings[2*pair+k], uint32(2*pair+k)
		steps := []struct {
			req     vhostuser.Request
			payload []byte
			fds     []int
		}{
			{vhostuser.ReqSetVringNum, vhostuser.VringState{Index: idx, Num: uint32(r.n)}.Encode(nil), nil},
			{vhostuser.ReqSetVringBase, vhostuser.VringState{Index: idx, Num: uint32(base)}.Encode(nil), nil},
			{vhostuser.ReqSetVringAddr, vhostuser.VringAddr{Index: idx, Desc: uint64(f.base) + uint64(r.descOff),
				Used: uint64(f.base) + uint64(r.usedOff), Avail: uint64(f.base) + uint64(r.availOff)}.Encode(nil), nil},
			{vhostuser.ReqSetVringKick, vhostuser.EncodeU64(nil, uint64(idx)), []int{r.kickFD}},
			{vhostuser.ReqSetVringCall, vhostuser.EncodeU64(nil, uint64(idx)), []int{r.callFD}},
		}
		for _, st := range steps {
			if err := f.ctrl(st.req, st.payload, st.fds); err != nil {
				return err
			}
		}
	}
	if f.info.Features&(1<<vhostuser.FeatureProtocolFeatures) == 0 {
		return nil
	}
	var on uint32
	if enable {
		on = 1
	}
	for _, idx := range []uint32{uint32(2 * pair), uint32(2*pair + 1)} {
		if err := f.ctrl(vhostuser.ReqSetVringEnable, vhostuser.VringState{Index: idx, Num: on}.Encode(nil), nil); err != nil {
			return err
		}
	}
	return nil
}

// SetStatus sends SET_STATUS (needs the STATUS protocol feature).
func (f *Frontend) SetStatus(status uint64) error {
	return f.Ctrl(vhostuser.ReqSetStatus, vhostuser.EncodeU64(nil, status), nil)
}

// RegionsFor describes the whole guest memory as n regions of (nearly) equal
// page-aligned size, at increasing mmap offsets of the one memfd.
func (f *Frontend) RegionsFor(n int) ([]vhostuser.MemRegion, error) {
	pages := len(f.mem) / pageSize
	if n < 1 || n > pages {
		return nil, fmt.Errorf("frontend: cannot split %d pages into %d regions", pages, n)
	}
	regs := make([]vhostuser.MemRegion, 0, n)
	off := 0
	for i := range n {
		sz := (pages / n) * pageSize
		if i == n-1 {
			sz = len(f.mem) - off
		}
		regs = append(regs, vhostuser.MemRegion{
			GuestPhysAddr: f.cfg.GPABase + uint64(off),
			Size:          uint64(sz),
			UserAddr:      uint64(f.base) + uint64(off),
			MmapOffset:    uint64(off),
		})
		off += sz
	}
	return regs, nil
}

// Regions is the memory table last sent.
func (f *Frontend) Regions() []vhostuser.MemRegion {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	return append([]vhostuser.MemRegion(nil), f.regions...)
}

// SetMemTable re-sends SET_MEM_TABLE describing the same memory as n
// regions (a "memory-table change", legal under traffic).
func (f *Frontend) SetMemTable(n int) error {
	regs, err := f.RegionsFor(n)
	if err != nil {
		return err
	}
	return f.SetMemTableRegions(regs)
}

// SetMemTableRegions sends SET_MEM_TABLE with arbitrary regions, attaching
// the memfd once per region. Regions need not describe real memory.
func (f *Frontend) SetMemTableRegions(regs []vhostuser.MemRegion) error {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	return f.setMemTable(regs)
}

func (f *Frontend) setMemTable(regs []vhostuser.MemRegion) error {
	fds := make([]int, len(regs))
	for i := range fds {
		fds[i] = f.memfd
	}
	if err := f.ctrl(vhostuser.ReqSetMemTable, vhostuser.EncodeMemTable(nil, regs), fds); err != nil {
		return err
	}
	f.regions = append(f.regions[:0], regs...)
	return nil
}

// AddMemRegion sends ADD_MEM_REG with the memfd (needs CONFIGURE_MEM_SLOTS).
func (f *Frontend) AddMemRegion(r vhostuser.MemRegion) error {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	if !f.info.HasProtocolFeature(vhostuser.ProtoConfigureMemSlots) {
		return fmt.Errorf("frontend: ADD_MEM_REG: %w (CONFIGURE_MEM_SLOTS)", ErrNotSupported)
	}
	if err := f.ctrl(vhostuser.ReqAddMemReg, vhostuser.EncodeSingleRegion(nil, r), []int{f.memfd}); err != nil {
		return err
	}
	f.regions = append(f.regions, r)
	return nil
}

// RemMemRegion sends REM_MEM_REG without an fd (needs CONFIGURE_MEM_SLOTS).
func (f *Frontend) RemMemRegion(r vhostuser.MemRegion) error {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	if !f.info.HasProtocolFeature(vhostuser.ProtoConfigureMemSlots) {
		return fmt.Errorf("frontend: REM_MEM_REG: %w (CONFIGURE_MEM_SLOTS)", ErrNotSupported)
	}
	if err := f.ctrl(vhostuser.ReqRemMemReg, vhostuser.EncodeSingleRegion(nil, r), nil); err != nil {
		return err
	}
	for i, x := range f.regions {
		if x.GuestPhysAddr == r.GuestPhysAddr && x.Size == r.Size {
			f.regions = append(f.regions[:i], f.regions[i+1:]...)
			break
		}
	}
	return nil
}

// ---- setup ----

// setup runs the negotiation and vring setup. bases (nil = all 0) are the
// SET_VRING_BASE values.
func (f *Frontend) setup(bases []uint16) error {
	f.ctl.Lock()
	defer f.ctl.Unlock()
	cfg := f.cfg
	f.replyAck = false
	f.info = Info{}

	if err := f.conn.WriteMessage(vhostuser.ReqSetOwner, 0, nil, nil); err != nil {
		return err
	}
	offered, err := f.getU64(vhostuser.ReqGetFeatures)
	if err != nil {
		return err
	}
	f.info.OfferedFeatures = offered
	const protoBit = uint64(1) << vhostuser.FeatureProtocolFeatures
	if offered&protoBit != 0 {
		pOffered, err := f.getU64(vhostuser.ReqGetProtocolFeatures)
		if err != nil {
			return err
		}
		f.info.OfferedProtocolFeatures = pOffered
		acked := cfg.ProtocolFeatures & pOffered
		if err := f.conn.WriteMessage(vhostuser.ReqSetProtocolFeatures, 0, vhostuser.EncodeU64(nil, acked), nil); err != nil {
			return err
		}
		f.info.ProtocolFeatures = acked
		f.replyAck = acked&(1<<vhostuser.ProtoReplyAck) != 0
	}
	if f.info.HasProtocolFeature(vhostuser.ProtoMQ) {
		qn, err := f.getU64(vhostuser.ReqGetQueueNum)
		if err != nil {
			return err
		}
		f.info.QueueNum = qn
		if qn < uint64(cfg.QueuePairs) {
			return fmt.Errorf("frontend: asking for %d queue pairs, backend supports %d", cfg.QueuePairs, qn)
		}
	} else if cfg.QueuePairs > 1 {
		return fmt.Errorf("frontend: asking for %d queue pairs but the MQ protocol feature was not negotiated", cfg.QueuePairs)
	}
	useSlots := cfg.UseMemSlots && f.info.HasProtocolFeature(vhostuser.ProtoConfigureMemSlots)
	if useSlots {
		ms, err := f.getU64(vhostuser.ReqGetMaxMemSlots)
		if err != nil {
			return err
		}
		f.info.MaxMemSlots = ms
		if ms < uint64(cfg.Regions) {
			return fmt.Errorf("frontend: %d regions but backend has %d memory slots", cfg.Regions, ms)
		}
	}

	feats := cfg.Features &^ protoBit & offered
	feats |= offered & protoBit
	if err := f.ctrl(vhostuser.ReqSetFeatures, vhostuser.EncodeU64(nil, feats), nil); err != nil {
		return err
	}
	f.info.Features = feats
	f.eventIdx = f.info.HasFeature(virtio.FEventIdx)
	f.inOrder = f.info.HasFeature(virtio.FInOrder)
	f.mrg = f.info.HasFeature(virtio.NetFMrgRxbuf)
	f.indirect = f.info.HasFeature(virtio.FIndirectDesc)
	f.hdrLen = virtio.NetHdrLegacySize
	if f.mrg || f.info.HasFeature(virtio.FVersion1) {
		f.hdrLen = virtio.NetHdrSize
	}
	f.info.HdrLen = f.hdrLen
	if cfg.TxIndirect && !f.indirect {
		return fmt.Errorf("frontend: TxIndirect: %w (INDIRECT_DESC not offered)", ErrNotSupported)
	}
	status := f.info.HasProtocolFeature(vhostuser.ProtoStatus)
	const preOK = virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK
	if status {
		if err := f.ctrl(vhostuser.ReqSetStatus, vhostuser.EncodeU64(nil, preOK), nil); err != nil {
			return err
		}
	}

	regs, err := f.RegionsFor(cfg.Regions)
	if err != nil {
		return err
	}
	if useSlots {
		f.regions = f.regions[:0]
		for _, r := range regs {
			if err := f.ctrl(vhostuser.ReqAddMemReg, vhostuser.EncodeSingleRegion(nil, r), []int{f.memfd}); err != nil {
				return err
			}
			f.regions = append(f.regions, r)
		}
	} else if err := f.setMemTable(regs); err != nil {
		return err
	}

	if bases == nil {
		f.initRingState()
	}
	for i, r := range f.rings {
		var base uint16
		if bases != nil {
			base = bases[i]
		}
		idx := uint32(i)
		if err := f.ctrl(vhostuser.ReqSetVringNum, vhostuser.VringState{Index: idx, Num: uint32(r.n)}.Encode(nil), nil); err != nil {
			return err
		}
		if err := f.ctrl(vhostuser.ReqSetVringBase, vhostuser.VringState{Index: idx, Num: uint32(base)}.Encode(nil), nil); err != nil {
			return err
		}
		addr := vhostuser.VringAddr{
			Index: idx,
			Desc:  uint64(f.base) + uint64(r.descOff),
			Used:  uint64(f.base) + uint64(r.usedOff),
			Avail: uint64(f.base) + uint64(r.availOff),
		}
		if err := f.ctrl(vhostuser.ReqSetVringAddr, addr.Encode(nil), nil); err != nil {
			return err
		}
		if err := f.ctrl(vhostuser.ReqSetVringKick, vhostuser.EncodeU64(nil, uint64(idx)), []int{r.kickFD}); err != nil {
			return err
		}
		if err := f.ctrl(vhostuser.ReqSetVringCall, vhostuser.EncodeU64(nil, uint64(idx)), []int{r.callFD}); err != nil {
			return err
		}
	}
	if feats&protoBit != 0 {
		for i := range f.rings {
			var on uint32
			if i/2 < cfg.EnablePairs {
				on = 1
			}
			if err := f.ctrl(vhostuser.ReqSetVringEnable, vhostuser.VringState{Index: uint32(i), Num: on}.Encode(nil), nil); err != nil {
				return err
			}
		}
	}
	if status {
		if err := f.ctrl(vhostuser.ReqSetStatus, vhostuser.EncodeU64(nil, preOK|virtio.StatusDriverOK), nil); err != nil {
			return err
		}
	}
	// The driver is live: post RX buffers and kick, as a guest does after
	// DRIVER_OK. On Reattach re-kick every ring that has pending buffers.
	for _, r := range f.rings {
		r.mu.Lock()
		var err error
		if r.rx && !cfg.NoRxPrefill && bases == nil {
			err = f.refill(r)
		} else if bases != nil && r.availIdx != f.usedIdx(r) {
			err = f.kick(r)
		}
		r.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// ---- guest memory ----

const pageSize = 4096

func alignUp(x, a int) int { return (x + a - 1) &^ (a - 1) }

func (f *Frontend) allocMemory() error {
	cfg := f.cfg
	n := cfg.QueueSize
	off := 0
	f.rings = make([]*vring, 2*cfg.QueuePairs)
	for i := range f.rings {
		r := &vring{index: i, n: n, mask: uint16(n - 1), rx: i%2 == 0, kickFD: -1, callFD: -1}
		off = alignUp(off, pageSize)
		r.descOff = off
		off += virtio.DescSize * n
		off = alignUp(off, pageSize)
		r.availOff = off
		off += virtio.AvailRingSize(n) + 2 // +2: used_event may be accessed as a 32-bit word
		off = alignUp(off, pageSize)
		r.usedOff = off
		off += virtio.UsedRingSize(n) + 2 // +2: avail_event is loaded as a 32-bit word
		f.rings[i] = r
	}
	for _, r := range f.rings {
		off = alignUp(off, 64)
		r.bufOff = off
		if r.rx {
			r.bufSize = cfg.RxBufSize
		} else {
			r.bufSize = alignUp(txSlotData+cfg.TxBufSize, 64)
		}
		off += r.bufSize * n
	}
	off = alignUp(off, pageSize)
	need := off + 64<<10 // leave some scratch space for Alloc
	size := cfg.MemSize
	if size == 0 {
		size = max(32<<20, alignUp(need+(1<<20), 2<<20))
	}
	size = alignUp(size, pageSize)
	if size < need {
		return fmt.Errorf("frontend: MemSize %d too small, the ring layout needs %d", cfg.MemSize, need)
	}
	f.cfg.MemSize = size
	f.scratchOff, f.scratchHi = off, size

	fd, err := unix.MemfdCreate("vhostmq-frontend", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return fmt.Errorf("frontend: memfd_create: %w", err)
	}
	f.memfd = fd
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fmt.Errorf("frontend: ftruncate memfd: %w", err)
	}
	// Like QEMU's memory-backend-memfd seal=on: the size can no longer change.
	if !f.cfg.UnsealedMemory {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			return fmt.Errorf("frontend: sealing memfd: %w", err)
		}
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("frontend: mmap guest memory: %w", err)
	}
	f.mem = mem
	f.base = uintptr(unsafe.Pointer(&mem[0]))
	for _, r := range f.rings {
		if r.kickFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			return fmt.Errorf("frontend: eventfd: %w", err)
		}
		if r.callFD, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			return fmt.Errorf("frontend: eventfd: %w", err)
		}
	}
	return nil
}

// ShrinkMemory takes guest memory back as a hostile frontend can: the
// memfd is cut to size bytes, and every page past that is gone for the
// backend too (its next access faults). Refused when the memory is sealed
// (Config.UnsealedMemory is false). The frontend itself must not touch
// that memory afterwards: only Close is safe then.
func (f *Frontend) ShrinkMemory(size int) error {
	if err := unix.Ftruncate(f.memfd, int64(size)); err != nil {
		return fmt.Errorf("frontend: shrinking guest memory to %d bytes: %w", size, err)
	}
	return nil
}

// Mem is the guest memory as mapped by the frontend (offset 0 = GPABase).
func (f *Frontend) Mem() []byte { return f.mem }

// GPA is the guest-physical address of memory offset off.
func (f *Frontend) GPA(off int) uint64 { return f.cfg.GPABase + uint64(off) }

// Off translates a guest-physical range to a memory offset.
func (f *Frontend) Off(gpa uint64, length int) (int, bool) {
	if gpa < f.cfg.GPABase || length < 0 {
		return 0, false
	}
	o := gpa - f.cfg.GPABase
	if o > uint64(len(f.mem)) || uint64(len(f.mem))-o < uint64(length) {
		return 0, false
	}
	return int(o), true
}

// UserAddr is the frontend user virtual address of memory offset off (the
// address space of SET_VRING_ADDR and MemRegion.UserAddr).
func (f *Frontend) UserAddr(off int) uint64 { return uint64(f.base) + uint64(off) }

// Alloc reserves size bytes of guest memory aligned to align (a power of 2,
// ≥1) for custom buffers or indirect tables, and returns the offset. It is a
// bump allocator; memory is never freed.
func (f *Frontend) Alloc(size, align int) (int, error) {
	if align < 1 || align&(align-1) != 0 || size < 0 {
		return 0, fmt.Errorf("frontend: Alloc(%d, %d): bad arguments", size, align)
	}
	f.allocMu.Lock()
	defer f.allocMu.Unlock()
	off := alignUp(f.scratchOff, align)
	if off+size > f.scratchHi {
		return 0, fmt.Errorf("frontend: Alloc(%d): guest memory exhausted", size)
	}
	f.scratchOff = off + size
	return off, nil
}

func leU64(p []byte) uint64 { return binary.LittleEndian.Uint64(p) }
