package afxdp

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzRxDesc: whatever the kernel writes into an RX descriptor, an
// accepted one lies inside one receive chunk of the UMEM.
func FuzzRxDesc(f *testing.F) {
	f.Add(uint64(256), uint32(60))
	f.Add(uint64(FrameSize-1), uint32(2))
	f.Add(uint64(rxFrames*FrameSize-10), uint32(10))
	f.Add(^uint64(0), ^uint32(0))
	f.Fuzz(func(t *testing.T, addr uint64, n uint32) {
		chunk, ok := rxDesc(unix.XDPDesc{Addr: addr, Len: n})
		if !ok {
			return
		}
		if n == 0 || chunk%FrameSize != 0 || chunk >= rxFrames*FrameSize || addr < chunk || addr+uint64(n) > chunk+FrameSize {
			t.Fatalf("accepted addr %#x len %d (chunk %#x)", addr, n, chunk)
		}
	})
}

// FuzzGroupVLAN: the control-message walk stays inside the buffer and
// finds the tag only in a well-formed PACKET_AUXDATA message.
func FuzzGroupVLAN(f *testing.F) {
	good := make([]byte, unix.CmsgSpace(20))
	binary.NativeEndian.PutUint64(good[0:], uint64(unix.CmsgLen(20)))
	binary.NativeEndian.PutUint32(good[8:], unix.SOL_PACKET)
	binary.NativeEndian.PutUint32(good[12:], unix.PACKET_AUXDATA)
	binary.NativeEndian.PutUint32(good[16:], unix.TP_STATUS_VLAN_VALID)
	binary.NativeEndian.PutUint16(good[16+16:], 20)
	f.Add(good, uint64(len(good)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, uint64(8))
	f.Fuzz(func(t *testing.T, c []byte, controllen uint64) {
		var g groupSocket
		copy(g.cbuf[:], c)
		g.msg.Controllen = controllen
		tci, _, ok := g.vlan()
		if n := min(controllen, uint64(len(g.cbuf))); ok && n < uint64(unix.CmsgLen(20)) {
			t.Fatalf("a tag (%d) from %d control bytes", tci, n)
		}
	})
}
