package frontend

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

// testDevice is a minimal virtio-net device built only on the frontend's
// exported raw accessors (Mem, Vring, Off, Load/Store32, ReadDesc). It is
// single-goroutine; each method works on one vring.
type testDevice struct {
	t         testing.TB
	f         *Frontend
	hdrLen    int
	eventIdx  bool
	mrg       bool
	lastAvail []uint16
	used      []uint16
	usedFlags []uint16
	noCall    bool
	// what the last popTx saw
	lastChainLen int
	lastIndirect bool
}

func newTestDevice(t testing.TB, f *Frontend) *testDevice {
	info := f.Info()
	n := f.NumVrings()
	return &testDevice{t: t, f: f, hdrLen: info.HdrLen,
		eventIdx: info.HasFeature(virtio.FEventIdx), mrg: info.HasFeature(virtio.NetFMrgRxbuf),
		lastAvail: make([]uint16, n), used: make([]uint16, n), usedFlags: make([]uint16, n)}
}

func (d *testDevice) vi(v int) VringInfo {
	vi, err := d.f.Vring(v)
	if err != nil {
		d.t.Fatal(err)
	}
	return vi
}

func (d *testDevice) mem(gpa uint64, n int) ([]byte, error) {
	off, ok := d.f.Off(gpa, n)
	if !ok {
		return nil, fmt.Errorf("GPA %#x+%d outside guest memory", gpa, n)
	}
	return d.f.Mem()[off : off+n], nil
}

func (d *testDevice) availIdx(v int) uint16 { return uint16(d.f.Load32(d.vi(v).AvailOff) >> 16) }

func (d *testDevice) availEntry(v int, i uint16) uint16 {
	vi := d.vi(v)
	return binary.LittleEndian.Uint16(d.f.Mem()[vi.AvailOff+4+2*int(i&uint16(vi.Size-1)):])
}

// chain walks a descriptor chain (with indirect tables), bounded by the
// ring size.
func (d *testDevice) chain(v int, head uint16) ([]Desc, error) {
	vi := d.vi(v)
	var out []Desc
	table := func(i int) Desc { x, _ := d.f.ReadDesc(v, i); return x }
	size := vi.Size
	idx := int(head)
	d.lastIndirect = false
	for hops := 0; ; hops++ {
		if idx >= size || hops >= size {
			return nil, fmt.Errorf("bad chain at %d", idx)
		}
		x := table(idx)
		if x.Flags&virtio.DescFIndirect != 0 {
			if d.lastIndirect || x.Len%16 != 0 || x.Len == 0 {
				return nil, fmt.Errorf("bad indirect descriptor %+v", x)
			}
			b, err := d.mem(x.Addr, int(x.Len))
			if err != nil {
				return nil, err
			}
			d.lastIndirect = true
			table = func(i int) Desc { return DecodeDesc(b[16*i:]) }
			size, idx, hops = int(x.Len/16), 0, -1
			continue
		}
		out = append(out, x)
		if x.Flags&virtio.DescFNext == 0 {
			return out, nil
		}
		idx = int(x.Next)
	}
}

