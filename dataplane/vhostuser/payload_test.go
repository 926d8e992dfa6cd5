package vhostuser

import (
	"bytes"
	"testing"
)

func TestDecodeU64(t *testing.T) {
	if v, err := DecodeU64(u64(0x0102030405060708)); v != 0x0102030405060708 || err != nil {
		t.Errorf("DecodeU64 = %#x, %v", v, err)
	}
	for _, n := range []int{0, 7, 9, 16} {
		if _, err := DecodeU64(make([]byte, n)); err == nil {
			t.Errorf("DecodeU64 accepted %d bytes", n)
		}
	}
}

func TestDecodeVringState(t *testing.T) {
	s := VringState{Index: 7, Num: 0xffffffff}
	if got, err := DecodeVringState(s.Encode(nil)); got != s || err != nil {
		t.Errorf("round trip %+v -> %+v, %v", s, got, err)
	}
	for _, n := range []int{0, 4, 7, 9, 12} {
		if _, err := DecodeVringState(make([]byte, n)); err == nil {
			t.Errorf("accepted %d bytes", n)
		}
	}
}

func TestDecodeVringAddr(t *testing.T) {
	a := VringAddr{Index: 1, Flags: VringAddrFlagLog, Desc: 0x1000, Used: 0x3000, Avail: 0x2000, Log: 0xdead000}
	p := a.Encode(nil)
	if len(p) != VringAddrSize {
		t.Fatalf("encoded %d bytes", len(p))
	}
	// field order on the wire: index, flags, desc, used, avail, log
	if p[8] != 0x00 || p[9] != 0x10 || p[17] != 0x30 || p[25] != 0x20 {
		t.Errorf("wire layout %x", p)
	}
	if got, err := DecodeVringAddr(p); got != a || err != nil {
		t.Errorf("round trip %+v -> %+v, %v", a, got, err)
	}
	for _, n := range []int{0, 32, 39, 41, 48} {
		if _, err := DecodeVringAddr(make([]byte, n)); err == nil {
			t.Errorf("accepted %d bytes", n)
		}
	}
}

func region(gpa, size, uva, off uint64) MemRegion {
	return MemRegion{GuestPhysAddr: gpa, Size: size, UserAddr: uva, MmapOffset: off}
}

func TestMemRegionValid(t *testing.T) {
	for _, c := range []struct {
		r  MemRegion
		ok bool
	}{
		{region(0, 1, 0, 0), true},
		{region(1<<64-2, 1, 1<<64-2, 1<<64-2), true}, // ends at the last address
		{region(0, 0, 0, 0), false},
		{region(1<<64-1, 1, 0, 0), false}, // end is 2^64
		{region(0, 1, 1<<64-1, 0), false},
		{region(0, 1, 0, 1<<64-1), false},
		{region(1, 1<<64-1, 0, 0), false},
		{region(0, 1<<64-1, 2, 0), false},
	} {
		if err := c.r.Valid(); (err == nil) != c.ok {
			t.Errorf("%+v: Valid() = %v, want ok=%v", c.r, err, c.ok)
		}
	}
}

