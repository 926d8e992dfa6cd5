// Package vxlan is the VXLAN overlay's wire (RFC 7348) and its sockets:
// the 8-byte VXLAN header, the outer UDP header a sender writes itself so
// that the source port follows the inner flow (underlay ECMP spreads
// flows, and a receiver's SO_REUSEPORT spreads them over its workers), and
// one worker's batch of datagrams in and out (socket.go). The decisions,
// which VNI is which network and which VTEP holds which MAC, are the
// dataplane's.
package vxlan

import (
	"encoding/binary"
	"errors"
)

// Sizes on the wire.
const (
	HdrLen      = 8    // the VXLAN header
	UDPLen      = 8    // the UDP header
	IPv4Len     = 20   // an IPv4 header without options (what the kernel adds)
	ethLen      = 14   // the inner Ethernet header
	DefaultPort = 4789 // IANA's VXLAN port
	// Overhead is what encapsulation adds to an inner frame's Ethernet
	// payload on an IPv4 underlay: outer IPv4 + UDP + VXLAN + the inner
	// Ethernet header. The guest's MTU is the underlay's less this.
	Overhead = IPv4Len + UDPLen + HdrLen + ethLen
	// MaxVNI is the largest VNI (24 bits).
	MaxVNI = 1<<24 - 1
)

// flagI is the header's "valid VNI" flag, the only one RFC 7348 defines.
const flagI = 0x08

// Errors Parse returns.
var (
	ErrShort = errors.New("vxlan: shorter than a VXLAN header and an Ethernet header")
	ErrNoVNI = errors.New("vxlan: I flag clear (no valid VNI)")
)

// Parse checks the VXLAN header at the start of a UDP payload and returns
// the VNI and the inner Ethernet frame (a slice of b). The reserved bits
// are ignored on receipt, as RFC 7348 says.
func Parse(b []byte) (vni uint32, inner []byte, err error) {
	if len(b) < HdrLen+ethLen {
		return 0, nil, ErrShort
	}
	if b[0]&flagI == 0 {
		return 0, nil, ErrNoVNI
	}
	return binary.BigEndian.Uint32(b[4:8]) >> 8, b[HdrLen:], nil
}

// PutHeader writes the VXLAN header for vni into b[:HdrLen]: the I flag,
// reserved bits zero.
func PutHeader(b []byte, vni uint32) {
	_ = b[HdrLen-1]
	binary.BigEndian.PutUint32(b[0:4], flagI<<24)
	binary.BigEndian.PutUint32(b[4:8], vni<<8)
}

// Source ports: RFC 7348 recommends a hash of the inner frame's headers
// in the dynamic range.
const (
	srcPortMin = 49152
	srcPortMax = 65535
)

// SrcPort maps an inner flow hash onto the dynamic port range, as Linux's
// udp_flow_src_port does onto its local range (a multiply, no division).
func SrcPort(hash uint32) uint16 {
	return uint16(uint64(hash)*(srcPortMax-srcPortMin+1)>>32 + srcPortMin)
}

// PutUDP writes the outer UDP header into b[:UDPLen] for a datagram of
// payload bytes after it. The checksum is zero: RFC 7348 says an IPv4
// VXLAN sender SHOULD send zero and a receiver MUST accept it; the inner
// frame carries its own.
func PutUDP(b []byte, src, dst uint16, payload int) {
	_ = b[UDPLen-1]
	binary.BigEndian.PutUint16(b[0:2], src)
	binary.BigEndian.PutUint16(b[2:4], dst)
	binary.BigEndian.PutUint16(b[4:6], uint16(UDPLen+payload))
	b[6], b[7] = 0, 0
}
