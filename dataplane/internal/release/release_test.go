package release

import "testing"

// TestStore: the value lands where it is asked, and only there.
func TestStore(t *testing.T) {
	var w [3]uint32
	Store32(&w[1], 0xdeadbeef)
	if w != [3]uint32{0, 0xdeadbeef, 0} {
		t.Errorf("Store32: %#x", w)
	}
	var d [3]uint64
	Store64(&d[1], 0x0123456789abcdef)
	if d != [3]uint64{0, 0x0123456789abcdef, 0} {
		t.Errorf("Store64: %#x", d)
	}
}
