package afxdp

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sizes of one socket. Every ring has ringSize entries; the UMEM has
// ringSize frames for receiving (all on the fill ring at first) and
// ringSize for sending, so a ring can never overflow: a frame is in
// exactly one place (fill ring, kernel, RX ring, our hands, TX ring,
// completion ring, free list) and each ring has room for all frames of its
// half.
const (
	// FrameSize is one UMEM chunk. The kernel puts a received frame
	// XDP_PACKET_HEADROOM (256) bytes into its chunk, so the largest frame
	// is FrameSize-256 bytes: an MTU of up to 3822 with a VLAN tag.
	FrameSize = 4096
	ringSize  = 1024
	rxFrames  = ringSize
	txFrames  = ringSize
	umemSize  = (rxFrames + txFrames) * FrameSize
	// MaxFrame is the longest frame a socket receives or sends.
	MaxFrame = FrameSize - unix.XDP_PACKET_HEADROOM
)

var errBadOffsets = errors.New("XDP_MMAP_OFFSETS: the kernel's ring offsets do not fit the mapping")

// Socket is one AF_XDP socket bound to one queue of a NIC, with a UMEM of
// its own. Receiving is for one goroutine (the queue's owner); sending
// may be shared by several, serialised by txMu when it is.
type Socket struct {
	fd       int
	queue    int
	zeroCopy bool
	umem     []byte
	rx, tx   descRing
	fill     addrRing
	comp     addrRing

	held []uint64 // RX chunks handed out by receive, back to the fill ring at releaseRX

	txMu   sync.Mutex
	freeTx []uint64 // free TX chunks
	cur    uint64   // the chunk handed out by txFrame; noChunk when none
	queued uint32   // TX descriptors written, not yet published

	// Counters of what the kernel gave us that we refused (should stay 0).
	RxInvalid, CompInvalid atomic.Uint64
	// KickErrors counts sendto kicks that failed for another reason than
	// "more to do" (EAGAIN) or "busy, try later" (EBUSY, ENOBUFS).
	KickErrors atomic.Uint64
}

const noChunk = ^uint64(0)

// openSocket creates a socket on (ifindex, queue) in zero-copy or copy mode.
func openSocket(ifindex, queue int, zeroCopy bool) (_ *Socket, err error) {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket(AF_XDP): %w", err)
	}
	s := &Socket{fd: fd, queue: queue, zeroCopy: zeroCopy, cur: noChunk,
		held: make([]uint64, 0, rxFrames), freeTx: make([]uint64, 0, txFrames)}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.umem, err = unix.Mmap(-1, 0, umemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("mmap UMEM (%d bytes): %w", umemSize, err)
	}
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(s.umem)))), Len: umemSize, Size: FrameSize}
	if err := setsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("XDP_UMEM_REG (%d bytes): %w (needs CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK)", umemSize, err)
		}
		return nil, fmt.Errorf("XDP_UMEM_REG: %w", err)
	}
	for _, o := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING, unix.XDP_TX_RING} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, o, ringSize); err != nil {
			return nil, fmt.Errorf("ring size (option %d): %w", o, err)
		}
	}
	var off unix.XDPMmapOffsets
	size := uint32(unsafe.Sizeof(off))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&size)), 0); e != 0 {
		return nil, fmt.Errorf("XDP_MMAP_OFFSETS: %w", e)
	}
	if size != uint32(unsafe.Sizeof(off)) {
		return nil, fmt.Errorf("XDP_MMAP_OFFSETS: %d bytes, want %d (a kernel older than 5.4?)", size, unsafe.Sizeof(off))
	}
	var p unsafe.Pointer
	if s.rx.ring, p, err = mapRing(fd, unix.XDP_PGOFF_RX_RING, off.Rx, ringSize, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
		return nil, fmt.Errorf("mmap RX ring: %w", err)
	}
	s.rx.descs = unsafe.Slice((*unix.XDPDesc)(p), ringSize)
	if s.tx.ring, p, err = mapRing(fd, unix.XDP_PGOFF_TX_RING, off.Tx, ringSize, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
		return nil, fmt.Errorf("mmap TX ring: %w", err)
	}
	s.tx.descs = unsafe.Slice((*unix.XDPDesc)(p), ringSize)
	if s.fill.ring, p, err = mapRing(fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, ringSize, 8); err != nil {
		return nil, fmt.Errorf("mmap fill ring: %w", err)
	}
	s.fill.addrs = unsafe.Slice((*uint64)(p), ringSize)
	if s.comp.ring, p, err = mapRing(fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, ringSize, 8); err != nil {
		return nil, fmt.Errorf("mmap completion ring: %w", err)
	}
	s.comp.addrs = unsafe.Slice((*uint64)(p), ringSize)

	for i := range uint64(rxFrames) {
		s.fill.addrs[s.fill.prod&s.fill.mask] = i * FrameSize
		s.fill.prod++
	}
	s.fill.publish()
	for i := range uint64(txFrames) {
		s.freeTx = append(s.freeTx, (rxFrames+i)*FrameSize)
	}

	flags := uint16(unix.XDP_USE_NEED_WAKEUP | unix.XDP_COPY)
	if zeroCopy {
		flags = unix.XDP_USE_NEED_WAKEUP | unix.XDP_ZEROCOPY
	}
	// A socket closed on this queue a moment ago releases it from a
	// kernel work item: EBUSY for a short while.
	sa := &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(ifindex), QueueID: uint32(queue)}
	err = unix.Bind(fd, sa)
	for deadline := time.Now().Add(time.Second); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		err = unix.Bind(fd, sa)
	}
	if err != nil {
		return nil, fmt.Errorf("bind queue %d: %w", queue, err)
	}
	return s, nil
}

func setsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), n, 0); e != 0 {
		return e
	}
	return nil
}

