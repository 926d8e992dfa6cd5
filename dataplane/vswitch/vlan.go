package vswitch

import "encoding/binary"

// MaxVLAN is the largest usable 802.1Q VLAN ID (4095 is reserved).
const MaxVLAN = 4094

// VLANTagLen is the size of an 802.1Q tag.
const VLANTagLen = 4

// PushVLAN tags the frame that starts at buf[start:] with vid (priority 0)
// in place: the two MAC addresses move 4 bytes toward the front and the tag
// fills the gap. start must leave that headroom (start >= 4). It returns
// the frame's new start.
func PushVLAN(buf []byte, start int, vid int) int {
	s := start - VLANTagLen
	copy(buf[s:s+12], buf[start:start+12])
	binary.BigEndian.PutUint16(buf[s+12:], EtherTypeVLAN)
	binary.BigEndian.PutUint16(buf[s+14:], uint16(vid)&0x0fff)
	return s
}

// PopVLAN removes an outer 802.1Q tag in place and returns its VLAN ID
// and the untagged frame (the same bytes, 4 later). Untagged frames come
// back as they are with vid 0; a frame too short to hold a tag is not
// tagged.
func PopVLAN(frame []byte) (vid int, out []byte) {
	if len(frame) < 18 || binary.BigEndian.Uint16(frame[12:14]) != EtherTypeVLAN {
		return 0, frame
	}
	vid = int(binary.BigEndian.Uint16(frame[14:16]) & 0x0fff)
	copy(frame[4:16], frame[0:12])
	return vid, frame[4:]
}
