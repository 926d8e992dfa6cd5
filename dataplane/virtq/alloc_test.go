package virtq

import (
	"testing"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// The per-packet path must not allocate: pop a chain, read its header,
// skip its frame, return it and decide about the interrupt.
func TestAllocsTX(t *testing.T) {
	for _, f := range []Features{{}, {EventIdx: true}, {EventIdx: true, IndirectDesc: true}} {
		m, d, q := newRing(t, 8, f)
		if f.IndirectDesc {
			putIndirect(t, m, indirectGPA,
				[4]uint64{stdDataGPA, 5, fNext, 1},
				[4]uint64{stdDataGPA + 0x100, 7, fNext, 2},
				[4]uint64{stdAEnd - 32, 1500, 0, 0})
			d.setDesc(0, indirectGPA, 48, fIndirect, 0)
		} else {
			d.setDesc(0, stdDataGPA, 5, fNext, 1)
			d.setDesc(1, stdDataGPA+0x100, 7, fNext, 2)
			d.setDesc(2, stdAEnd-32, 1500, 0, 0) // crosses into region B
		}
		var hdr [virtio.NetHdrSize]byte
		var peek [64]byte
		allocs := testing.AllocsPerRun(200, func() {
			d.add(0)
			n, err := q.Pending()
			if n != 1 || err != nil {
				panic("no pending chain")
			}
			head, err := q.Pop()
			if err != nil {
				panic(err)
			}
			r := q.NewReader(head)
			got := r.Read(hdr[:]) + r.Read(peek[:])
			got += r.Skip(1 << 16)
			if got != 12+1500 || r.Err() != nil {
				panic("short chain")
			}
			q.Push(head, 0)
			q.Publish()
			q.NeedsCall()
		})
		if allocs != 0 {
			t.Errorf("features %+v: %v allocations per packet, want 0", f, allocs)
		}
	}
}

func TestAllocsRX(t *testing.T) {
	_, d, q := newRing(t, 16, Features{EventIdx: true})
	// TX chain 0: header then frame; RX chain 8: 12-byte header split 4+8,
	// then one 2 KiB buffer.
	d.setDesc(0, stdDataGPA, 12, fNext, 1)
	d.setDesc(1, stdDataGPA+0x100, 1000, 0, 0)
	d.setDesc(8, stdDataGPA+0x2000, 4, fNext|fWrite, 9)
	d.setDesc(9, stdDataGPA+0x2100, 8, fNext|fWrite, 10)
	d.setDesc(10, stdDataGPA+0x3000, 2048, fWrite, 0)
	var hb [virtio.NetHdrSize]byte
	hdr := virtio.NetHdr{NumBuffers: 1}
	allocs := testing.AllocsPerRun(200, func() {
		d.add(8)
		if n, _ := q.Pending(); n != 1 {
			panic("no RX buffer")
		}
		h, err := q.Pop()
		if err != nil {
			panic(err)
		}
		r := q.NewReader(0)
		r.Skip(virtio.NetHdrSize)
		w := q.NewWriter(h)
		hdr.Encode(hb[:])
		n := w.Write(hb[:])
		n += w.CopyFrom(&r, 1<<16)
		if n != 1012 || w.Err() != nil || r.Err() != nil {
			panic("copy failed")
		}
		q.Push(h, uint32(n))
		q.Publish()
		q.NeedsCall()
		q.SetNotify(true)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per received packet, want 0", allocs)
	}
}
