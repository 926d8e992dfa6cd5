package handoff

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/internal/scmrights"
)

// pair is a connected pair of handoff ends.
func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	ca, cb := nettest.SocketPair(t)
	a, b := NewConn(ca), NewConn(cb)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// eventfds makes n eventfds, each counter set to its index+1 so the
// receiver can tell them apart and in order.
func eventfds(t *testing.T, n int) []int {
	t.Helper()
	var fds []int
	for i := range n {
		fd, err := unix.Eventfd(uint(i+1), unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	t.Cleanup(func() { scmrights.Close(fds) })
	return fds
}

func counter(t *testing.T, fd int) uint64 {
	t.Helper()
	var b [8]byte
	if _, err := unix.Read(fd, b[:]); err != nil {
		t.Fatalf("reading eventfd %d: %v", fd, err)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// TestStateRoundTrip: a state naming more fds than one frame carries
// arrives whole, every fd in its place (the eventfd counters say which).
func TestStateRoundTrip(t *testing.T) {
	old, succ := pair(t)
	const n = 3*maxFDsPerFrame + 7
	fds := eventfds(t, n)
	st := State{Build: "test", Ports: []Port{{Spec: json.RawMessage(`{"id":"a"}`), Listener: -1, Conn: 0, Features: 1 << 32, MTU: 1500,
		Regions: []Region{{GPA: 0, UVA: 0x7f00_0000_0000, Size: 1 << 30, FD: 1}},
		Vrings:  []Vring{{Index: 0, Num: 256, Base: 65535, Kick: 2, Call: 3, Err: -1, Enabled: true, Addr: &Address{Desc: 1, Used: 2, Avail: 3}}}}}}
	done := make(chan error, 1)
	go func() { done <- old.Send(KindState, st, fds) }()
	var got State
	rfds, err := succ.Recv(KindState, &got)
	if err != nil {
		t.Fatal(err)
	}
	defer scmrights.Close(rfds)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(rfds) != n {
		t.Fatalf("%d fds arrived, want %d", len(rfds), n)
	}
	for i, fd := range rfds {
		if c := counter(t, fd); c != uint64(i+1) {
			t.Fatalf("fd %d carries counter %d, want %d (out of order?)", i, c, i+1)
		}
	}
	if err := got.Check(len(rfds)); err != nil {
		t.Fatal(err)
	}
	if got.Ports[0].Vrings[0].Base != 65535 || got.Ports[0].Regions[0].UVA != 0x7f00_0000_0000 || got.Ports[0].Features != 1<<32 {
		t.Errorf("state changed on the way: %+v", got.Ports[0])
	}
	// the exchange goes on: Taken back
	go func() { done <- succ.Send(KindTaken, struct{}{}, nil) }()
	if _, err := old.Recv(KindTaken, &struct{}{}); err != nil {
		t.Fatal(err)
	}
	<-done
}

// TestStrict: what this version cannot read ends the exchange with an
// error naming it, and no fd of the message is left open.
func TestStrict(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(c *Conn, fds []int) error
		want string
	}{
		{"unknown field", func(c *Conn, fds []int) error {
			return c.Send(KindState, map[string]any{"build": "x", "ports": []any{}, "futureField": 1}, fds)
		}, `unknown field "futureField"`},
		{"other kind", func(c *Conn, fds []int) error { return c.Send(KindHello, Hello{PID: 1}, fds) }, "got hello, want state"},
		{"refused", func(c *Conn, fds []int) error { return c.Refuse("version 9 is too new") }, "version 9 is too new"},
		{"other version", func(c *Conn, fds []int) error {
			h := header(KindState, 2, 0)
			binary.LittleEndian.PutUint16(h[4:], Version+1)
			return c.write(append(h, '{', '}'), nil)
		}, "format version 2"},
		{"not a handoff", func(c *Conn, fds []int) error { return c.write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), nil) }, "not a handoff message"},
		{"fewer fds than announced", func(c *Conn, fds []int) error {
			return c.write(append(header(KindState, 2, 5), '{', '}'), fds[:2])
		}, "announced 5 fds"},
		{"peer gone mid-message", func(c *Conn, fds []int) error {
			err := c.write(header(KindState, 100, 0), nil)
			c.c.CloseWrite()
			return err
		}, "unexpected EOF"},
		{"huge body", func(c *Conn, fds []int) error { return c.write(header(KindState, maxBody+1, 0), nil) }, "exceeds the limits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t)
			fds := eventfds(t, 3)
			done := make(chan error, 1)
			go func() {
				err := tc.send(a, fds)
				a.c.CloseWrite()
				done <- err
			}()
			var st State
			got, err := b.Recv(KindState, &st)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Recv: %v, %v; want an error naming %q", got, err, tc.want)
			}
			if tc.name == "refused" && !errors.Is(err, ErrRefused) {
				t.Errorf("a Refused message is not ErrRefused: %v", err)
			}
			if got != nil {
				t.Errorf("fds handed out with an error: %v", got)
			}
			<-done
		})
	}
}

