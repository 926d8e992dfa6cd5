package frontend

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Stream sends n numbered frames from one frontend to another and checks
// at the receiver that each arrives exactly once and, per sending pair, in
// order: the judge of anything that must not lose, duplicate or reorder a
// frame while it happens (a handoff, a move). Frame i goes out on pair
// i mod the sender's pairs; its number is the frame's last 4 bytes (big
// endian). At most StreamWindow frames are in flight, fewer than a
// receive ring holds, so a frame lost is never a full ring's doing.
type Stream struct {
	n        int
	match    func([]byte) bool
	sent     atomic.Int64
	received atomic.Int64
	sendErr  chan error
	recvErr  chan error
}

// StreamWindow bounds the frames in flight.
const StreamWindow = 64

// StreamTimeout bounds a whole stream, and the wait for the window.
const StreamTimeout = 30 * time.Second

// StartStream starts the sender and the receiver; frame(i) builds frame i,
// ending in i's 4 bytes.
func StartStream(from, to *Frontend, n int, frame func(i int) []byte) *Stream {
	return StartStreamMatching(from, to, n, frame, nil)
}

// StartStreamMatching is StartStream where the receiver skips the frames
// match refuses (frames a kernel on the path sends on its own, such as
// IPv6 neighbour discovery); nil matches every frame.
func StartStreamMatching(from, to *Frontend, n int, frame func(i int) []byte, match func([]byte) bool) *Stream {
	s := &Stream{n: n, match: match, sendErr: make(chan error, 1), recvErr: make(chan error, 1)}
	pairs := from.Config().QueuePairs
	go func() { s.sendErr <- s.send(from, pairs, frame) }()
	go func() { s.recvErr <- s.receive(to, pairs) }()
	return s
}

func (s *Stream) send(from *Frontend, pairs int, frame func(i int) []byte) error {
	deadline := time.Now().Add(StreamTimeout)
	for i := range s.n {
		for int64(i)-s.received.Load() >= StreamWindow {
			if time.Now().After(deadline) {
				return fmt.Errorf("frame %d: the window stayed full (%d received)", i, s.received.Load())
			}
			time.Sleep(50 * time.Microsecond)
		}
		for {
			err := from.Send(i%pairs, frame(i))
			if err == nil {
				break
			}
			if !errors.Is(err, ErrRingFull) || time.Now().After(deadline) {
				return fmt.Errorf("frame %d: %w", i, err)
			}
			time.Sleep(time.Millisecond)
		}
		s.sent.Store(int64(i + 1))
	}
	return nil
}

func (s *Stream) receive(to *Frontend, senderPairs int) error {
	got := make([]bool, s.n)
	last := make([]int, senderPairs)
	for i := range last {
		last[i] = -1
	}
	pairs := to.Config().QueuePairs
	deadline := time.Now().Add(StreamTimeout)
	for received, p := 0, 0; received < s.n; p = (p + 1) % pairs {
		if time.Now().After(deadline) {
			var missing []int
			for i, ok := range got[:s.Sent()] {
				if !ok && len(missing) < 8 {
					missing = append(missing, i)
				}
			}
			return fmt.Errorf("%d of %d frames arrived within %v (%d sent; first missing: %v)", received, s.n, StreamTimeout, s.Sent(), missing)
		}
		fr, err := to.Recv(p, time.Millisecond)
		if errors.Is(err, ErrTimeout) {
			continue
		}
		if err != nil {
			return err
		}
		if s.match != nil && !s.match(fr) {
			continue
		}
		if len(fr) < 4 {
			return fmt.Errorf("a %d-byte frame", len(fr))
		}
		i := int(binary.BigEndian.Uint32(fr[len(fr)-4:]))
		switch {
		case i >= s.n:
			return fmt.Errorf("frame number %d out of range", i)
		case got[i]:
			return fmt.Errorf("frame %d arrived twice", i)
		case i <= last[i%senderPairs]:
			return fmt.Errorf("frame %d after %d from the same pair: reordered", i, last[i%senderPairs])
		}
		got[i], last[i%senderPairs] = true, i
		received++
		s.received.Store(int64(received))
	}
	return nil
}

// Sent is how many frames went out so far.
func (s *Stream) Sent() int { return int(s.sent.Load()) }

// Wait returns once every frame arrived, or with what went wrong.
func (s *Stream) Wait() error {
	if err := <-s.recvErr; err != nil {
		return fmt.Errorf("receive: %w", err)
	}
	if err := <-s.sendErr; err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}
