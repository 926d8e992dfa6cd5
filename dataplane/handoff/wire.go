// Package handoff carries a running dataplane's live state to its successor
// over a unix socket: a versioned JSON document per message plus the file
// descriptors it names (vhost-user connections and listeners, guest-memory
// regions, eventfds, the dirty log), passed with SCM_RIGHTS.
//
// The format is strict on purpose: a message of another format version, a
// field this version does not know, or an fd index outside the message
// fails the exchange cleanly, and the caller falls back to a reconnect
// rather than resuming from state it misread.
package handoff

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/internal/scmrights"
)

// Version is the format version this package reads and writes.
const Version = 1

// Kind names a message.
type Kind uint16

// The exchange: the new process sends Hello, the old one answers State
// (or Refused), the new one answers Taken once it holds every port, not
// yet serving them (or Refused), and the old one answers Released once it
// stopped touching them for good: only then does the new one serve. Until
// it reads Taken the old process may still go back to serving (on
// Refused or a broken exchange); after it, never.
//
// In two phases (Hello.TwoPhase), so that the rings stop only for the
// last step: the old process sends State with its sessions parked but its
// rings still running (State.Running), the new one sets every port up
// (memory mapped, rings built, workers placed) and answers Ready; only
// then does the old one stop its rings and send Final, their positions;
// the new one answers Taken as above.
const (
	KindHello Kind = iota + 1
	KindState
	KindTaken
	KindRefused
	KindReleased
	KindReady
	KindFinal
)

func (k Kind) String() string {
	switch k {
	case KindHello:
		return "hello"
	case KindState:
		return "state"
	case KindTaken:
		return "taken"
	case KindRefused:
		return "refused"
	case KindReleased:
		return "released"
	case KindReady:
		return "ready"
	case KindFinal:
		return "final"
	}
	return fmt.Sprintf("kind(%d)", uint16(k))
}

// Limits of one message. maxFDsPerFrame stays below the kernel's
// SCM_MAX_FD (253); a message with more fds sends them in several frames.
const (
	maxBody        = 64 << 20
	maxFDs         = 16384
	maxFDsPerFrame = 250
	headerSize     = 16
)

var magic = [4]byte{'V', 'M', 'Q', 'H'}

// ErrRefused is returned by Recv when the peer sent Refused; the error
// carries its reason.
var ErrRefused = errors.New("handoff refused by the peer")

// Conn is one end of a handoff exchange.
type Conn struct {
	c *net.UnixConn
	// pending are fds received ahead of the message that names them
	pending []int
}

// NewConn wraps a connected unix stream socket.
func NewConn(c *net.UnixConn) *Conn { return &Conn{c: c} }

// SetDeadline bounds the exchange's reads and writes (time.Time{}: none).
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

// Close closes the socket and any fds received but not yet handed out.
func (c *Conn) Close() error {
	scmrights.Close(c.pending)
	c.pending = nil
	return c.c.Close()
}

// header: magic, format version, kind, body length, fd count.
func header(kind Kind, bodyLen, nfds int) []byte {
	h := make([]byte, headerSize)
	copy(h, magic[:])
	binary.LittleEndian.PutUint16(h[4:], Version)
	binary.LittleEndian.PutUint16(h[6:], uint16(kind))
	binary.LittleEndian.PutUint32(h[8:], uint32(bodyLen))
	binary.LittleEndian.PutUint32(h[12:], uint32(nfds))
	return h
}

// Send writes one message: body as JSON and fds, in that order. The fds
// stay open on this side (the caller closes them once the peer said Taken).
func (c *Conn) Send(kind Kind, body any, fds []int) error {
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("handoff: encoding %s: %w", kind, err)
	}
	if len(b) > maxBody {
		return fmt.Errorf("handoff: %s body of %d bytes exceeds %d", kind, len(b), maxBody)
	}
	if len(fds) > maxFDs {
		return fmt.Errorf("handoff: %s carries %d fds, more than %d", kind, len(fds), maxFDs)
	}
	first := fds[:min(len(fds), maxFDsPerFrame)]
	if err := c.write(append(header(kind, len(b), len(fds)), b...), first); err != nil {
		return err
	}
	// the rest: one byte each frame, so that every batch of fds rides on
	// data of its own (the kernel never merges data with rights of another
	// sendmsg)
	for rest := fds[len(first):]; len(rest) > 0; {
		n := min(len(rest), maxFDsPerFrame)
		if err := c.write([]byte{0}, rest[:n]); err != nil {
			return err
		}
		rest = rest[n:]
	}
	return nil
}

