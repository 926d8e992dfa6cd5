package vhostuser

import (
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/internal/scmrights"
)

// Message is one decoded request. Payload aliases the Conn's buffer and is
// valid until the next ReadMessage. FDs are owned by the receiver: whoever
// takes one must close it, and CloseFDs closes those left.
type Message struct {
	Request Request
	Flags   uint32
	Payload []byte
	FDs     []int
}

// NeedReply reports whether the frontend asked for a REPLY_ACK.
func (m *Message) NeedReply() bool { return m.Flags&FlagNeedReply != 0 }

// TakeFD removes and returns the i-th fd, or -1 when absent.
func (m *Message) TakeFD(i int) int {
	if i >= len(m.FDs) || m.FDs[i] < 0 {
		return -1
	}
	fd := m.FDs[i]
	m.FDs[i] = -1
	return fd
}

// CloseFDs closes every fd not taken.
func (m *Message) CloseFDs() {
	for i, fd := range m.FDs {
		if fd >= 0 {
			unix.Close(fd)
			m.FDs[i] = -1
		}
	}
}

// ProtocolError is a malformed message. It always ends the connection: the
// frontend and backend no longer agree on the stream's framing or state.
type ProtocolError struct {
	Request Request
	Reason  string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("vhost-user %s: %s", e.Request, e.Reason)
}

// ErrTooManyFDs is returned when the kernel truncated the ancillary data.
var ErrTooManyFDs = errors.New("vhost-user: message carried more file descriptors than accepted")

// recvFDCap bounds how many fds one message may carry before the kernel
// truncates the rest (and closes them). rust-vmm accepts 32.
const recvFDCap = 32

// Conn frames vhost-user messages on a unix stream socket.
type Conn struct {
	c   *net.UnixConn
	hdr [HeaderSize]byte
	buf [MaxPayload]byte
	oob []byte
}

// NewConn wraps a connected unix socket.
func NewConn(c *net.UnixConn) *Conn {
	return &Conn{c: c, oob: make([]byte, unix.CmsgSpace(recvFDCap*4))}
}

// Close closes the socket.
func (c *Conn) Close() error { return c.c.Close() }

// Raw returns the underlying socket.
func (c *Conn) Raw() *net.UnixConn { return c.c }

// ReadMessage reads one request (the backend side) and checks its framing
// and its fd count: extra fds are closed, missing ones are an error, and a
// "request" with the REPLY flag is malformed. It does not check the payload
// beyond its size; decoding does that.
func (c *Conn) ReadMessage() (*Message, error) { return c.read(false) }

// ReadReply reads one reply (the frontend side). Replies carry whatever fds
// their request implies; the caller takes or closes them.
func (c *Conn) ReadReply() (*Message, error) { return c.read(true) }

