package vswitch

import (
	"bytes"
	"testing"
)

func crafted() []byte {
	return []byte{
		1, 2, 3, 4, 5, 6, // dst
		7, 8, 9, 10, 11, 12, // src
		0x08, 0x00, // IPv4
		0x45, 0, 0, 20, // payload
	}
}

func TestPushVLAN(t *testing.T) {
	buf := append(make([]byte, 6), crafted()...)
	start := PushVLAN(buf, 6, 10)
	want := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x81, 0x00, 0x00, 0x0a, 0x08, 0x00, 0x45, 0, 0, 20}
	if start != 2 || !bytes.Equal(buf[start:], want) {
		t.Fatalf("tagged frame at %d: % x, want % x", start, buf[start:], want)
	}
	// only the low 12 bits are the VID
	buf = append(make([]byte, 4), crafted()...)
	PushVLAN(buf, 4, 4094|0xf000)
	if buf[14] != 0x0f || buf[15] != 0xfe {
		t.Errorf("TCI % x, want 0f fe", buf[14:16])
	}
}

func TestPopVLAN(t *testing.T) {
	tagged := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x81, 0x00, 0xe0, 0x14, 0x08, 0x00, 0x45, 0, 0, 20}
	vid, out := PopVLAN(tagged)
	if vid != 20 || !bytes.Equal(out, crafted()) {
		t.Fatalf("vid %d frame % x, want 20 and % x (priority bits ignored)", vid, out, crafted())
	}
	plain := crafted()
	if vid, out := PopVLAN(plain); vid != 0 || !bytes.Equal(out, crafted()) {
		t.Errorf("untagged frame: vid %d frame % x", vid, out)
	}
	short := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x81, 0x00, 0, 5}
	if vid, out := PopVLAN(short); vid != 0 || len(out) != len(short) {
		t.Errorf("a 16-byte frame was untagged: vid %d", vid)
	}
}

func TestPushPopRoundTrip(t *testing.T) {
	for vid := 1; vid <= MaxVLAN; vid += 97 {
		buf := append(make([]byte, 4), crafted()...)
		s := PushVLAN(buf, 4, vid)
		got, out := PopVLAN(buf[s:])
		if got != vid || !bytes.Equal(out, crafted()) {
			t.Fatalf("vid %d: got %d, % x", vid, got, out)
		}
	}
}
