package dataplane

import (
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// TestPutHdrLeavesEqualHeader: a receive buffer that already holds the
// header (and num_buffers) to be written is not written at all, so its
// cache line stays shared with the driver: on a read-only page the calls
// would fault if they stored. A buffer holding anything else gets the
// header.
func TestPutHdrLeavesEqualHeader(t *testing.T) {
	var s scratch
	for i := range s.hdr {
		s.hdr[i] = byte(i + 1)
	}
	page, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(page)
	copy(page, s.hdr[:])
	putNumBuffers(page, int(s.hdr[10])|int(s.hdr[11])<<8) // the same value
	if err := unix.Mprotect(page, unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	func() {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("a header equal to the buffer's was written: %v", r)
			}
		}()
		s.putHdr(page, virtio.NetHdrSize)
		s.putHdr(page, virtio.NetHdrSize-2)
		putNumBuffers(page, int(s.hdr[10])|int(s.hdr[11])<<8)
	}()

	for _, n := range []int{virtio.NetHdrSize, virtio.NetHdrSize - 2} {
		buf := make([]byte, 16)
		s.putHdr(buf, n)
		if string(buf[:n]) != string(s.hdr[:n]) || buf[n] != 0 {
			t.Errorf("putHdr(%d) into a zeroed buffer: % x, want % x then zeros", n, buf, s.hdr[:n])
		}
	}
	buf := make([]byte, virtio.NetHdrSize)
	putNumBuffers(buf, 0x0203)
	if buf[10] != 3 || buf[11] != 2 {
		t.Errorf("num_buffers 0x0203 written as % x", buf[10:12])
	}
}
