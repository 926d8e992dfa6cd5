package frontend

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Ring memory access and ordering.
//
// The rings live in MAP_SHARED memory that the backend (another process or
// goroutine) reads and writes concurrently. The orderings the virtio spec
// needs are:
//
//   - driver: descriptors and avail ring entries must be visible before the
//     avail idx that publishes them (release);
//   - driver: the used idx must be read before the used entries it covers
//     (acquire);
//   - driver: after publishing avail idx, the notification-suppression fields
//     (used.flags / avail_event) must be read after the store (store→load,
//     a full fence), and likewise used_event is written before the used idx
//     is re-checked prior to sleeping.
//
// Go has no 16-bit atomics, so indices are accessed through the aligned
// 32-bit word that holds them: the avail and used rings start 4-aligned (here
// page-aligned) with flags at offset 0 and idx at offset 2, so one word is
// flags | idx<<16. The frontend owns avail.flags and avail.idx and stores
// them together with atomic.StoreUint32; the backend owns used.flags and
// used.idx, which the frontend only loads with atomic.LoadUint32. used_event
// (avail ring) and avail_event (used ring) sit at a 2-aligned offset; they
// are accessed through the enclosing aligned word too. Writing used_event
// that way is a read-modify-write of a word whose other half is either
// frontend-owned avail ring or padding the layout reserves past the ring, so
// no backend write can be lost. Go's sync/atomic operations are sequentially
// consistent, which gives release, acquire and the store→load fence; plain
// stores before an atomic store (and plain loads after an atomic load) are
// not reordered across it by the compiler or, on amd64/arm64, by the CPU.

const (
	stFree     = iota // not a head (free, reserved-free or inside a chain)
	stHead            // head of a chain the frontend published
	stRaw             // head published by PublishAvail
	stReserved        // taken by ReserveDescs
)

// TX slot layout (one slot per head descriptor): an indirect table of up to
// 3 entries at 0, the header ending at txSlotData, the frame at txSlotData.
const (
	txSlotData  = 80
	maxTxChain  = 3
	availHdrOff = 4
)

// UsedElem is one used-ring element.
type UsedElem struct {
	ID  uint32
	Len uint32
}

// Desc is one split-ring descriptor.
type Desc struct {
	Addr  uint64
	Len   uint32
	Flags uint16
	Next  uint16
}

type ringStats struct {
	frames, bytes, usedEntries, kicks, kicksSuppressed, calls, callWakeups atomic.Uint64
}

type vring struct {
	mu                         sync.Mutex
	index, n                   int
	mask                       uint16
	rx                         bool
	descOff, availOff, usedOff int
	bufOff, bufSize            int // RX: buffer i at bufOff+i*bufSize; TX: slot per head
	kickFD, callFD             int

	availIdx   uint16 // shadow of avail.idx
	availFlags uint16 // shadow of avail.flags
	kickedIdx  uint16 // avail idx at the last notification decision
	lastUsed   uint16 // next used entry to consume
	free       []uint16
	state      []uint8
	chain      []uint16 // maxTxChain descriptors per head
	chainLen   []uint8
	rawUsed    []UsedElem
	err        error // sticky: the backend broke the ring protocol
	st         ringStats
}

func (f *Frontend) initRingState() {
	for _, r := range f.rings {
		r.mu.Lock()
		r.availIdx, r.kickedIdx, r.lastUsed = 0, 0, 0
		r.availFlags = 0
		if !r.rx && !f.eventIdx {
			// TX completions are reaped lazily: no interrupts unless WaitTx.
			r.availFlags = virtio.AvailFNoInterrupt
		}
		r.free = make([]uint16, r.n)
		for i := range r.free {
			r.free[i] = uint16(r.n - 1 - i) // pop yields 0, 1, 2, ...
		}
		r.state = make([]uint8, r.n)
		r.chain = make([]uint16, r.n*maxTxChain)
		r.chainLen = make([]uint8, r.n)
		r.rawUsed = nil
		r.err = nil
		f.publish(r)
		f.store16(r.availOff+availHdrOff+2*r.n, 0)
		r.mu.Unlock()
	}
}

// ---- memory helpers ----

func (f *Frontend) word(off int) *uint32 { return (*uint32)(unsafe.Pointer(&f.mem[off])) }

