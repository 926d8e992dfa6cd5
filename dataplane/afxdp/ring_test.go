package afxdp

import (
	"testing"

	"golang.org/x/sys/unix"
)

// fakeSocket is a Socket whose rings live in Go memory, so a test can
// play a kernel that writes nonsense.
func fakeSocket() (*Socket, *[3]uint32, *[3]uint32) {
	var rxIdx, compIdx [3]uint32 // producer, consumer, flags
	s := &Socket{fd: -1, cur: noChunk, umem: make([]byte, umemSize),
		held: make([]uint64, 0, rxFrames), freeTx: make([]uint64, 0, txFrames)}
	s.rx = descRing{ring: ring{producer: &rxIdx[0], consumer: &rxIdx[1], flags: &rxIdx[2], mask: ringSize - 1, size: ringSize},
		descs: make([]unix.XDPDesc, ringSize)}
	s.comp = addrRing{ring: ring{producer: &compIdx[0], consumer: &compIdx[1], flags: &compIdx[2], mask: ringSize - 1, size: ringSize},
		addrs: make([]uint64, ringSize)}
	return s, &rxIdx, &compIdx
}

// TestHostileRingContents: descriptors outside the receive half, crossing
// a chunk or empty are refused and counted; a producer index claiming more
// entries than the ring holds is clamped; completions that are not send
// chunks are refused and the free list never overflows.
func TestHostileRingContents(t *testing.T) {
	s, rxIdx, compIdx := fakeSocket()
	good := unix.XDPDesc{Addr: 3*FrameSize + 256, Len: 60}
	bad := []unix.XDPDesc{
		{Addr: rxFrames * FrameSize, Len: 60},       // a send chunk
		{Addr: FrameSize - 10, Len: 60},             // crosses into the next chunk
		{Addr: 5 * FrameSize, Len: 0},               // empty
		{Addr: ^uint64(0) - 10, Len: 60},            // wraps
		{Addr: 7 * FrameSize, Len: FrameSize + 1},   // longer than a chunk
		{Addr: umemSize + FrameSize, Len: 60},       // past the UMEM
		{Addr: 2 * FrameSize, Len: ^uint32(0)},      // huge
		{Addr: 9*FrameSize + FrameSize - 1, Len: 1}, // last byte: fine
	}
	s.rx.descs[0] = good
	copy(s.rx.descs[1:], bad)
	rxIdx[0] = 5000 // more than the ring holds
	frames := make([][]byte, 2*ringSize)
	n := s.receive(frames)
	if n != 2 { // the good one and the last-byte one
		t.Errorf("received %d frames, want 2", n)
	}
	if len(frames[0]) != 60 || &frames[0][0] != &s.umem[good.Addr] {
		t.Errorf("the good frame: %d bytes", len(frames[0]))
	}
	for _, f := range frames[:n] {
		if len(f) == 0 || len(f) > FrameSize {
			t.Fatalf("accepted a %d-byte frame", len(f))
		}
	}
	if s.rx.cons != ringSize || rxIdx[1] != ringSize {
		t.Errorf("consumer %d (published %d), want the clamp at %d", s.rx.cons, rxIdx[1], ringSize)
	}
	if got := s.RxInvalid.Load(); got != uint64(ringSize-2) {
		t.Errorf("%d refused, want %d (7 bad and the empty slots)", got, ringSize-2)
	}
	if len(s.held) != 2 {
		t.Errorf("%d chunks held for the fill ring, want 2", len(s.held))
	}

	// completions: one good send chunk, then receive chunks and garbage
	for i, a := range []uint64{rxFrames*FrameSize + 2*FrameSize, 0, FrameSize, umemSize, ^uint64(0)} {
		s.comp.addrs[i] = a
	}
	compIdx[0] = 5
	s.reapCompletions()
	if len(s.freeTx) != 1 || s.freeTx[0] != rxFrames*FrameSize+2*FrameSize || s.CompInvalid.Load() != 4 {
		t.Errorf("free list %v, %d refused", s.freeTx, s.CompInvalid.Load())
	}
	// a kernel completing more than was ever sent cannot grow the list
	// past its capacity
	for i := range ringSize {
		s.comp.addrs[i] = rxFrames*FrameSize + uint64(i%txFrames)*FrameSize
	}
	compIdx[0] += ringSize
	s.freeTx = s.freeTx[:cap(s.freeTx)]
	s.reapCompletions()
	if len(s.freeTx) != cap(s.freeTx) {
		t.Errorf("free list %d, cap %d", len(s.freeTx), cap(s.freeTx))
	}
	// send side: a frame that does not fit its chunk is refused
	s.freeTx = s.freeTx[:1]
	if b := s.txFrame(); len(b) != FrameSize {
		t.Fatalf("txFrame: %d bytes", len(b))
	}
	var txIdx [3]uint32
	s.tx = descRing{ring: ring{producer: &txIdx[0], consumer: &txIdx[1], flags: &txIdx[2], mask: ringSize - 1, size: ringSize},
		descs: make([]unix.XDPDesc, ringSize)}
	if s.txQueue(FrameSize-10, 11) || len(s.freeTx) != 1 {
		t.Error("a frame past its chunk was queued (or its chunk lost)")
	}
}
