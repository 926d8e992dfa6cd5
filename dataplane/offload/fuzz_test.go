package offload

import (
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// FuzzOffload feeds any header and frame (what a guest or the tap hands
// over) through Check, then what a worker does with a frame Check
// accepted: Complete/Restore and segmentation. Nothing may panic or read
// outside the frame; segments must add up to the payload.
func FuzzOffload(f *testing.F) {
	for _, sp := range []frameSpec{{payload: 3000}, {v6: true, vlan: true, payload: 2000}, {udp: true, payload: 1500}, {tcpOpts: 40, payload: 10}} {
		fr, h := build(sp, 700)
		var hb [virtio.NetHdrSize]byte
		h.Encode(hb[:])
		f.Add(hb[:], fr)
		fr, h = build(sp, 0)
		h.Encode(hb[:])
		f.Add(hb[:], fr)
	}
	s := new(Segmenter)
	f.Fuzz(func(t *testing.T, hb, frame []byte) {
		if len(hb) < virtio.NetHdrLegacySize {
			return
		}
		var h virtio.NetHdr
		h.Decode(hb)
		in, err := Check(&h, frame, len(frame))
		// a prefix of the frame never contradicts the whole
		if p := frame[:min(len(frame), 78)]; err == nil {
			if in2, err2 := Check(&h, p, len(frame)); err2 == nil && (in2.L4 != in.L4 || in2.L4End != in.L4End) {
				t.Fatalf("prefix says %+v, whole frame %+v", in2, in)
			}
		}
		if err != nil {
			return
		}
		if len(frame) < in.MinLen {
			t.Fatalf("accepted a %d-byte frame, MinLen %d", len(frame), in.MinLen)
		}
		if h.Flags&FNeedsCsum != 0 {
			Restore(frame, &h, Complete(frame, &h))
		}
		if h.GSOType == GSONone {
			return
		}
		s.Start(frame, &h, in)
		total, n := 0, 0
		for seg := s.Next(); seg != nil; seg = s.Next() {
			if len(seg) > in.L4End+int(h.GSOSize) {
				t.Fatalf("segment of %d bytes, gso_size %d", len(seg), h.GSOSize)
			}
			total += len(seg) - in.L4End
			n++
		}
		if total != len(frame)-in.L4End || n > MaxSegments {
			t.Fatalf("%d segments carry %d bytes, payload %d", n, total, len(frame)-in.L4End)
		}
	})
}