func (c *Conn) read(reply bool) (*Message, error) {
	var fds []int
	got := 0
	for got < HeaderSize {
		n, oobn, flags, _, err := c.c.ReadMsgUnix(c.hdr[got:], c.oob)
		if oobn > 0 {
			more, perr := parseRights(c.oob[:oobn])
			fds = append(fds, more...)
			if perr != nil {
				closeAll(fds)
				return nil, perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			closeAll(fds)
			return nil, ErrTooManyFDs
		}
		if err != nil {
			closeAll(fds)
			if got > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if n == 0 {
			closeAll(fds)
			return nil, io.EOF
		}
		got += n
	}
	m := &Message{
		Request: Request(le.Uint32(c.hdr[0:])),
		Flags:   le.Uint32(c.hdr[4:]),
		FDs:     fds,
	}
	size := le.Uint32(c.hdr[8:])
	if m.Flags&FlagVersionMask != Version {
		m.CloseFDs()
		return nil, &ProtocolError{m.Request, fmt.Sprintf("unsupported version %d in flags %#x", m.Flags&FlagVersionMask, m.Flags)}
	}
	if size > MaxPayload {
		m.CloseFDs()
		return nil, &ProtocolError{m.Request, fmt.Sprintf("payload size %d exceeds limit %d", size, MaxPayload)}
	}
	if (m.Flags&FlagReply != 0) != reply {
		m.CloseFDs()
		if reply {
			return nil, &ProtocolError{m.Request, fmt.Sprintf("expected a reply, flags %#x lack REPLY", m.Flags)}
		}
		return nil, &ProtocolError{m.Request, fmt.Sprintf("request has the REPLY flag set (flags %#x)", m.Flags)}
	}
	if _, err := io.ReadFull(c.c, c.buf[:size]); err != nil {
		m.CloseFDs()
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the header promised a payload
		}
		return nil, fmt.Errorf("vhost-user %s: reading %d-byte payload: %w", m.Request, size, err)
	}
	m.Payload = c.buf[:size]
	if reply {
		return m, nil
	}
	if err := CheckFDs(m); err != nil {
		m.CloseFDs()
		return nil, err
	}
	return m, nil
}

// ExpectedFDs returns how many fds a well-formed message of this kind
// carries: exactly min..max. It reads only what it needs from the payload;
// a short payload yields (0, 0) and is rejected later when decoded.
func ExpectedFDs(req Request, payload []byte) (min, max int) {
	switch req {
	case ReqSetMemTable:
		if len(payload) >= 4 {
			n := int(le.Uint32(payload))
			if n > MaxMemTableRegion {
				n = MaxMemTableRegion
			}
			return n, n
		}
	case ReqSetVringKick, ReqSetVringCall, ReqSetVringErr:
		if len(payload) == U64Size && le.Uint64(payload)&VringNoFD == 0 {
			return 1, 1
		}
	case ReqSetLogBase, ReqSetLogFD, ReqAddMemReg, ReqSetBackendReqFD, ReqSetInflightFD:
		return 1, 1
	case ReqRemMemReg:
		return 0, 1 // may carry the region's fd, which must be closed
	}
	return 0, 0
}

// CheckFDs enforces ExpectedFDs: missing fds are a ProtocolError, extra fds
// beyond max are closed and dropped from m.FDs.
func CheckFDs(m *Message) error {
	min, max := ExpectedFDs(m.Request, m.Payload)
	if len(m.FDs) < min {
		return &ProtocolError{m.Request, fmt.Sprintf("carries %d file descriptors, needs %d", len(m.FDs), min)}
	}
	if len(m.FDs) > max {
		closeAll(m.FDs[max:])
		m.FDs = m.FDs[:max]
	}
	return nil
}

// WriteMessage sends one message with optional fds.
func (c *Conn) WriteMessage(req Request, flags uint32, payload []byte, fds []int) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("vhost-user %s: payload %d bytes exceeds %d", req, len(payload), MaxPayload)
	}
	b := make([]byte, 0, HeaderSize+len(payload))
	b = le.AppendUint32(b, uint32(req))
	b = le.AppendUint32(b, flags|Version)
	b = le.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := c.c.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return fmt.Errorf("vhost-user %s: write: %w", req, err)
	}
	if n != len(b) {
		return fmt.Errorf("vhost-user %s: short write %d of %d", req, n, len(b))
	}
	return nil
}

// Reply answers m with payload.
func (c *Conn) Reply(m *Message, payload []byte) error {
	return c.WriteMessage(m.Request, FlagReply, payload, nil)
}

// ReplyU64 answers m with a u64 payload.
func (c *Conn) ReplyU64(m *Message, v uint64) error {
	var b [U64Size]byte
	le.PutUint64(b[:], v)
	return c.Reply(m, b[:])
}

func parseRights(oob []byte) ([]int, error) {
	fds, err := scmrights.Parse(oob)
	if err != nil {
		return nil, fmt.Errorf("vhost-user: %w", err)
	}
	return fds, nil
}

func closeAll(fds []int) { scmrights.Close(fds) }