// TestCheck: fd indexes outside the message, used twice, or a region
// without its fd are refused naming the field.
func TestCheck(t *testing.T) {
	base := func() State {
		return State{Ports: []Port{{Spec: json.RawMessage(`{}`), Listener: 0, Conn: 1,
			Regions: []Region{{FD: 2}}, Log: &Log{FD: 3}, Vrings: []Vring{{Kick: 4, Call: 5, Err: -1}}}}}
	}
	if s := base(); s.Check(6) != nil {
		t.Fatalf("a good state refused: %v", s.Check(6))
	}
	for _, tc := range []struct {
		edit func(*State)
		want string
	}{
		{func(s *State) { s.Ports[0].Vrings[0].Call = 6 }, "ports[0].vrings[0].call: fd index 6 outside"},
		{func(s *State) { s.Ports[0].Vrings[0].Kick = 2 }, "ports[0].vrings[0].kick: fd index 2 also names ports[0].regions[0].fd"},
		{func(s *State) { s.Ports[0].Regions[0].FD = -1 }, "ports[0].regions[0].fd: a region needs its fd"},
		{func(s *State) { s.Ports[0].Conn = -7 }, "ports[0].conn: fd index -7"},
		{func(s *State) { s.Ports[0].Spec = nil }, "ports[0].spec: missing"},
		{func(s *State) { s.Uplink = &Uplink{Kind: "tap"} }, "uplink.queues: none"},
		{func(s *State) { s.Uplink = &Uplink{Queues: []int{-1}} }, "uplink.queues[0]: a queue needs its fd"},
		{func(s *State) { s.Uplink = &Uplink{Queues: []int{5}} }, "uplink.queues[0]: fd index 5 also names ports[0].vrings[0].call"},
		{func(s *State) { s.Uplink = &Uplink{Queues: []int{6}} }, "uplink.queues[0]: fd index 6 outside"},
	} {
		s := base()
		tc.edit(&s)
		if err := s.Check(6); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check: %v, want %q", err, tc.want)
		}
	}
}

// FuzzRecv: whatever bytes arrive, Recv returns an error or a decoded
// state, never panics, and never hands out fds with an error.
func FuzzRecv(f *testing.F) {
	f.Add(append(header(KindState, 2, 0), '{', '}'))
	f.Add(append(header(KindState, 13, 0), []byte(`{"ports":[{}]}`)...))
	f.Add(header(KindRefused, 0, 0))
	f.Add([]byte("VMQH"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := pair(t)
		go func() {
			a.write(data, nil)
			a.c.CloseWrite()
		}()
		var st State
		fds, err := b.Recv(KindState, &st)
		if err != nil && fds != nil {
			t.Fatalf("fds %v with error %v", fds, err)
		}
		if err == nil {
			_ = st.Check(len(fds))
			scmrights.Close(fds)
		}
	})
}
