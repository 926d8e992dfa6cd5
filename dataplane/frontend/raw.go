package frontend

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// Raw access for adversarial tests and test devices. These bypass the
// frontend's chain construction but keep its bookkeeping consistent:
// descriptors used for hand-built chains should come from ReserveDescs (or
// from a ring that Send/Recv never touch), heads published with PublishAvail
// are tracked as "raw" and their completions are collected for ReapRaw
// instead of being treated as backend errors.

// VringInfo describes one vring's place in guest memory.
type VringInfo struct {
	Index, Size                int
	DescOff, AvailOff, UsedOff int    // offsets into Mem()
	DescGPA, AvailGPA, UsedGPA uint64 // guest-physical addresses
	DescUA, AvailUA, UsedUA    uint64 // frontend user addresses, as sent in SET_VRING_ADDR
	BufOff, BufSize            int    // RX: buffer i at BufOff+i*BufSize; TX: one slot per head
	KickFD, CallFD             int    // the frontend's eventfds (a test device may write CallFD / read KickFD)
}

// Vring returns vring's layout.
func (f *Frontend) Vring(vring int) (VringInfo, error) {
	r, err := f.ring(vring)
	if err != nil {
		return VringInfo{}, err
	}
	return VringInfo{
		Index: r.index, Size: r.n,
		DescOff: r.descOff, AvailOff: r.availOff, UsedOff: r.usedOff,
		DescGPA: f.GPA(r.descOff), AvailGPA: f.GPA(r.availOff), UsedGPA: f.GPA(r.usedOff),
		DescUA: f.UserAddr(r.descOff), AvailUA: f.UserAddr(r.availOff), UsedUA: f.UserAddr(r.usedOff),
		BufOff: r.bufOff, BufSize: r.bufSize,
		KickFD: r.kickFD, CallFD: r.callFD,
	}, nil
}

// NumVrings is 2*QueuePairs.
func (f *Frontend) NumVrings() int { return len(f.rings) }