// load16 atomically loads the 16-bit field at even offset off.
func (f *Frontend) load16(off int) uint16 {
	w := atomic.LoadUint32(f.word(off &^ 3))
	if off&3 == 0 {
		return uint16(w)
	}
	return uint16(w >> 16)
}

// store16 stores the 16-bit field at even offset off; only for fields whose
// enclosing word is entirely frontend-owned (see the comment above).
func (f *Frontend) store16(off int, v uint16) {
	p := f.word(off &^ 3)
	w := atomic.LoadUint32(p)
	if off&3 == 0 {
		w = w&0xffff0000 | uint32(v)
	} else {
		w = w&0xffff | uint32(v)<<16
	}
	atomic.StoreUint32(p, w)
}

func (f *Frontend) usedIdx(r *vring) uint16 {
	return uint16(atomic.LoadUint32(f.word(r.usedOff)) >> 16)
}

func (f *Frontend) usedFlags(r *vring) uint16 { return uint16(atomic.LoadUint32(f.word(r.usedOff))) }

func (f *Frontend) usedElem(r *vring, i uint16) UsedElem {
	o := r.usedOff + 4 + virtio.UsedElemSize*int(i&r.mask)
	return UsedElem{ID: binary.LittleEndian.Uint32(f.mem[o:]), Len: binary.LittleEndian.Uint32(f.mem[o+4:])}
}

func (f *Frontend) putDesc(r *vring, i uint16, d Desc) {
	f.putDescAt(r.descOff+virtio.DescSize*int(i), d)
}

func (f *Frontend) putDescAt(o int, d Desc) {
	b := f.mem[o : o+virtio.DescSize]
	binary.LittleEndian.PutUint64(b, d.Addr)
	binary.LittleEndian.PutUint32(b[8:], d.Len)
	binary.LittleEndian.PutUint16(b[12:], d.Flags)
	binary.LittleEndian.PutUint16(b[14:], d.Next)
}

// pushAvail writes head into the next avail slot (not yet published).
func (f *Frontend) pushAvail(r *vring, head uint16) {
	binary.LittleEndian.PutUint16(f.mem[r.availOff+availHdrOff+2*int(r.availIdx&r.mask):], head)
	r.availIdx++
}

// publish makes avail.flags/idx visible (release).
func (f *Frontend) publish(r *vring) {
	atomic.StoreUint32(f.word(r.availOff), uint32(r.availFlags)|uint32(r.availIdx)<<16)
}

// notify kicks unless the backend suppressed notifications: used.flags
// NO_NOTIFY, or with EVENT_IDX vring_need_event(avail_event, new, old) where
// old is the avail idx at the previous decision.
func (f *Frontend) notify(r *vring) error {
	newIdx, old := r.availIdx, r.kickedIdx
	if newIdx == old {
		return nil
	}
	r.kickedIdx = newIdx
	var need bool
	if f.eventIdx {
		ev := f.load16(r.usedOff + 4 + virtio.UsedElemSize*r.n)
		need = newIdx-ev-1 < newIdx-old
	} else {
		need = f.usedFlags(r)&virtio.UsedFNoNotify == 0
	}
	if !need {
		r.st.kicksSuppressed.Add(1)
		return nil
	}
	return f.kick(r)
}

var one = [8]byte{1}