func TestDecodeMemTable(t *testing.T) {
	regions := []MemRegion{region(0, 0xa0000, 0x7f00000000, 0), region(0x100000, 0x1000, 0x7f00100000, 0x100000)}
	p := EncodeMemTable(nil, regions)
	if len(p) != 8+2*MemRegionSize {
		t.Fatalf("encoded %d bytes", len(p))
	}
	got, err := DecodeMemTable(p)
	if err != nil || len(got) != 2 || got[0] != regions[0] || got[1] != regions[1] {
		t.Fatalf("round trip: %v, %v", got, err)
	}
	// QEMU may send the whole 8-slot array.
	full := append(append([]byte(nil), p...), make([]byte, 6*MemRegionSize)...)
	if got, err := DecodeMemTable(full); err != nil || len(got) != 2 {
		t.Errorf("full array: %v, %v", got, err)
	}
	withN := func(n uint32, size int) []byte {
		b := le.AppendUint32(nil, n)
		b = append(b, make([]byte, size-4)...)
		for i := 8; i+MemRegionSize <= size; i += MemRegionSize {
			le.PutUint64(b[i+8:], 0x1000) // a valid size
		}
		return b
	}
	for _, c := range []struct {
		name string
		p    []byte
		ok   bool
	}{
		{"nregions 0", withN(0, 8), false},
		{"nregions 0 full", withN(0, 8+8*MemRegionSize), false},
		{"nregions 1", withN(1, 8+MemRegionSize), true},
		{"nregions 8", withN(8, 8+8*MemRegionSize), true},
		{"nregions 9", withN(9, 8+9*MemRegionSize), false},
		{"nregions 9 in 8 slots", withN(9, 8+8*MemRegionSize), false},
		{"nregions huge", withN(0xffffffff, 8+8*MemRegionSize), false},
		{"nregions 1<<31", withN(1<<31, 8+8*MemRegionSize), false},
		{"short", withN(2, 8+MemRegionSize), false},
		{"one byte short", withN(1, 8+MemRegionSize-1), false},
		{"past 8 slots", withN(1, 8+8*MemRegionSize+1), false},
		{"header only", withN(1, 8), false},
		{"tiny", []byte{1, 0, 0, 0}, false},
		{"empty", nil, false},
		{"zero-size region", append(le.AppendUint32(nil, 1), make([]byte, 4+MemRegionSize)...), false},
		{"overflowing region", EncodeMemTable(nil, []MemRegion{region(1<<64-0x1000, 0x2000, 0, 0)}), false},
		{"second region invalid", EncodeMemTable(nil, []MemRegion{region(0, 1, 0, 0), region(0, 1, 1<<64-1, 0)}), false},
	} {
		got, err := DecodeMemTable(c.p)
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, %v; want ok=%v", c.name, got, err, c.ok)
		}
	}
}

