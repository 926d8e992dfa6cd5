package vswitch

import (
	"encoding/binary"
	"sync/atomic"
	"time"
)

// Ethernet types this package looks into.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeIPv6 = 0x86dd
	EtherTypeVLAN = 0x8100
	EtherTypeQinQ = 0x88a8
	EtherTypeARP  = 0x0806
	EtherTypeRARP = 0x8035
)

// HeaderPeek is how many leading frame bytes FlowHash may look at: enough
// for Ethernet, two VLAN tags, an IPv6 header and the L4 ports.
const HeaderPeek = 14 + 8 + 40 + 4

// FlowHash returns a hash of the frame's flow that is the same for both
// directions of a conversation (addresses and ports are combined order-
// independently), so the reply to a flow can be steered to the queue the
// flow was sent from. IPv4/IPv6 with TCP/UDP/SCTP use the 5-tuple, other IP
// the addresses, anything else the MAC pair. h is the frame's first bytes;
// it may be shorter than the frame, and whatever lies beyond it (ports behind
// long IPv4 options, say) is left out of the hash.
func FlowHash(h []byte) uint32 {
	// The common frame first, from fixed offsets: IPv4 without options,
	// not a later fragment, with its ports (what flowHash computes for it)
	if len(h) >= 38 && h[12] == 0x08 && h[13] == 0x00 && h[14] == 0x45 && binary.BigEndian.Uint16(h[20:22])&0x1fff == 0 {
		proto := h[23]
		hash := pairHash(binary.BigEndian.Uint32(h[26:30]), binary.BigEndian.Uint32(h[30:34])) ^ uint32(proto)<<24
		if proto == 6 || proto == 17 || proto == 132 {
			hash ^= pairHash(uint32(binary.BigEndian.Uint16(h[34:36])), uint32(binary.BigEndian.Uint16(h[36:38]))) * 0x85ebca6b
		}
		return mix(hash)
	}
	return flowHash(h)
}

// flowHash is FlowHash for any frame.
func flowHash(h []byte) uint32 {
	if len(h) < 14 {
		return 0
	}
	macs := mix(pairHash(binary.BigEndian.Uint32(h[0:4])^uint32(binary.BigEndian.Uint16(h[4:6])),
		binary.BigEndian.Uint32(h[6:10])^uint32(binary.BigEndian.Uint16(h[10:12]))))
	et := binary.BigEndian.Uint16(h[12:14])
	off := 14
	for i := 0; i < 2 && (et == EtherTypeVLAN || et == EtherTypeQinQ) && len(h) >= off+4; i++ {
		et = binary.BigEndian.Uint16(h[off+2:])
		off += 4
	}
	var a, b uint32
	var proto byte
	var l4 int
	switch et {
	case EtherTypeIPv4:
		ip := h[off:]
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return macs
		}
		ihl := int(ip[0]&0xf) * 4
		a, b, proto = binary.BigEndian.Uint32(ip[12:]), binary.BigEndian.Uint32(ip[16:]), ip[9]
		// fragments other than the first carry no ports
		if binary.BigEndian.Uint16(ip[6:])&0x1fff == 0 && ihl >= 20 {
			l4 = off + ihl
		}
	case EtherTypeIPv6:
		ip := h[off:]
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return macs
		}
		for i := 0; i < 16; i += 4 {
			a = a*0x9e3779b1 + binary.BigEndian.Uint32(ip[8+i:])
			b = b*0x9e3779b1 + binary.BigEndian.Uint32(ip[24+i:])
		}
		proto, l4 = ip[6], off+40
	default:
		return macs
	}
	hash := pairHash(a, b) ^ uint32(proto)<<24
	if l4 > 0 && (proto == 6 || proto == 17 || proto == 132) && len(h) >= l4+4 {
		hash ^= pairHash(uint32(binary.BigEndian.Uint16(h[l4:])), uint32(binary.BigEndian.Uint16(h[l4+2:]))) * 0x85ebca6b
	}
	return mix(hash)
}

// pairHash combines two values independently of their order.
func pairHash(x, y uint32) uint32 {
	if x > y {
		x, y = y, x
	}
	return x*0x9e3779b1 ^ y
}

// mix is the murmur3 finaliser.
func mix(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// FlowTable remembers, per flow-hash bucket, the queue a port's guest sends
// that flow on. The virtio spec (§5.1.6.5.6, automatic receive steering)
// says a device SHOULD deliver a flow's packets on the receive queue
// matching the transmit queue the driver last used for it. A flow sent on
// two queues at once (a forwarder, a guest's threads on two CPUs) would
// then flip between them frame by frame: its replies reordered, two
// workers writing one bucket, a run of frames to one port broken up into
// both of its rings. So, as Linux's RFS does, a flow moves to another
// queue only once the queue it has has not sent it for a whole epoch
// (flowEpochShift: 2^27 ns, about 134 ms).
type FlowTable struct {
	buckets [flowBuckets]atomic.Uint32 // epoch<<16 | queue+1; 0 = unknown
}

const (
	flowBuckets    = 1024
	flowEpochShift = 27
	// FlowEpoch is how long a FlowTable's epoch lasts.
	FlowEpoch = time.Duration(1) << flowEpochShift
)

// Record notes that hash was sent on queue q at now (ns, any monotonic
// origin): the bucket takes q unless another queue sent the flow in this
// epoch or the one before. A queue keeping its flow writes once an epoch.
func (f *FlowTable) Record(hash uint32, q int, now int64) {
	b := &f.buckets[hash%flowBuckets]
	epoch := uint32(now>>flowEpochShift) & 0xffff
	want := epoch<<16 | uint32(q+1)&0xffff
	old := b.Load() // read first: keep the cache line shared
	if old == want {
		return
	}
	if oq := old & 0xffff; oq != 0 && oq != want&0xffff && uint16(epoch-old>>16) < 2 {
		return // another queue has it, and sent it lately
	}
	b.Store(want)
}

// Lookup returns the queue recorded for hash, or -1.
func (f *FlowTable) Lookup(hash uint32) int {
	return int(f.buckets[hash%flowBuckets].Load()&0xffff) - 1
}
