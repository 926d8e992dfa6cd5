package vxlan

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, vni := range []uint32{0, 1, 42, 0x123456, MaxVNI} {
		b := make([]byte, HdrLen+ethLen+4)
		for i := HdrLen; i < len(b); i++ {
			b[i] = byte(i)
		}
		PutHeader(b, vni)
		// RFC 7348 5: flags 0x08, 24 reserved bits, VNI, 8 reserved bits
		if b[0] != 0x08 || b[1]|b[2]|b[3]|b[7] != 0 {
			t.Fatalf("vni %d: header % x: want flags 08 and zero reserved bytes", vni, b[:HdrLen])
		}
		got, inner, err := Parse(b)
		if err != nil || got != vni || !bytes.Equal(inner, b[HdrLen:]) {
			t.Fatalf("vni %d: Parse = %d, %d inner bytes, %v", vni, got, len(inner), err)
		}
	}
}

func TestParseRefuses(t *testing.T) {
	b := make([]byte, HdrLen+ethLen)
	PutHeader(b, 7)
	if _, _, err := Parse(b[:len(b)-1]); err != ErrShort {
		t.Errorf("one byte short of an Ethernet header: %v, want ErrShort", err)
	}
	b[0] = 0
	if _, _, err := Parse(b); err != ErrNoVNI {
		t.Errorf("I flag clear: %v, want ErrNoVNI", err)
	}
	// reserved bits are ignored on receipt
	b[0], b[1], b[7] = 0xff, 0xff, 0xff
	if vni, _, err := Parse(b); err != nil || vni != 7 {
		t.Errorf("reserved bits set: vni %d, %v; want 7, nil", vni, err)
	}
}

func TestSrcPortInDynamicRange(t *testing.T) {
	seen := map[uint16]bool{}
	for _, h := range []uint32{0, 1 << 30, 2 << 30, 3 << 30, 0xffffffff} {
		p := SrcPort(h)
		if p < srcPortMin {
			t.Errorf("SrcPort(%#x) = %d, below %d", h, p, srcPortMin)
		}
		seen[p] = true
	}
	if SrcPort(0) != srcPortMin || SrcPort(0xffffffff) != srcPortMax {
		t.Errorf("range ends: %d..%d, want %d..%d", SrcPort(0), SrcPort(0xffffffff), srcPortMin, srcPortMax)
	}
	if len(seen) != 5 {
		t.Errorf("5 hashes a quarter of the range apart fell on %d ports, want 5", len(seen))
	}
}

func TestPutUDP(t *testing.T) {
	b := make([]byte, UDPLen)
	PutUDP(b, 50000, DefaultPort, 100)
	if binary.BigEndian.Uint16(b) != 50000 || binary.BigEndian.Uint16(b[2:]) != DefaultPort ||
		binary.BigEndian.Uint16(b[4:]) != UDPLen+100 || b[6]|b[7] != 0 {
		t.Errorf("UDP header % x", b)
	}
}

// FuzzParse: whatever a remote VTEP (or anyone reaching the port) sends,
// Parse either refuses it or returns an inner frame inside the datagram
// that starts right after the header and holds at least an Ethernet
// header.
func FuzzParse(f *testing.F) {
	ok := make([]byte, HdrLen+ethLen)
	PutHeader(ok, 5)
	f.Add(ok)
	f.Add([]byte{})
	f.Add(make([]byte, HdrLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		vni, inner, err := Parse(b)
		if err != nil {
			return
		}
		if vni > MaxVNI || len(inner) < ethLen || len(inner) != len(b)-HdrLen || &inner[0] != &b[HdrLen] {
			t.Fatalf("vni %d, inner %d bytes of %d", vni, len(inner), len(b))
		}
	})
}