// WriteDesc writes descriptor idx of vring verbatim (addr is guest-physical).
func (f *Frontend) WriteDesc(vring, idx int, addr uint64, length uint32, flags, next uint16) error {
	r, err := f.ring(vring)
	if err != nil {
		return err
	}
	if idx < 0 || idx >= r.n {
		return fmt.Errorf("frontend: descriptor %d out of range (ring size %d)", idx, r.n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f.putDesc(r, uint16(idx), Desc{Addr: addr, Len: length, Flags: flags, Next: next})
	return nil
}

// ReadDesc reads descriptor idx of vring.
func (f *Frontend) ReadDesc(vring, idx int) (Desc, error) {
	r, err := f.ring(vring)
	if err != nil {
		return Desc{}, err
	}
	if idx < 0 || idx >= r.n {
		return Desc{}, fmt.Errorf("frontend: descriptor %d out of range (ring size %d)", idx, r.n)
	}
	return DecodeDesc(f.mem[r.descOff+idx*virtio.DescSize:]), nil
}

// DecodeDesc decodes a 16-byte descriptor (e.g. from an indirect table).
func DecodeDesc(b []byte) Desc {
	_ = b[15]
	return Desc{
		Addr: binary.LittleEndian.Uint64(b), Len: binary.LittleEndian.Uint32(b[8:]),
		Flags: binary.LittleEndian.Uint16(b[12:]), Next: binary.LittleEndian.Uint16(b[14:]),
	}
}

// EncodeDesc encodes d into b (len ≥ 16), e.g. to build an indirect table
// in memory from Alloc.
func EncodeDesc(b []byte, d Desc) {
	_ = b[15]
	binary.LittleEndian.PutUint64(b, d.Addr)
	binary.LittleEndian.PutUint32(b[8:], d.Len)
	binary.LittleEndian.PutUint16(b[12:], d.Flags)
	binary.LittleEndian.PutUint16(b[14:], d.Next)
}

// PublishAvail appends heads to vring's avail ring and publishes the new
// avail idx (release), without kicking (see Kick). Heads not already owned by
// the frontend are tracked as raw. Nothing stops a test from publishing more
// heads than the ring holds.
func (f *Frontend) PublishAvail(vring int, heads ...uint16) error {
	r, err := f.ring(vring)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range heads {
		if int(h) < r.n && r.state[h] != stHead {
			r.state[h] = stRaw
		}
		f.pushAvail(r, h)
	}
	f.publish(r)
	return nil
}

// Kick writes vring's kick eventfd unconditionally.
func (f *Frontend) Kick(vring int) error {
	r, err := f.ring(vring)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kickedIdx = r.availIdx
	return f.kick(r)
}

// Notify kicks vring only if the backend's suppression state asks for it
// (what Send does after publishing).
func (f *Frontend) Notify(vring int) error {
	r, err := f.ring(vring)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return f.notify(r)
}

// ReserveDescs takes n free descriptors of vring for hand-built chains.
// RX rings have none free unless NoRxPrefill was set and no Recv ran yet.
func (f *Frontend) ReserveDescs(vring, n int) ([]uint16, error) {
	r, err := f.ring(vring)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n > len(r.free) {
		return nil, fmt.Errorf("%w: want %d, %d free", ErrRingFull, n, len(r.free))
	}
	out := make([]uint16, n)
	for i := range out {
		out[i] = r.free[len(r.free)-1]
		r.free = r.free[:len(r.free)-1]
		r.state[out[i]] = stReserved
	}
	return out, nil
}

// ReleaseDescs returns reserved descriptors (no longer in flight) to the
// free list.
func (f *Frontend) ReleaseDescs(vring int, ids ...uint16) error {
	r, err := f.ring(vring)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if int(id) >= r.n || r.state[id] == stHead {
			return fmt.Errorf("frontend: descriptor %d is not reserved", id)
		}
		r.state[id] = stFree
		r.free = append(r.free, id)
	}
	return nil
}

// ReapRaw consumes used entries of raw heads and returns them (with any
// collected by Send/Recv). On a TX ring it reclaims everything; on an RX
// ring it stops at the first entry that is a frontend RX buffer.
func (f *Frontend) ReapRaw(vring int) ([]UsedElem, error) {
	r, err := f.ring(vring)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rx {
		if r.err == nil {
			p, err := f.pendingUsed(r)
			if err != nil {
				return nil, err
			}
			for ; p > 0; p-- {
				e := f.usedElem(r, r.lastUsed)
				if e.ID >= uint32(r.n) || r.state[e.ID] != stRaw {
					break
				}
				r.rawUsed = append(r.rawUsed, e)
				r.state[e.ID] = stFree
				r.lastUsed++
			}
		}
	} else if err := f.reclaimTx(r); err != nil {
		return nil, err
	}
	out := r.rawUsed
	r.rawUsed = nil
	return out, r.err
}

// AvailIdx is the frontend's avail idx of vring.
func (f *Frontend) AvailIdx(vring int) uint16 {
	r, err := f.ring(vring)
	if err != nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.availIdx
}

// UsedIdx loads vring's used idx from guest memory.
func (f *Frontend) UsedIdx(vring int) uint16 {
	r, err := f.ring(vring)
	if err != nil {
		return 0
	}
	return f.usedIdx(r)
}

// UsedElemAt reads used ring element i (taken modulo the ring size).
func (f *Frontend) UsedElemAt(vring int, i uint16) UsedElem {
	r, err := f.ring(vring)
	if err != nil {
		return UsedElem{}
	}
	return f.usedElem(r, i)
}

// Load32 and Store32 atomically access the aligned 32-bit word at off of
// guest memory; a test device uses them for used.flags|idx<<16 and friends.
func (f *Frontend) Load32(off int) uint32 { return atomic.LoadUint32(f.word(aligned4(off))) }

// Store32 atomically stores the aligned 32-bit word at off of guest memory.
func (f *Frontend) Store32(off int, v uint32) { atomic.StoreUint32(f.word(aligned4(off)), v) }

func aligned4(off int) int {
	if off&3 != 0 {
		panic(fmt.Sprintf("frontend: offset %#x is not 4-aligned", off))
	}
	return off
}

// Load16 atomically loads the 2-aligned 16-bit field at off of guest memory.
func (f *Frontend) Load16(off int) uint16 { return f.load16(off) }
