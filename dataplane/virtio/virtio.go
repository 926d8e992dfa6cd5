// Package virtio holds the virtio 1.x constants and the virtio-net header
// layout that both sides of a vhost-user connection agree on (OASIS virtio
// spec, "Feature Bits", "Virtqueues" and "Network Device").
package virtio

import "encoding/binary"

// Device-independent feature bits.
const (
	FNotifyOnEmpty  = 24
	FAnyLayout      = 27
	FIndirectDesc   = 28 // VIRTIO_RING_F_INDIRECT_DESC
	FEventIdx       = 29 // VIRTIO_RING_F_EVENT_IDX
	FVersion1       = 32
	FAccessPlatform = 33
	FRingPacked     = 34
	FInOrder        = 35
)

// virtio-net feature bits.
const (
	NetFCsum          = 0
	NetFGuestCsum     = 1
	NetFMTU           = 3
	NetFMAC           = 5
	NetFGuestTSO4     = 7
	NetFGuestTSO6     = 8
	NetFGuestECN      = 9
	NetFGuestUFO      = 10
	NetFHostTSO4      = 11
	NetFHostTSO6      = 12
	NetFHostECN       = 13
	NetFHostUFO       = 14
	NetFMrgRxbuf      = 15
	NetFStatus        = 16
	NetFCtrlVQ        = 17
	NetFCtrlRx        = 18
	NetFGuestAnnounce = 21
	NetFMQ            = 22
	NetFGuestUSO4     = 54 // virtio 1.3: UDP segmentation offload (QEMU ≥ 8.2)
	NetFGuestUSO6     = 55
	NetFHostUSO       = 56
)

// Split-ring descriptor flags.
const (
	DescFNext     = 1
	DescFWrite    = 2
	DescFIndirect = 4
)

// Ring flags.
const (
	AvailFNoInterrupt = 1 // driver → device: do not interrupt me
	UsedFNoNotify     = 1 // device → driver: do not kick me
)

// Split-ring layout sizes.
const (
	DescSize     = 16
	UsedElemSize = 8
	MaxQueueSize = 32768
)

// AvailRingSize is the size of the available ring (flags, idx, ring[n],
// used_event).
func AvailRingSize(n int) int { return 4 + 2*n + 2 }

// UsedRingSize is the size of the used ring (flags, idx, ring[n],
// avail_event).
func UsedRingSize(n int) int { return 4 + UsedElemSize*n + 2 }

// Device status bits (SET_STATUS).
const (
	StatusAcknowledge = 1
	StatusDriver      = 2
	StatusDriverOK    = 4
	StatusFeaturesOK  = 8
	StatusNeedsReset  = 64
	StatusFailed      = 128
)

// NetHdr is struct virtio_net_hdr with num_buffers (12 bytes, the size used
// whenever VERSION_1 or MRG_RXBUF is negotiated).
type NetHdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
	NumBuffers uint16
}

// Net header sizes.
const (
	NetHdrLegacySize = 10 // without num_buffers: legacy drivers without MRG_RXBUF
	NetHdrSize       = 12
)

// NetHdrFNeedsCsum and friends are NetHdr.Flags bits; GSONone says the
// frame is not a GSO frame (the other types are in dataplane/offload).
const (
	NetHdrFNeedsCsum = 1
	NetHdrFDataValid = 2
	GSONone          = 0
)

// Encode writes h into b (len ≥ 12) in little-endian order.
func (h *NetHdr) Encode(b []byte) {
	_ = b[11]
	b[0] = h.Flags
	b[1] = h.GSOType
	binary.LittleEndian.PutUint16(b[2:], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:], h.CsumOffset)
	binary.LittleEndian.PutUint16(b[10:], h.NumBuffers)
}

// Decode reads h from b (len ≥ 10; num_buffers is read only when present).
func (h *NetHdr) Decode(b []byte) {
	_ = b[9]
	h.Flags = b[0]
	h.GSOType = b[1]
	h.HdrLen = binary.LittleEndian.Uint16(b[2:])
	h.GSOSize = binary.LittleEndian.Uint16(b[4:])
	h.CsumStart = binary.LittleEndian.Uint16(b[6:])
	h.CsumOffset = binary.LittleEndian.Uint16(b[8:])
	h.NumBuffers = 0
	if len(b) >= NetHdrSize {
		h.NumBuffers = binary.LittleEndian.Uint16(b[10:])
	}
}