func TestDecodeSingleRegion(t *testing.T) {
	r := region(0x100000000, 0x40000000, 0x7f0000000000, 0x1000)
	p := EncodeSingleRegion(nil, r)
	if len(p) != 8+MemRegionSize {
		t.Fatalf("encoded %d bytes", len(p))
	}
	if got, err := DecodeSingleRegion(p); got != r || err != nil {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	if _, err := DecodeSingleRegion(EncodeSingleRegion(nil, region(0, 0, 0, 0))); err == nil {
		t.Errorf("accepted a zero-size region")
	}
	if _, err := DecodeSingleRegion(EncodeSingleRegion(nil, region(0, 2, 0, 1<<64-1))); err == nil {
		t.Errorf("accepted an overflowing mmap_offset")
	}
	for _, n := range []int{0, 32, 39, 41, 64} {
		if _, err := DecodeSingleRegion(make([]byte, n)); err == nil {
			t.Errorf("accepted %d bytes", n)
		}
	}
}

// FuzzDecode feeds arbitrary payloads to every decoder; whatever decodes
// must encode back to the same bytes (up to the padding the decoders
// ignore), and whatever a decoder returns must be valid.
func FuzzDecode(f *testing.F) {
	f.Add(EncodeMemTable(nil, []MemRegion{region(0, 0x1000, 0x7f0000000000, 0)}))
	f.Add(EncodeMemTable(nil, make([]MemRegion, 8)))
	f.Add(append(EncodeMemTable(nil, []MemRegion{region(0, 1, 0, 0)}), make([]byte, 7*MemRegionSize)...))
	f.Add(EncodeSingleRegion(nil, region(0x100000, 0x1000, 0x7f0000100000, 0x100000)))
	f.Add(VringAddr{Index: 1, Desc: 0x1000, Used: 0x3000, Avail: 0x2000}.Encode(nil))
	f.Add(VringState{Index: 2, Num: 256}.Encode(nil))
	f.Add(LogDesc{Size: 0x2000, Offset: 0}.Encode(nil))
	f.Add(u64(VringNoFD | 3))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		if rs, err := DecodeMemTable(p); err == nil {
			if len(rs) < 1 || len(rs) > MaxMemTableRegion {
				t.Fatalf("DecodeMemTable returned %d regions", len(rs))
			}
			for _, r := range rs {
				if r.Valid() != nil {
					t.Fatalf("DecodeMemTable returned an invalid region %+v", r)
				}
			}
			enc := EncodeMemTable(nil, rs)
			if !bytes.Equal(enc[:4], p[:4]) || !bytes.Equal(enc[8:], p[8:len(enc)]) {
				t.Fatalf("DecodeMemTable round trip differs")
			}
			if min, max := ExpectedFDs(ReqSetMemTable, p); min != len(rs) || max != len(rs) {
				t.Fatalf("ExpectedFDs = %d..%d for %d regions", min, max, len(rs))
			}
		}
		if r, err := DecodeSingleRegion(p); err == nil {
			if r.Valid() != nil {
				t.Fatalf("invalid region %+v", r)
			}
			if enc := EncodeSingleRegion(nil, r); !bytes.Equal(enc[8:], p[8:]) {
				t.Fatalf("DecodeSingleRegion round trip differs")
			}
		}
		if a, err := DecodeVringAddr(p); err == nil {
			if !bytes.Equal(a.Encode(nil), p) {
				t.Fatalf("DecodeVringAddr round trip differs")
			}
		}
		if l, err := DecodeLog(p); err == nil {
			if len(p) != LogDescSize || !bytes.Equal(l.Encode(nil), p) {
				t.Fatalf("DecodeLog round trip differs")
			}
		}
		if s, err := DecodeVringState(p); err == nil {
			if !bytes.Equal(s.Encode(nil), p) {
				t.Fatalf("DecodeVringState round trip differs")
			}
		}
		if v, err := DecodeU64(p); err == nil {
			if !bytes.Equal(EncodeU64(nil, v), p) {
				t.Fatalf("DecodeU64 round trip differs")
			}
		}
	})
}

// FuzzEncode goes the other way: encoded valid structs decode to themselves.
func FuzzEncode(f *testing.F) {
	f.Add(uint64(0), uint64(0x1000), uint64(0x7f0000000000), uint64(0), uint8(1))
	f.Add(uint64(1<<64-0x1000), uint64(0x1000), uint64(0), uint64(0), uint8(8))
	f.Fuzz(func(t *testing.T, gpa, size, uva, off uint64, n uint8) {
		r := region(gpa, size, uva, off)
		valid := r.Valid() == nil
		if got, err := DecodeSingleRegion(EncodeSingleRegion(nil, r)); got != r || (err == nil) != valid {
			t.Fatalf("single region %+v -> %+v, %v", r, got, err)
		}
		k := int(n%(MaxMemTableRegion+1)) + 1 // 1..9
		rs := make([]MemRegion, k)
		for i := range rs {
			rs[i] = region(gpa+uint64(i), size, uva, off)
		}
		got, err := DecodeMemTable(EncodeMemTable(nil, rs))
		allValid := true
		for _, x := range rs {
			allValid = allValid && x.Valid() == nil
		}
		wantOK := allValid && k <= MaxMemTableRegion
		if (err == nil) != wantOK {
			t.Fatalf("%d regions like %+v: err %v, want ok=%v", k, r, err, wantOK)
		}
		if err == nil {
			for i := range rs {
				if got[i] != rs[i] {
					t.Fatalf("region %d: %+v -> %+v", i, rs[i], got[i])
				}
			}
		}
		a := VringAddr{Index: uint32(n), Flags: uint32(off), Desc: gpa, Used: size, Avail: uva, Log: off}
		if got, err := DecodeVringAddr(a.Encode(nil)); got != a || err != nil {
			t.Fatalf("vring addr %+v -> %+v, %v", a, got, err)
		}
	})
}
