package netdev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A handoff (dataplane/handoff, docs/architecture.md) moves a live port to
// a successor process. On the old side the port is suspended (its session
// parked between two vhost-user messages), frozen (Freeze: its rings at a
// burst boundary), exported, and then either handed over (HandedOver:
// this process stops touching the session, which the successor now
// serves) or resumed (Resume: the handoff failed, nothing changed).

// suspender parks a port's session between two messages. A session waits
// for each message before reading it (next); Suspend wakes that wait with
// a read deadline in the past, so no message is ever cut in half, and a
// message being handled is finished first.
type suspender struct {
	mu      sync.Mutex
	want    bool          // Suspend asked and no Resume since
	resume  chan struct{} // closed by Resume
	c       *net.UnixConn // the running session's socket
	reading bool          // the session is inside a message
	parked  bool          // the session waits for Resume
	notify  chan struct{} // closed (and replaced) when parked or c changes
}

func (s *suspender) signal() {
	if s.notify != nil {
		close(s.notify)
	}
	s.notify = make(chan struct{})
}

// next waits until c has a message to read and marks the session as
// reading it; while the port is suspended it parks instead, and goes on
// after Resume.
func (s *suspender) next(ctx context.Context, p *Port, c *net.UnixConn) error {
	for {
		s.mu.Lock()
		if s.c != c {
			s.c = c
			s.signal()
		}
		if s.want {
			s.parked = true
			resume := s.resume
			s.signal()
			s.mu.Unlock()
			select {
			case <-resume:
			case <-ctx.Done():
				return net.ErrClosed
			}
			s.mu.Lock()
			s.parked = false
			s.mu.Unlock()
			if p.owned.Load() {
				c.SetReadDeadline(time.Time{})
			} else {
				c.SetReadDeadline(time.Now().Add(p.handshakeTimeout()))
			}
			continue
		}
		s.mu.Unlock()
		err := waitReadable(c)
		s.mu.Lock()
		if s.want {
			s.mu.Unlock()
			continue // park before the message: it stays in the socket
		}
		if err != nil {
			s.mu.Unlock()
			return err
		}
		s.reading = true
		s.mu.Unlock()
		return nil
	}
}

// done marks the end of a message.
func (s *suspender) done() {
	s.mu.Lock()
	s.reading = false
	s.mu.Unlock()
}

// end marks the end of a session.
func (s *suspender) end() {
	s.mu.Lock()
	s.c, s.reading, s.parked = nil, false, false
	s.signal()
	s.mu.Unlock()
}

// suspended reports whether a handoff holds the port.
func (s *suspender) suspended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.want
}

// waitDial holds a client-role port's dialling while it is suspended; false
// once the port closes.
func (s *suspender) waitDial(ctx context.Context) bool {
	s.mu.Lock()
	want, resume := s.want, s.resume
	s.mu.Unlock()
	if !want {
		return true
	}
	select {
	case <-resume:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitReadable returns when c has data (or a hang-up) to read, without
// reading any: a deadline ends the wait with os.ErrDeadlineExceeded.
func waitReadable(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		return err != nil || n > 0
	})
}

// ErrSuspended is returned by Suspend when a handoff already holds the port.
var ErrSuspended = errors.New("port is already suspended for a handoff")

// Suspend parks the port's session between two vhost-user messages (after
// the one being handled, if any) and stops it from taking a new
// connection, for a handoff; the frontend's next message waits in the
// socket. It returns once the session is parked or there is none. Resume
// undoes it; so does a timeout.
func (p *Port) Suspend(timeout time.Duration) error {
	s := &p.sus
	s.mu.Lock()
	if s.want {
		s.mu.Unlock()
		return fmt.Errorf("port %q: %w", p.cfg.Name, ErrSuspended)
	}
	s.want, s.resume = true, make(chan struct{})
	if s.notify == nil {
		s.notify = make(chan struct{})
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		if s.c == nil || s.parked {
			s.mu.Unlock()
			return nil
		}
		if !s.reading {
			s.c.SetReadDeadline(time.Unix(1, 0)) // wakes waitReadable
		}
		ch := s.notify
		s.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			p.Resume()
			return fmt.Errorf("port %q: the session did not pause within %v (a vhost-user request still being handled)", p.cfg.Name, timeout)
		}
		s.mu.Lock()
	}
}

// Resume lets a suspended port's session go on where it paused: the
// handoff did not happen.
func (p *Port) Resume() {
	s := &p.sus
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.want {
		s.want = false
		close(s.resume)
	}
}

// HandedOver ends this process's part in the port's session once the
// successor has taken it: every ring stops (no worker touches it again),
// this process's copies of the eventfds are closed, and the sockets the
// successor now holds are no longer this port's to remove (Close then
// neither unlinks the listening socket nor tells the frontend anything:
// closing a duplicated fd does not close the connection). The caller has
// the port suspended and frozen, and closes the port after unfreezing it.
func (p *Port) HandedOver() {
	for _, v := range p.vrings {
		v.stop()
		p.dropKick(v)
		closeFD(&v.callFD)
		closeFD(&v.errFD)
		v.enabled = false
		p.changed(v)
	}
	if p.ln != nil {
		p.ln.SetUnlinkOnClose(false)
	}
	p.log.Info("port handed over to the successor process")
}
