package afxdp

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// groupBatch is how many group frames one receive takes at most.
const groupBatch = 8

// groupSocket is the AF_PACKET socket through which a shared NIC's
// broadcast and multicast frames reach the dataplane as a copy, after the
// XDP program passed them to the kernel: a classic BPF filter keeps only
// frames with the I/G bit set, PACKET_IGNORE_OUTGOING drops the host's own,
// and PACKET_AUXDATA gives back the VLAN tag the kernel took off.
type groupSocket struct {
	fd   int
	bufs [groupBatch][vlanLen + FrameSize]byte
	iov  unix.Iovec
	msg  unix.Msghdr
	cbuf [64]byte

	Truncated uint64 // longer than FrameSize: dropped
}

const vlanLen = 4

func openGroupSocket(ifindex int) (*groupSocket, error) {
	// Protocol 0 receives nothing until bind, so no frame slips past the
	// filter.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket(AF_PACKET): %w", err)
	}
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 0},
		{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, Jt: 0, Jf: 1, K: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	steps := []struct {
		what string
		err  func() error
	}{
		{"SO_ATTACH_FILTER", func() error { return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog) }},
		{"PACKET_IGNORE_OUTGOING", func() error { return unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1) }},
		{"PACKET_AUXDATA", func() error { return unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1) }},
		{"bind", func() error {
			return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex})
		}},
	}
	for _, s := range steps {
		if err := s.err(); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("group frames: %s: %w", s.what, err)
		}
	}
	return &groupSocket{fd: fd}, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// receive reads up to len(frames) frames (valid until the next receive).
func (g *groupSocket) receive(frames [][]byte) int {
	got := 0
	for got < min(len(frames), groupBatch) {
		buf := g.bufs[got][:]
		g.iov.Base = &buf[vlanLen]
		g.iov.SetLen(FrameSize)
		g.msg.Iov = &g.iov
		g.msg.Iovlen = 1
		g.msg.Control = &g.cbuf[0]
		g.msg.SetControllen(len(g.cbuf))
		g.msg.Flags = 0
		n, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(g.fd), uintptr(unsafe.Pointer(&g.msg)), unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		if e != 0 {
			break // EAGAIN: empty
		}
		if int(n) > FrameSize || g.msg.Flags&unix.MSG_TRUNC != 0 {
			g.Truncated++
			continue
		}
		frame := buf[vlanLen : vlanLen+int(n)]
		if tci, tpid, ok := g.vlan(); ok && len(frame) >= 12 {
			// put the tag back where the kernel took it from
			copy(buf[0:12], frame[0:12])
			binary.BigEndian.PutUint16(buf[12:], tpid)
			binary.BigEndian.PutUint16(buf[14:], tci)
			frame = buf[0 : vlanLen+int(n)]
		}
		frames[got] = frame
		got++
	}
	return got
}

// vlan finds the VLAN tag in the PACKET_AUXDATA control message.
func (g *groupSocket) vlan() (tci, tpid uint16, ok bool) {
	c := g.cbuf[:min(g.msg.Controllen, uint64(len(g.cbuf)))]
	for len(c) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		if h.Len < unix.SizeofCmsghdr || h.Len > uint64(len(c)) {
			return 0, 0, false
		}
		size := int(h.Len) // <= len(c)
		if h.Level == unix.SOL_PACKET && h.Type == unix.PACKET_AUXDATA && size >= unix.CmsgLen(int(unsafe.Sizeof(unix.TpacketAuxdata{}))) {
			var aux unix.TpacketAuxdata
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&aux)), unsafe.Sizeof(aux)), c[unix.CmsgLen(0):size])
			if aux.Status&unix.TP_STATUS_VLAN_VALID == 0 {
				return 0, 0, false
			}
			tpid = 0x8100
			if aux.Status&unix.TP_STATUS_VLAN_TPID_VALID != 0 {
				tpid = aux.Vlan_tpid
			}
			return aux.Vlan_tci, tpid, true
		}
		c = c[min(unix.CmsgSpace(size-unix.CmsgLen(0)), len(c)):]
	}
	return 0, 0, false
}

func (g *groupSocket) close() { unix.Close(g.fd) }