func (d *testDevice) putUsed(v int, elems []UsedElem) {
	vi := d.vi(v)
	m := d.f.Mem()
	old := d.used[v]
	for _, e := range elems {
		o := vi.UsedOff + 4 + 8*int(d.used[v]&uint16(vi.Size-1))
		binary.LittleEndian.PutUint32(m[o:], e.ID)
		binary.LittleEndian.PutUint32(m[o+4:], e.Len)
		d.used[v]++
	}
	d.f.Store32(vi.UsedOff, uint32(d.usedFlags[v])|uint32(d.used[v])<<16)
	var need bool
	if d.eventIdx {
		ev := d.f.Load16(vi.AvailOff + 4 + 2*vi.Size)
		need = d.used[v]-ev-1 < d.used[v]-old
	} else {
		need = d.f.Load32(vi.AvailOff)&virtio.AvailFNoInterrupt == 0
	}
	if need && !d.noCall {
		unix.Write(vi.CallFD, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	}
}

// setUsedFlags publishes used.flags (NO_NOTIFY) with the current used idx.
func (d *testDevice) setUsedFlags(v int, flags uint16) {
	d.usedFlags[v] = flags
	d.f.Store32(d.vi(v).UsedOff, uint32(flags)|uint32(d.used[v])<<16)
}

// setAvailEvent writes avail_event = the next avail idx the device wants a
// kick for.
func (d *testDevice) setAvailEvent(v int, val uint16) {
	vi := d.vi(v)
	d.f.Store32(vi.UsedOff+4+8*vi.Size, uint32(val))
}

// popTx takes one TX chain, completes it and returns header and frame.
func (d *testDevice) popTx(v int) (hdr, frame []byte, ok bool) {
	if d.lastAvail[v] == d.availIdx(v) {
		return nil, nil, false
	}
	head := d.availEntry(v, d.lastAvail[v])
	segs, err := d.chain(v, head)
	if err != nil {
		d.t.Fatal(err)
	}
	d.lastChainLen = len(segs)
	var data []byte
	for _, s := range segs {
		if s.Flags&virtio.DescFWrite != 0 {
			d.t.Fatalf("TX descriptor %+v is device-writable", s)
		}
		b, err := d.mem(s.Addr, int(s.Len))
		if err != nil {
			d.t.Fatal(err)
		}
		data = append(data, b...)
	}
	d.lastAvail[v]++
	d.putUsed(v, []UsedElem{{ID: uint32(head)}})
	if len(data) < d.hdrLen {
		d.t.Fatalf("TX chain of %d bytes", len(data))
	}
	return data[:d.hdrLen], data[d.hdrLen:], true
}

var errNoBuf = errors.New("no RX buffers")

// pushRx delivers frame into RX vring v, spanning buffers with MRG_RXBUF.
func (d *testDevice) pushRx(v int, frame []byte) error {
	total := d.hdrLen + len(frame)
	type buf struct {
		head uint16
		b    []byte
	}
	var bufs []buf
	la := d.lastAvail[v]
	for got := 0; got < total; {
		if la == d.availIdx(v) || (!d.mrg && len(bufs) == 1) {
			return errNoBuf
		}
		head := d.availEntry(v, la)
		la++
		segs, err := d.chain(v, head)
		if err != nil || len(segs) != 1 || segs[0].Flags&virtio.DescFWrite == 0 {
			return fmt.Errorf("bad RX chain %v %v", segs, err)
		}
		b, err := d.mem(segs[0].Addr, int(segs[0].Len))
		if err != nil {
			return err
		}
		n := min(len(b), total-got)
		bufs = append(bufs, buf{head, b[:n]})
		got += n
	}
	d.lastAvail[v] = la
	var hb [virtio.NetHdrSize]byte
	h := virtio.NetHdr{NumBuffers: uint16(len(bufs))}
	h.Encode(hb[:])
	src := append(hb[:d.hdrLen:d.hdrLen], frame...)
	elems := make([]UsedElem, len(bufs))
	for i, b := range bufs {
		copy(b.b, src)
		src = src[len(b.b):]
		elems[i] = UsedElem{ID: uint32(b.head), Len: uint32(len(b.b))}
	}
	d.putUsed(v, elems)
	return nil
}

func frameOf(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func TestLoopback(t *testing.T) {
	cases := []struct {
		name      string
		cfg       Config
		chainLen  int
		indirect  bool
		rxEntries int // used entries per 1514-byte frame
	}{
		{"separate", Config{}, 2, false, 1},
		{"contiguous", Config{TxLayout: TxContiguous}, 1, false, 1},
		{"split-header", Config{TxLayout: TxSplitHeader}, 3, false, 1},
		{"indirect", Config{TxIndirect: true}, 2, true, 1},
		{"indirect-split-header", Config{TxIndirect: true, TxLayout: TxSplitHeader}, 3, true, 1},
		{"mergeable-small-bufs", Config{RxBufSize: 256, Regions: 4}, 2, false, 6},
		{"no-event-idx", Config{Features: DefaultFeatures &^ (1 << virtio.FEventIdx)}, 2, false, 1},
		{"legacy-hdr", Config{Features: NoFeatures}, 2, false, 1},
		{"rx-poll", Config{RxPoll: true, QueueSize: 8}, 2, false, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.QueuePairs = 2
			f, _, err := startPair(t, tc.cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			dev := newTestDevice(t, f)
			for i, n := range []int{60, 1514, 333, 1514, 64} {
				pair := i % 2
				fr := frameOf(n, byte(i))
				if err := f.Send(pair, fr); err != nil {
					t.Fatal(err)
				}
				hdr, got, ok := dev.popTx(2*pair + 1)
				if !ok {
					t.Fatal("device saw no TX chain")
				}
				if !bytes.Equal(got, fr) || !bytes.Equal(hdr, make([]byte, f.Info().HdrLen)) {
					t.Fatalf("device read %d bytes (hdr %x), want %d", len(got), hdr, len(fr))
				}
				if dev.lastChainLen != tc.chainLen || dev.lastIndirect != tc.indirect {
					t.Fatalf("chain of %d descriptors (indirect %v)", dev.lastChainLen, dev.lastIndirect)
				}
				usedBefore := f.RingStats(2 * pair).UsedEntries
				if err := dev.pushRx(2*pair, fr); err != nil {
					t.Fatal(err)
				}
				back, err := f.Recv(pair, 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(back, fr) {
					t.Fatalf("Recv returned %d bytes, want %d", len(back), len(fr))
				}
				if n == 1514 {
					if e := f.RingStats(2*pair).UsedEntries - usedBefore; e != uint64(tc.rxEntries) {
						t.Fatalf("1514-byte frame used %d RX entries, want %d", e, tc.rxEntries)
					}
				}
			}
			// Completed TX chains are reclaimed: everything is free again.
			if out, err := f.ReclaimTx(0); err != nil || out != 0 {
				t.Fatalf("ReclaimTx = %d, %v", out, err)
			}
			// Many more frames than ring slots: RX refill and TX reclaim
			// keep up.
			for i := range 3 * f.Config().QueueSize {
				fr := frameOf(100+i%200, byte(i))
				if err := f.Send(1, fr); err != nil {
					t.Fatal(i, err)
				}
				_, got, _ := dev.popTx(3)
				if err := dev.pushRx(2, got); err != nil {
					t.Fatal(i, err)
				}
				back, err := f.Recv(1, time.Second)
				if err != nil || !bytes.Equal(back, fr) {
					t.Fatalf("frame %d: %v", i, err)
				}
			}
			st := f.Stats(1)
			if st.TX.Frames != st.RX.Frames || st.TX.Frames < uint64(3*f.Config().QueueSize) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

func TestKickSuppressionEventIdx(t *testing.T) {
	f, _, err := startPair(t, Config{QueueSize: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dev := newTestDevice(t, f)
	for range 5 {
		if err := f.Send(0, frameOf(60, 1)); err != nil {
			t.Fatal(err)
		}
	}
	// avail_event stays 0: only the 0→1 transition needs a kick.
	if st := f.RingStats(1); st.Kicks != 1 || st.KicksSuppressed != 4 {
		t.Fatalf("stats %+v", st)
	}
	for range 5 {
		dev.popTx(1)
	}
	dev.setAvailEvent(1, dev.lastAvail[1]) // "kick me when you add entry 5"
	if err := f.Send(0, frameOf(60, 1)); err != nil {
		t.Fatal(err)
	}
	if st := f.RingStats(1); st.Kicks != 2 {
		t.Fatalf("after avail_event update: %+v", st)
	}
	// A burst crossing avail_event kicks once.
	dev.setAvailEvent(1, dev.lastAvail[1]+3)
	if n, err := f.SendBurst(0, [][]byte{frameOf(60, 1), frameOf(60, 2), frameOf(60, 3), frameOf(60, 4)}); n != 4 || err != nil {
		t.Fatalf("SendBurst = %d, %v", n, err)
	}
	if st := f.RingStats(1); st.Kicks != 3 {
		t.Fatalf("after burst: %+v", st)
	}
	// A burst that does not reach avail_event does not.
	dev.setAvailEvent(1, dev.lastAvail[1]+100)
	f.SendBurst(0, [][]byte{frameOf(60, 1)})
	if st := f.RingStats(1); st.Kicks != 3 {
		t.Fatalf("burst below avail_event kicked: %+v", st)
	}
	kv, _ := f.Vring(1)
	var b [8]byte
	if n, _ := unix.Read(kv.KickFD, b[:]); n != 8 || binary.LittleEndian.Uint64(b[:]) != 3 {
		t.Fatalf("kick eventfd holds %d", binary.LittleEndian.Uint64(b[:]))
	}
}

func TestKickSuppressionNoNotify(t *testing.T) {
	f, _, err := startPair(t, Config{Features: DefaultFeatures &^ (1 << virtio.FEventIdx)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dev := newTestDevice(t, f)
	dev.setUsedFlags(1, virtio.UsedFNoNotify)
	for range 3 {
		f.Send(0, frameOf(60, 1))
	}
	if st := f.RingStats(1); st.Kicks != 0 || st.KicksSuppressed != 3 {
		t.Fatalf("with NO_NOTIFY: %+v", st)
	}
	dev.setUsedFlags(1, 0)
	for range 2 {
		f.Send(0, frameOf(60, 1))
	}
	if st := f.RingStats(1); st.Kicks != 2 {
		t.Fatalf("without NO_NOTIFY: %+v", st)
	}
	// TX interrupts are masked outside WaitTx.
	vi, _ := f.Vring(1)
	if f.Load32(vi.AvailOff)&virtio.AvailFNoInterrupt == 0 {
		t.Fatal("TX avail flags lack NO_INTERRUPT")
	}
}

func TestRecvWaitsForCall(t *testing.T) {
	for _, ev := range []bool{true, false} {
		t.Run(fmt.Sprintf("event-idx=%v", ev), func(t *testing.T) {
			feats := DefaultFeatures
			if !ev {
				feats &^= 1 << virtio.FEventIdx
			}
			f, _, err := startPair(t, Config{Features: feats}, nil)
			if err != nil {
				t.Fatal(err)
			}
			dev := newTestDevice(t, f)
			done := make(chan error, 1)
			go func() {
				time.Sleep(30 * time.Millisecond)
				done <- dev.pushRx(0, frameOf(100, 9))
			}()
			got, err := f.Recv(0, 5*time.Second)
			if err != nil || !bytes.Equal(got, frameOf(100, 9)) {
				t.Fatalf("Recv: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if st := f.RingStats(0); st.Calls != 1 || st.CallWakeups != 1 {
				t.Fatalf("stats %+v", st)
			}
			// A device that publishes without calling is caught.
			dev.noCall = true
			go func() {
				time.Sleep(20 * time.Millisecond)
				done <- dev.pushRx(0, frameOf(100, 9))
			}()
			if _, err := f.Recv(0, 150*time.Millisecond); !errors.Is(err, ErrTimeout) {
				t.Fatalf("Recv without a call: %v", err)
			}
			<-done
			// ... but the frame is there for the next look.
			if got, err := f.Recv(0, 0); err != nil || len(got) != 100 {
				t.Fatalf("Recv after missed call: %v", err)
			}
		})
	}
}

func TestRingFullAndWaitTx(t *testing.T) {
	for _, ev := range []bool{true, false} {
		t.Run(fmt.Sprintf("event-idx=%v", ev), func(t *testing.T) {
			feats := DefaultFeatures
			if !ev {
				feats &^= 1 << virtio.FEventIdx
			}
			f, _, err := startPair(t, Config{QueueSize: 8, Features: feats}, nil)
			if err != nil {
				t.Fatal(err)
			}
			dev := newTestDevice(t, f)
			for i := range 4 {
				if err := f.Send(0, frameOf(60, byte(i))); err != nil {
					t.Fatal(i, err)
				}
			}
			if err := f.Send(0, frameOf(60, 0)); !errors.Is(err, ErrRingFull) {
				t.Fatalf("5th Send on a full ring: %v", err)
			}
			if err := f.WaitTx(0, 30*time.Millisecond); !errors.Is(err, ErrTimeout) {
				t.Fatalf("WaitTx with nothing completing: %v", err)
			}
			callsBefore := f.RingStats(1).Calls
			go func() {
				time.Sleep(20 * time.Millisecond)
				dev.popTx(1)
			}()
			if err := f.WaitTx(0, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if st := f.RingStats(1); st.Calls == callsBefore {
				t.Fatalf("WaitTx returned without a TX call: %+v", st)
			}
			if err := f.Send(0, frameOf(60, 0)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBadUsed(t *testing.T) {
	newF := func(cfg Config) (*Frontend, *testDevice) {
		f, _, err := startPair(t, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		return f, newTestDevice(t, f)
	}
	// TX: completion of a head that was never published.
	f, dev := newF(Config{QueueSize: 8})
	f.Send(0, frameOf(60, 0))
	dev.putUsed(1, []UsedElem{{ID: 5}})
	if err := f.Send(0, frameOf(60, 0)); !errors.Is(err, ErrBadUsed) {
		t.Fatalf("bogus TX used id: %v", err)
	}
	if err := f.Send(0, frameOf(60, 0)); !errors.Is(err, ErrBadUsed) {
		t.Fatalf("error not sticky: %v", err)
	}
	// RX: id out of range.
	f, dev = newF(Config{QueueSize: 8})
	dev.putUsed(0, []UsedElem{{ID: 99, Len: 100}})
	if _, err := f.Recv(0, time.Second); !errors.Is(err, ErrBadUsed) {
		t.Fatalf("RX id out of range: %v", err)
	}
	// RX: num_buffers larger than the published entries.
	f, dev = newF(Config{QueueSize: 8, RxBufSize: 64})
	dev.pushRx(0, frameOf(100, 0)) // 2 buffers
	vi, _ := f.Vring(0)
	f.Store32(vi.UsedOff, 1<<16) // un-publish the second one
	if _, err := f.Recv(0, time.Second); !errors.Is(err, ErrBadUsed) {
		t.Fatalf("num_buffers beyond used idx: %v", err)
	}
	// RX: len longer than the buffer.
	f, dev = newF(Config{QueueSize: 8, RxBufSize: 64})
	dev.putUsed(0, []UsedElem{{ID: 0, Len: 65}})
	if _, err := f.Recv(0, time.Second); !errors.Is(err, ErrBadUsed) {
		t.Fatalf("len > buffer: %v", err)
	}
	// Used idx more than a ring ahead.
	f, _ = newF(Config{QueueSize: 8})
	vi, _ = f.Vring(0)
	f.Store32(vi.UsedOff, 9<<16)
	if _, err := f.Recv(0, time.Second); !errors.Is(err, ErrBadUsed) {
		t.Fatalf("used idx jump: %v", err)
	}
}

func TestRawChains(t *testing.T) {
	f, _, err := startPair(t, Config{QueueSize: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dev := newTestDevice(t, f)
	ids, err := f.ReserveDescs(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	off, err := f.Alloc(12+60, 64)
	if err != nil {
		t.Fatal(err)
	}
	copy(f.Mem()[off+12:], frameOf(60, 3))
	f.WriteDesc(1, int(ids[0]), f.GPA(off), 12, virtio.DescFNext, ids[1])
	f.WriteDesc(1, int(ids[1]), f.GPA(off+12), 60, 0, 0)
	if err := f.PublishAvail(1, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := f.Kick(1); err != nil {
		t.Fatal(err)
	}
	// Interleave a normal Send.
	if err := f.Send(0, frameOf(70, 4)); err != nil {
		t.Fatal(err)
	}
	_, got, _ := dev.popTx(1)
	if !bytes.Equal(got, frameOf(60, 3)) {
		t.Fatal("raw chain content")
	}
	_, got, _ = dev.popTx(1)
	if !bytes.Equal(got, frameOf(70, 4)) {
		t.Fatal("Send after raw chain")
	}
	used, err := f.ReapRaw(1)
	if err != nil || len(used) != 1 || used[0].ID != uint32(ids[0]) {
		t.Fatalf("ReapRaw = %v, %v", used, err)
	}
	if err := f.ReleaseDescs(1, ids...); err != nil {
		t.Fatal(err)
	}
	if out, _ := f.ReclaimTx(0); out != 0 {
		t.Fatalf("%d chains outstanding", out)
	}
}

func TestNoRxPrefill(t *testing.T) {
	f, _, err := startPair(t, Config{NoRxPrefill: true, QueueSize: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.AvailIdx(0) != 0 {
		t.Fatal("RX posted despite NoRxPrefill")
	}
	if err := f.Refill(0); err != nil || f.AvailIdx(0) != 8 {
		t.Fatalf("Refill: %v, avail %d", err, f.AvailIdx(0))
	}
}

func BenchmarkLoopback(b *testing.B) {
	f, _, err := startPair(b, Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	dev := newTestDevice(b, f)
	fr := frameOf(64, 1)
	b.SetBytes(int64(len(fr)))
	for b.Loop() {
		if err := f.Send(0, fr); err != nil {
			b.Fatal(err)
		}
		_, got, _ := dev.popTx(1)
		if err := dev.pushRx(0, got); err != nil {
			b.Fatal(err)
		}
		if _, err := f.Recv(0, time.Second); err != nil {
			b.Fatal(err)
		}
	}
}
