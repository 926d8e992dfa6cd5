package vhostuser

import (
	"encoding/binary"
	"fmt"
)

var le = binary.LittleEndian

// VringState is the payload of SET_VRING_NUM, SET/GET_VRING_BASE and
// SET_VRING_ENABLE.
type VringState struct {
	Index uint32
	Num   uint32
}

// VringAddr is the payload of SET_VRING_ADDR. Desc, Used and Avail are
// frontend user virtual addresses, not guest physical ones.
type VringAddr struct {
	Index uint32
	Flags uint32
	Desc  uint64
	Used  uint64
	Avail uint64
	Log   uint64
}

// MemRegion describes one guest memory region (spec "Memory region
// description").
type MemRegion struct {
	GuestPhysAddr uint64
	Size          uint64
	UserAddr      uint64
	MmapOffset    uint64
}

// Valid reports whether the region's arithmetic cannot overflow and it is
// not empty; whether it fits its file is checked when it is mapped.
func (r MemRegion) Valid() error {
	switch {
	case r.Size == 0:
		return fmt.Errorf("region size is 0")
	case r.GuestPhysAddr+r.Size < r.GuestPhysAddr:
		return fmt.Errorf("region guest_phys_addr %#x + size %#x overflows", r.GuestPhysAddr, r.Size)
	case r.UserAddr+r.Size < r.UserAddr:
		return fmt.Errorf("region user_addr %#x + size %#x overflows", r.UserAddr, r.Size)
	case r.MmapOffset+r.Size < r.MmapOffset:
		return fmt.Errorf("region mmap_offset %#x + size %#x overflows", r.MmapOffset, r.Size)
	}
	return nil
}

func wantSize(p []byte, n int) error {
	if len(p) != n {
		return fmt.Errorf("payload is %d bytes, want %d", len(p), n)
	}
	return nil
}

// DecodeU64 decodes a u64 payload.
func DecodeU64(p []byte) (uint64, error) {
	if err := wantSize(p, U64Size); err != nil {
		return 0, err
	}
	return le.Uint64(p), nil
}

// EncodeU64 appends a u64 payload.
func EncodeU64(b []byte, v uint64) []byte { return le.AppendUint64(b, v) }

// DecodeVringState decodes a vring state payload.
func DecodeVringState(p []byte) (VringState, error) {
	if err := wantSize(p, VringStateSize); err != nil {
		return VringState{}, err
	}
	return VringState{Index: le.Uint32(p), Num: le.Uint32(p[4:])}, nil
}

// Encode appends the wire form of s.
func (s VringState) Encode(b []byte) []byte {
	b = le.AppendUint32(b, s.Index)
	return le.AppendUint32(b, s.Num)
}

// DecodeVringAddr decodes a SET_VRING_ADDR payload.
func DecodeVringAddr(p []byte) (VringAddr, error) {
	if err := wantSize(p, VringAddrSize); err != nil {
		return VringAddr{}, err
	}
	return VringAddr{
		Index: le.Uint32(p), Flags: le.Uint32(p[4:]),
		Desc: le.Uint64(p[8:]), Used: le.Uint64(p[16:]), Avail: le.Uint64(p[24:]), Log: le.Uint64(p[32:]),
	}, nil
}

// Encode appends the wire form of a.
func (a VringAddr) Encode(b []byte) []byte {
	b = le.AppendUint32(b, a.Index)
	b = le.AppendUint32(b, a.Flags)
	b = le.AppendUint64(b, a.Desc)
	b = le.AppendUint64(b, a.Used)
	b = le.AppendUint64(b, a.Avail)
	return le.AppendUint64(b, a.Log)
}

func decodeRegion(p []byte) MemRegion {
	return MemRegion{GuestPhysAddr: le.Uint64(p), Size: le.Uint64(p[8:]), UserAddr: le.Uint64(p[16:]), MmapOffset: le.Uint64(p[24:])}
}

// Encode appends the wire form of r.
func (r MemRegion) Encode(b []byte) []byte {
	b = le.AppendUint64(b, r.GuestPhysAddr)
	b = le.AppendUint64(b, r.Size)
	b = le.AppendUint64(b, r.UserAddr)
	return le.AppendUint64(b, r.MmapOffset)
}

// DecodeMemTable decodes a SET_MEM_TABLE payload: nregions u32, padding u32,
// then nregions regions. Some frontends send the full 8-slot array, so
// trailing bytes up to that size are accepted.
func DecodeMemTable(p []byte) ([]MemRegion, error) {
	if len(p) < 8 {
		return nil, fmt.Errorf("payload is %d bytes, want at least 8", len(p))
	}
	n := le.Uint32(p)
	if n == 0 || n > MaxMemTableRegion {
		return nil, fmt.Errorf("nregions %d out of range 1..%d", n, MaxMemTableRegion)
	}
	need := 8 + int(n)*MemRegionSize
	if len(p) < need || len(p) > 8+MaxMemTableRegion*MemRegionSize {
		return nil, fmt.Errorf("payload is %d bytes, want %d for %d regions", len(p), need, n)
	}
	regions := make([]MemRegion, n)
	for i := range regions {
		regions[i] = decodeRegion(p[8+i*MemRegionSize:])
		if err := regions[i].Valid(); err != nil {
			return nil, fmt.Errorf("region %d: %w", i, err)
		}
	}
	return regions, nil
}

// EncodeMemTable appends a SET_MEM_TABLE payload.
func EncodeMemTable(b []byte, regions []MemRegion) []byte {
	b = le.AppendUint32(b, uint32(len(regions)))
	b = le.AppendUint32(b, 0)
	for _, r := range regions {
		b = r.Encode(b)
	}
	return b
}

// DecodeSingleRegion decodes an ADD_MEM_REG/REM_MEM_REG payload (padding u64
// then one region).
func DecodeSingleRegion(p []byte) (MemRegion, error) {
	if err := wantSize(p, 8+MemRegionSize); err != nil {
		return MemRegion{}, err
	}
	r := decodeRegion(p[8:])
	return r, r.Valid()
}

// EncodeSingleRegion appends an ADD_MEM_REG/REM_MEM_REG payload.
func EncodeSingleRegion(b []byte, r MemRegion) []byte {
	b = le.AppendUint64(b, 0)
	return r.Encode(b)
}

// LogDesc is the payload of SET_LOG_BASE when LOG_SHMFD is negotiated
// (spec "Log description"): where the dirty log lies in the fd sent along.
type LogDesc struct {
	Size   uint64 // mmap_size
	Offset uint64 // mmap_offset
}

// LogDescSize is the wire size of LogDesc.
const LogDescSize = 16

// DecodeLog decodes a SET_LOG_BASE payload.
func DecodeLog(p []byte) (LogDesc, error) {
	if err := wantSize(p, LogDescSize); err != nil {
		return LogDesc{}, err
	}
	return LogDesc{Size: le.Uint64(p), Offset: le.Uint64(p[8:])}, nil
}

// Encode appends the wire form of l.
func (l LogDesc) Encode(b []byte) []byte {
	b = le.AppendUint64(b, l.Size)
	return le.AppendUint64(b, l.Offset)
}