func (c *Conn) write(data []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for len(data) > 0 || len(oob) > 0 {
		n, _, err := c.c.WriteMsgUnix(data, oob, nil)
		if err != nil {
			return fmt.Errorf("handoff: write: %w", err)
		}
		data, oob = data[n:], nil
	}
	return nil
}

// Recv reads one message of kind want into body (a pointer), refusing
// fields body does not have. It returns the message's fds, which the
// caller owns. A Refused message is returned as an error wrapping
// ErrRefused with the peer's reason.
func (c *Conn) Recv(want Kind, body any) (_ []int, err error) {
	defer func() {
		if err != nil {
			// a failed exchange keeps nothing it received
			scmrights.Close(c.pending)
			c.pending = nil
		}
	}()
	h := make([]byte, headerSize)
	if err := c.readFull(h); err != nil {
		return nil, err
	}
	if !bytes.Equal(h[:4], magic[:]) {
		return nil, fmt.Errorf("handoff: not a handoff message (magic %q)", h[:4])
	}
	if v := binary.LittleEndian.Uint16(h[4:]); v != Version {
		return nil, fmt.Errorf("handoff: format version %d, this side reads %d", v, Version)
	}
	kind := Kind(binary.LittleEndian.Uint16(h[6:]))
	bodyLen := binary.LittleEndian.Uint32(h[8:])
	nfds := binary.LittleEndian.Uint32(h[12:])
	if bodyLen > maxBody || nfds > maxFDs {
		return nil, fmt.Errorf("handoff: %s of %d bytes and %d fds exceeds the limits (%d, %d)", kind, bodyLen, nfds, maxBody, maxFDs)
	}
	b := make([]byte, bodyLen)
	if err := c.readFull(b); err != nil {
		return nil, err
	}
	// fds beyond the first frame come with one byte each
	for uint32(len(c.pending)) < nfds {
		one := make([]byte, 1)
		before := len(c.pending)
		if err := c.readFull(one); err != nil {
			return nil, fmt.Errorf("handoff: %s announced %d fds, %d arrived: %w", kind, nfds, before, err)
		}
		if len(c.pending) == before {
			return nil, fmt.Errorf("handoff: %s announced %d fds, %d arrived", kind, nfds, before)
		}
	}
	if uint32(len(c.pending)) != nfds {
		return nil, fmt.Errorf("handoff: %s announced %d fds, %d arrived", kind, nfds, len(c.pending))
	}
	fds := c.pending
	c.pending = nil
	if kind == KindRefused {
		scmrights.Close(fds)
		var r Refusal
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%w (reason unreadable: %v)", ErrRefused, err)
		}
		return nil, fmt.Errorf("%w: %s", ErrRefused, r.Reason)
	}
	if kind != want {
		scmrights.Close(fds)
		return nil, fmt.Errorf("handoff: got %s, want %s", kind, want)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(body); err != nil {
		scmrights.Close(fds)
		return nil, fmt.Errorf("handoff: %s: %w", kind, err)
	}
	if d.More() {
		scmrights.Close(fds)
		return nil, fmt.Errorf("handoff: %s: data after the document", kind)
	}
	return fds, nil
}

// readFull reads len(p) bytes, collecting every fd that arrives with them.
func (c *Conn) readFull(p []byte) error {
	oob := make([]byte, unix.CmsgSpace(maxFDsPerFrame*4))
	for len(p) > 0 {
		n, oobn, flags, _, err := c.c.ReadMsgUnix(p, oob)
		if oobn > 0 {
			fds, perr := scmrights.Parse(oob[:oobn])
			c.pending = append(c.pending, fds...)
			if perr != nil && err == nil {
				err = perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 && err == nil {
			err = errors.New("handoff: fds truncated (more than one frame's worth at once)")
		}
		if err == nil && n == 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("handoff: read: %w", err)
		}
		p = p[n:]
	}
	return nil
}

// Refusal is the body of a Refused message.
type Refusal struct {
	Reason string `json:"reason"`
}

// Refuse tells the peer why the exchange ends here.
func (c *Conn) Refuse(reason string) error {
	return c.Send(KindRefused, Refusal{Reason: reason}, nil)
}