// FD is the socket, for the XSKMAP and for epoll (EPOLLIN: the RX ring
// has frames).
func (s *Socket) FD() int { return s.fd }

// Queue is the NIC queue the socket is bound to.
func (s *Socket) Queue() int { return s.queue }

// ZeroCopy reports whether the socket is bound in zero-copy mode.
func (s *Socket) ZeroCopy() bool { return s.zeroCopy }

// rxDesc checks a received descriptor: the frame must lie inside one RX
// chunk of the UMEM. It returns the chunk.
func rxDesc(d unix.XDPDesc) (chunk uint64, ok bool) {
	if d.Len == 0 || d.Len > FrameSize || d.Addr >= rxFrames*FrameSize {
		return 0, false
	}
	chunk = d.Addr &^ (FrameSize - 1)
	return chunk, d.Addr-chunk+uint64(d.Len) <= FrameSize
}

// receive appends up to len(frames) received frames (slices of the UMEM,
// valid until releaseRX) and returns how many.
func (s *Socket) receive(frames [][]byte) int {
	n := s.rx.ready(uint32(len(frames)))
	got := 0
	for range n {
		d := s.rx.descs[s.rx.cons&s.rx.mask] // one copy of the kernel's entry
		s.rx.cons++
		chunk, ok := rxDesc(d)
		if !ok || len(s.held) == cap(s.held) {
			s.RxInvalid.Add(1)
			continue
		}
		s.held = append(s.held, chunk)
		frames[got] = s.umem[d.Addr : d.Addr+uint64(d.Len) : d.Addr+uint64(d.Len)]
		got++
	}
	if n > 0 {
		s.rx.release()
	}
	return got
}

// releaseRX gives the chunks of the frames received since the last call
// back to the kernel, and wakes the driver if it asks for it.
func (s *Socket) releaseRX() {
	if len(s.held) == 0 {
		return
	}
	// Room is certain (the fill ring holds all RX chunks); check anyway.
	n := min(s.fill.free(uint32(len(s.held))), uint32(len(s.held)))
	for _, c := range s.held[:n] {
		s.fill.addrs[s.fill.prod&s.fill.mask] = c
		s.fill.prod++
	}
	s.held = s.held[:0]
	s.fill.publish()
	if s.fill.needWakeup() {
		unix.Syscall6(unix.SYS_RECVFROM, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	}
}

// reapCompletions moves sent chunks from the completion ring to the free
// list. Caller holds txMu when the socket's TX is shared.
func (s *Socket) reapCompletions() {
	n := s.comp.ready(ringSize)
	for range n {
		a := s.comp.addrs[s.comp.cons&s.comp.mask]
		s.comp.cons++
		if a < rxFrames*FrameSize || a >= umemSize || len(s.freeTx) == cap(s.freeTx) {
			s.CompInvalid.Add(1)
			continue
		}
		s.freeTx = append(s.freeTx, a&^(FrameSize-1))
	}
	if n > 0 {
		s.comp.release()
	}
}

// txFrame returns a free TX chunk to build a frame in, or nil when every
// chunk is in flight.
func (s *Socket) txFrame() []byte {
	if len(s.freeTx) == 0 {
		s.reapCompletions()
		if len(s.freeTx) == 0 {
			return nil
		}
	}
	a := s.freeTx[len(s.freeTx)-1]
	s.freeTx = s.freeTx[:len(s.freeTx)-1]
	s.cur = a
	return s.umem[a : a+FrameSize : a+FrameSize]
}

// txQueue puts the frame at [off, off+n) of the chunk from txFrame on the
// TX ring (published by flush); n == 0 gives the chunk back.
func (s *Socket) txQueue(off, n int) bool {
	a := s.cur
	if a == noChunk {
		return false
	}
	s.cur = noChunk
	if n <= 0 || off < 0 || off+n > FrameSize || s.tx.free(1) == 0 {
		s.freeTx = append(s.freeTx, a)
		return false
	}
	s.tx.descs[s.tx.prod&s.tx.mask] = unix.XDPDesc{Addr: a + uint64(off), Len: uint32(n)}
	s.tx.prod++
	s.queued++
	return true
}

// flush publishes the queued TX descriptors and kicks the kernel. In copy
// mode the kernel sends at most a budget of frames per kick and answers
// EAGAIN while more are left, so it kicks until the ring is empty (bounded).
func (s *Socket) flush() {
	if s.queued > 0 {
		s.tx.publish()
		s.queued = 0
	}
	for range ringSize/32 + 1 {
		if !s.tx.needWakeup() || atomic.LoadUint32(s.tx.consumer) == s.tx.prod {
			break
		}
		_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EAGAIN {
			continue
		}
		if e != 0 && e != unix.EBUSY && e != unix.ENOBUFS {
			s.KickErrors.Add(1)
		}
		break
	}
	s.reapCompletions()
}

// Stats returns the kernel's counters for the socket.
func (s *Socket) Stats() (unix.XDPStatistics, error) {
	var st unix.XDPStatistics
	size := uint32(unsafe.Sizeof(st))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), unix.SOL_XDP, unix.XDP_STATISTICS,
		uintptr(unsafe.Pointer(&st)), uintptr(unsafe.Pointer(&size)), 0); e != 0 {
		return st, e
	}
	return st, nil
}

// Close closes the socket (the kernel drops it from the XSKMAP) and unmaps
// its rings and UMEM.
func (s *Socket) Close() {
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
	s.rx.unmap()
	s.tx.unmap()
	s.fill.unmap()
	s.comp.unmap()
	s.rx.descs, s.tx.descs, s.fill.addrs, s.comp.addrs = nil, nil, nil, nil
	if s.umem != nil {
		unix.Munmap(s.umem)
		s.umem = nil
	}
}