func (f *Frontend) kick(r *vring) error {
	r.st.kicks.Add(1)
	for {
		_, err := unix.Write(r.kickFD, one[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil && err != unix.EAGAIN { // EAGAIN: counter saturated, a kick is pending anyway
			return fmt.Errorf("frontend: kick vring %d: %w", r.index, err)
		}
		return nil
	}
}

// drainCall reads the call eventfd without blocking and counts the calls.
func (f *Frontend) drainCall(r *vring) uint64 {
	var b [8]byte
	n, err := unix.Read(r.callFD, b[:])
	if err != nil || n != 8 {
		return 0
	}
	v := binary.LittleEndian.Uint64(b[:])
	r.st.calls.Add(v)
	r.st.callWakeups.Add(1)
	return v
}

// waitCall sleeps on the call eventfd until it fires (true) or deadline
// passes (false).
func (f *Frontend) waitCall(r *vring, deadline time.Time) (bool, error) {
	for {
		d := time.Until(deadline)
		if d <= 0 {
			return false, nil
		}
		ms := int((d + time.Millisecond - 1) / time.Millisecond)
		fds := []unix.PollFd{{Fd: int32(r.callFD), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("frontend: poll call eventfd of vring %d: %w", r.index, err)
		}
		if n > 0 && f.drainCall(r) > 0 {
			return true, nil
		}
	}
}

// outOfOrder checks, with VIRTIO_F_IN_ORDER negotiated, that used entry i
// names the chain made available i-th (the device must use buffers in the
// order they were made available; this driver writes one used entry per
// chain's worth of avail slot, so entry i answers avail slot i).
func (f *Frontend) outOfOrder(r *vring, i uint16, e UsedElem) error {
	if !f.inOrder {
		return nil
	}
	if want := f.load16(r.availOff + 4 + 2*int(i&r.mask)); e.ID != uint32(want) {
		return f.badUsed(r, "used[%d] id %d out of order: VIRTIO_F_IN_ORDER, and avail[%d] is %d", i, e.ID, i, want)
	}
	return nil
}

func (f *Frontend) badUsed(r *vring, format string, args ...any) error {
	r.err = fmt.Errorf("%w: vring %d: %s", ErrBadUsed, r.index, fmt.Sprintf(format, args...))
	return r.err
}

// pendingUsed returns how many used entries are waiting, checking the
// backend did not run more than a ring ahead.
func (f *Frontend) pendingUsed(r *vring) (uint16, error) {
	p := f.usedIdx(r) - r.lastUsed
	if int(p) > r.n {
		return 0, f.badUsed(r, "used idx %d is %d entries past the last consumed %d (ring size %d)", r.lastUsed+p, p, r.lastUsed, r.n)
	}
	return p, nil
}

// ---- TX ----

func (f *Frontend) ring(vring int) (*vring, error) {
	if f.closed.Load() {
		return nil, ErrClosed
	}
	if vring < 0 || vring >= len(f.rings) {
		return nil, fmt.Errorf("frontend: vring %d out of range (have %d)", vring, len(f.rings))
	}
	return f.rings[vring], nil
}

func (f *Frontend) txRing(pair int) (*vring, error) {
	if pair < 0 || 2*pair+1 >= len(f.rings) {
		return nil, fmt.Errorf("frontend: pair %d out of range (have %d)", pair, len(f.rings)/2)
	}
	return f.ring(2*pair + 1)
}

func (f *Frontend) rxRing(pair int) (*vring, error) {
	if pair < 0 || 2*pair >= len(f.rings) {
		return nil, fmt.Errorf("frontend: pair %d out of range (have %d)", pair, len(f.rings)/2)
	}
	return f.ring(2 * pair)
}

// reclaimTx frees the chains the backend completed.
func (f *Frontend) reclaimTx(r *vring) error {
	if r.err != nil {
		return r.err
	}
	p, err := f.pendingUsed(r)
	if err != nil {
		return err
	}
	for ; p > 0; p-- {
		e := f.usedElem(r, r.lastUsed)
		if e.ID >= uint32(r.n) {
			return f.badUsed(r, "used[%d] id %d out of range", r.lastUsed, e.ID)
		}
		if err := f.outOfOrder(r, r.lastUsed, e); err != nil {
			return err
		}
		head := uint16(e.ID)
		switch r.state[head] {
		case stHead:
			r.free = append(r.free, r.chain[int(head)*maxTxChain:int(head)*maxTxChain+int(r.chainLen[head])]...)
		case stRaw:
			r.rawUsed = append(r.rawUsed, e)
		default:
			return f.badUsed(r, "used[%d] id %d is not an outstanding head", r.lastUsed, e.ID)
		}
		r.state[head] = stFree
		r.lastUsed++
		r.st.usedEntries.Add(1)
	}
	return nil
}

func (f *Frontend) txDescs() int {
	if f.cfg.TxIndirect {
		return 1
	}
	switch f.cfg.TxLayout {
	case TxContiguous:
		return 1
	case TxSplitHeader:
		return 3
	}
	return 2
}

// enqueueTx writes one chain and pushes its head (unpublished).
func (f *Frontend) enqueueTx(r *vring, hdr *virtio.NetHdr, frame []byte) error {
	if len(frame) > f.cfg.TxBufSize {
		return fmt.Errorf("%w: %d > %d", ErrFrameTooBig, len(frame), f.cfg.TxBufSize)
	}
	if len(r.free) < f.txDescs() {
		return ErrRingFull
	}
	head := r.free[len(r.free)-1]
	r.free = r.free[:len(r.free)-1]
	slot := r.bufOff + int(head)*r.bufSize
	data := slot + txSlotData
	hl := f.hdrLen
	hdrOff := data - hl
	var hb [virtio.NetHdrSize]byte
	if hdr != nil {
		hdr.Encode(hb[:])
	}
	copy(f.mem[hdrOff:data], hb[:hl])
	copy(f.mem[data:], frame)

	type seg struct{ off, n int }
	var segs [maxTxChain]seg
	var ns int
	switch f.cfg.TxLayout {
	case TxContiguous:
		segs[0], ns = seg{hdrOff, hl + len(frame)}, 1
	case TxSplitHeader:
		h1 := hl / 2
		segs[0], segs[1], segs[2], ns = seg{hdrOff, h1}, seg{hdrOff + h1, hl - h1}, seg{data, len(frame)}, 3
	default:
		segs[0], segs[1], ns = seg{hdrOff, hl}, seg{data, len(frame)}, 2
	}

	ch := r.chain[int(head)*maxTxChain:]
	ch[0] = head
	if f.cfg.TxIndirect {
		for i := range ns {
			d := Desc{Addr: f.GPA(segs[i].off), Len: uint32(segs[i].n)}
			if i < ns-1 {
				d.Flags, d.Next = virtio.DescFNext, uint16(i+1)
			}
			f.putDescAt(slot+i*virtio.DescSize, d)
		}
		f.putDesc(r, head, Desc{Addr: f.GPA(slot), Len: uint32(ns * virtio.DescSize), Flags: virtio.DescFIndirect})
		r.chainLen[head] = 1
	} else {
		for i := 1; i < ns; i++ {
			ch[i] = r.free[len(r.free)-1]
			r.free = r.free[:len(r.free)-1]
		}
		for i := range ns {
			d := Desc{Addr: f.GPA(segs[i].off), Len: uint32(segs[i].n)}
			if i < ns-1 {
				d.Flags, d.Next = virtio.DescFNext, ch[i+1]
			}
			f.putDesc(r, ch[i], d)
		}
		r.chainLen[head] = uint8(ns)
	}
	r.state[head] = stHead
	f.pushAvail(r, head)
	r.st.frames.Add(1)
	r.st.bytes.Add(uint64(len(frame)))
	return nil
}

// Send transmits one frame on pair's TX vring (2*pair+1) with a zero
// virtio-net header, laid out per Config.TxLayout/TxIndirect. It first
// reclaims completed TX chains, and kicks unless the backend suppressed
// notifications. It returns ErrRingFull when no descriptors are free (see
// WaitTx) and wraps ErrBadUsed when the backend corrupted the used ring.
func (f *Frontend) Send(pair int, frame []byte) error {
	return f.SendHdr(pair, nil, frame)
}

// SendHdr is Send with an explicit virtio-net header (nil = zero).
func (f *Frontend) SendHdr(pair int, hdr *virtio.NetHdr, frame []byte) error {
	return f.send(pair, hdr, frame, true)
}

// send queues one frame and publishes it; kick false loses the kick.
func (f *Frontend) send(pair int, hdr *virtio.NetHdr, frame []byte, kick bool) error {
	r, err := f.txRing(pair)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := f.reclaimTx(r); err != nil {
		return err
	}
	if err := f.enqueueTx(r, hdr, frame); err != nil {
		return err
	}
	f.publish(r)
	if !kick {
		r.kickedIdx = r.availIdx // the decision was made, the kick went missing
		return nil
	}
	return f.notify(r)
}

// SendNoKick queues a frame and publishes it like Send, but loses the kick
// that Send would have sent (it still counts as the last notification
// decision, as in a driver whose eventfd write went missing). With
// EVENT_IDX the backend's avail_event then stays behind, so the driver
// kicks for no later frame either: the lost-kick stall, for tests of the
// backend's stall watchdog.
func (f *Frontend) SendNoKick(pair int, frame []byte) error { return f.send(pair, nil, frame, false) }

// SendBurst queues as many frames as fit, publishes them with one avail idx
// update and makes one notification decision. It returns how many were
// queued; if not all, the error is ErrRingFull (or the failure).
func (f *Frontend) SendBurst(pair int, frames [][]byte) (int, error) {
	r, err := f.txRing(pair)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := f.reclaimTx(r); err != nil {
		return 0, err
	}
	n := 0
	for _, fr := range frames {
		if err = f.enqueueTx(r, nil, fr); err != nil {
			break
		}
		n++
	}
	if n > 0 {
		f.publish(r)
		if kerr := f.notify(r); kerr != nil && err == nil {
			err = kerr
		}
	}
	return n, err
}

// ReclaimTx reaps completed TX chains of pair and returns how many chains
// are still outstanding.
func (f *Frontend) ReclaimTx(pair int) (int, error) {
	r, err := f.txRing(pair)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	err = f.reclaimTx(r)
	return int(r.availIdx - r.lastUsed), err
}

// WaitTx waits up to timeout until pair's TX ring has room for one more
// frame, reaping completions. While waiting it asks for TX interrupts
// (clears NO_INTERRUPT, or sets used_event with EVENT_IDX), re-checks the
// used ring, then sleeps on the call eventfd; afterwards it masks TX
// interrupts again. Returns ErrTimeout if no room appeared.
func (f *Frontend) WaitTx(pair int, timeout time.Duration) error {
	r, err := f.txRing(pair)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	deadline := time.Now().Add(timeout)
	for {
		if err := f.reclaimTx(r); err != nil {
			return err
		}
		if len(r.free) >= f.txDescs() {
			return nil
		}
		if !time.Now().Before(deadline) {
			return ErrTimeout
		}
		if f.cfg.RxPoll {
			spin(time.Now().Add(100 * time.Microsecond))
			continue
		}
		f.armInterrupt(r)
		var called bool
		if f.usedIdx(r) == r.lastUsed {
			called, err = f.waitCall(r, deadline)
		} else {
			called = true // work arrived while arming: no sleep needed
		}
		if !f.eventIdx {
			r.availFlags |= virtio.AvailFNoInterrupt
			f.publish(r)
		}
		if err != nil {
			return err
		}
		if !called {
			// Slept with interrupts armed and no call came: either nothing
			// completed or the backend failed to interrupt.
			return ErrTimeout
		}
	}
}

// armInterrupt asks the backend to call on the next used entry.
func (f *Frontend) armInterrupt(r *vring) {
	if f.eventIdx {
		f.store16(r.availOff+availHdrOff+2*r.n, r.lastUsed)
	} else if r.availFlags&virtio.AvailFNoInterrupt != 0 {
		r.availFlags &^= virtio.AvailFNoInterrupt
		f.publish(r)
	}
}

func spin(until time.Time) {
	for i := 0; time.Now().Before(until); i++ {
		if i < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// ---- RX ----

// refill posts every free RX descriptor (descriptor i always points at RX
// buffer i, RxBufSize bytes, device-writable), publishes and notifies.
func (f *Frontend) refill(r *vring) error {
	if len(r.free) == 0 {
		return nil
	}
	for len(r.free) > 0 {
		d := r.free[len(r.free)-1]
		r.free = r.free[:len(r.free)-1]
		f.putDesc(r, d, Desc{Addr: f.GPA(r.bufOff + int(d)*r.bufSize), Len: uint32(r.bufSize), Flags: virtio.DescFWrite})
		r.state[d] = stHead
		f.pushAvail(r, d)
	}
	f.publish(r)
	return f.notify(r)
}

// Refill posts all free RX buffers of pair (useful with NoRxPrefill).
func (f *Frontend) Refill(pair int) error {
	r, err := f.rxRing(pair)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return f.refill(r)
}

// rxTake consumes one packet if a complete one is in the used ring.
func (f *Frontend) rxTake(r *vring, keep bool) (hdr virtio.NetHdr, frame []byte, ok bool, err error) {
	if r.err != nil {
		return hdr, nil, false, r.err
	}
	if err := f.refill(r); err != nil { // lazily posts after NoRxPrefill
		return hdr, nil, false, err
	}
	p, err := f.pendingUsed(r)
	if err != nil {
		return hdr, nil, false, err
	}
	for p > 0 {
		e := f.usedElem(r, r.lastUsed)
		if e.ID >= uint32(r.n) || r.state[e.ID] != stRaw {
			break
		}
		r.rawUsed = append(r.rawUsed, e)
		r.state[e.ID] = stFree
		r.lastUsed++
		p--
	}
	if p == 0 {
		return hdr, nil, false, nil
	}
	hl := f.hdrLen
	first := f.usedElem(r, r.lastUsed)
	if first.ID >= uint32(r.n) || r.state[first.ID] != stHead {
		return hdr, nil, false, f.badUsed(r, "used[%d] id %d is not an outstanding RX buffer", r.lastUsed, first.ID)
	}
	if first.Len < uint32(hl) || first.Len > uint32(r.bufSize) {
		return hdr, nil, false, f.badUsed(r, "used[%d] len %d outside [%d, %d]", r.lastUsed, first.Len, hl, r.bufSize)
	}
	b0 := r.bufOff + int(first.ID)*r.bufSize
	hdr.Decode(f.mem[b0 : b0+hl])
	nb := uint16(1)
	if f.mrg {
		nb = hdr.NumBuffers
		if nb == 0 {
			return hdr, nil, false, f.badUsed(r, "used[%d]: num_buffers is 0", r.lastUsed)
		}
		if nb > p {
			return hdr, nil, false, f.badUsed(r, "used[%d]: num_buffers %d but only %d used entries published", r.lastUsed, nb, p)
		}
	}
	total := 0
	for k := range nb {
		e := f.usedElem(r, r.lastUsed+k)
		if err := f.outOfOrder(r, r.lastUsed+k, e); err != nil {
			return hdr, nil, false, err
		}
		if k > 0 {
			if e.ID >= uint32(r.n) || r.state[e.ID] != stHead {
				return hdr, nil, false, f.badUsed(r, "used[%d] id %d (buffer %d of %d) is not an outstanding RX buffer", r.lastUsed+k, e.ID, k+1, nb)
			}
			if e.Len > uint32(r.bufSize) {
				return hdr, nil, false, f.badUsed(r, "used[%d] len %d > buffer size %d", r.lastUsed+k, e.Len, r.bufSize)
			}
		}
		r.state[e.ID] = stFree // also catches the same id twice in one packet
		total += int(e.Len)
	}
	if keep {
		frame = make([]byte, 0, total-hl)
	}
	for k := range nb {
		e := f.usedElem(r, r.lastUsed+k)
		start := 0
		if k == 0 {
			start = hl
		}
		if keep {
			o := r.bufOff + int(e.ID)*r.bufSize
			frame = append(frame, f.mem[o+start:o+int(e.Len)]...)
		}
		r.free = append(r.free, uint16(e.ID))
	}
	r.lastUsed += nb
	r.st.usedEntries.Add(uint64(nb))
	r.st.frames.Add(1)
	r.st.bytes.Add(uint64(total - hl))
	return hdr, frame, true, f.refill(r)
}

// RecvHdr waits up to timeout for a frame on pair's RX vring (2*pair) and
// returns its virtio-net header and payload. With MRG_RXBUF a frame spans
// num_buffers used entries, which must all be published together (a Linux
// guest drops the packet otherwise; here it is an ErrBadUsed). Consumed
// buffers are re-posted at once. Unless Config.RxPoll, it checks the used
// ring, then arms interrupts (used_event = last used with EVENT_IDX; RX
// rings never set NO_INTERRUPT), re-checks, and sleeps on the call eventfd;
// if the deadline passes without a call it returns ErrTimeout without
// looking at the ring again, so a backend that forgets to interrupt shows up
// as a timeout (as it would hang a guest).
func (f *Frontend) RecvHdr(pair int, timeout time.Duration) (virtio.NetHdr, []byte, error) {
	r, err := f.rxRing(pair)
	if err != nil {
		return virtio.NetHdr{}, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return f.recvLocked(r, time.Now().Add(timeout))
}

func (f *Frontend) recvLocked(r *vring, deadline time.Time) (virtio.NetHdr, []byte, error) {
	for {
		hdr, frame, ok, err := f.rxTake(r, true)
		if err != nil || ok {
			return hdr, frame, err
		}
		if !time.Now().Before(deadline) {
			return hdr, nil, ErrTimeout
		}
		if f.cfg.RxPoll {
			until := time.Now().Add(100 * time.Microsecond)
			if deadline.Before(until) {
				until = deadline
			}
			spin(until)
			continue
		}
		f.armInterrupt(r)
		if f.usedIdx(r) != r.lastUsed {
			continue
		}
		called, err := f.waitCall(r, deadline)
		if err != nil {
			return hdr, nil, err
		}
		if !called {
			// Slept with interrupts armed until the deadline and no call
			// came. Used entries published meanwhile without a call are a
			// backend bug a real guest would hang on, so don't look again.
			return hdr, nil, ErrTimeout
		}
	}
}

// Recv is RecvHdr without the header.
func (f *Frontend) Recv(pair int, timeout time.Duration) ([]byte, error) {
	_, b, err := f.RecvHdr(pair, timeout)
	return b, err
}

// RecvAll waits up to timeout for the first frame, then returns it with every
// further frame already available (no more waiting).
func (f *Frontend) RecvAll(pair int, timeout time.Duration) ([][]byte, error) {
	r, err := f.rxRing(pair)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, b, err := f.recvLocked(r, time.Now().Add(timeout))
	if err != nil {
		return nil, err
	}
	out := [][]byte{b}
	for {
		_, b, ok, err := f.rxTake(r, true)
		if err != nil {
			return out, err
		}
		if !ok {
			return out, nil
		}
		out = append(out, b)
	}
}

// Discard takes every frame already available on pair's RX vring without
// copying it out (the buffers go straight back to the device) and returns
// how many there were and their bytes: a sink for benchmarks that must not
// make garbage (a collection stops the dataplane's workers too).
func (f *Frontend) Discard(pair int) (frames, bytes int, err error) {
	r, err := f.rxRing(pair)
	if err != nil {
		return 0, 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b0 := r.st.bytes.Load()
	for {
		_, _, ok, err := f.rxTake(r, false)
		if err != nil || !ok {
			return frames, int(r.st.bytes.Load() - b0), err
		}
		frames++
	}
}

// RecvN receives n frames, waiting up to timeout in total; on timeout it
// returns the frames received so far and ErrTimeout.
func (f *Frontend) RecvN(pair, n int, timeout time.Duration) ([][]byte, error) {
	r, err := f.rxRing(pair)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	deadline := time.Now().Add(timeout)
	out := make([][]byte, 0, n)
	for len(out) < n {
		_, b, err := f.recvLocked(r, deadline)
		if err != nil {
			return out, err
		}
		out = append(out, b)
	}
	return out, nil
}

// ---- stats ----

// RingStats are per-vring counters. Frames/Bytes count frames sent (TX) or
// received (RX); UsedEntries counts used elements consumed; Kicks are
// eventfd writes, KicksSuppressed notifications skipped because of
// NO_NOTIFY/avail_event; Calls is the sum of call-eventfd counts read and
// CallWakeups the number of non-empty reads.
type RingStats struct {
	Frames, Bytes, UsedEntries, Kicks, KicksSuppressed, Calls, CallWakeups uint64
}

// PairStats are the RX and TX ring stats of one queue pair.
type PairStats struct {
	RX, TX RingStats
}

// RingStats returns vring's counters.
func (f *Frontend) RingStats(vring int) RingStats {
	if vring < 0 || vring >= len(f.rings) {
		return RingStats{}
	}
	s := &f.rings[vring].st
	return RingStats{
		Frames: s.frames.Load(), Bytes: s.bytes.Load(), UsedEntries: s.usedEntries.Load(),
		Kicks: s.kicks.Load(), KicksSuppressed: s.kicksSuppressed.Load(),
		Calls: s.calls.Load(), CallWakeups: s.callWakeups.Load(),
	}
}

// Stats returns pair's counters.
func (f *Frontend) Stats(pair int) PairStats {
	return PairStats{RX: f.RingStats(2 * pair), TX: f.RingStats(2*pair + 1)}
}

// DrainCalls reads vring's call eventfd without blocking, adds what it
// finds to Calls and returns it (0 if no call is pending).
func (f *Frontend) DrainCalls(vring int) uint64 {
	r, err := f.ring(vring)
	if err != nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return f.drainCall(r)
}
