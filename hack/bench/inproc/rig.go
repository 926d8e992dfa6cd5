package inproc

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vhostmq/vhostmq/dataplane"
	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// Rig is a dataplane and the Go frontends playing its ports' guests, with
// a temporary directory for their sockets: what every in-process
// benchmark sets up before it measures.
type Rig struct {
	D   *dataplane.Dataplane
	dir string
	fes []*frontend.Frontend
}

// NewRig starts a dataplane with cfg; a nil cfg.Logger discards the log
// (a benchmark prints TSV on stdout, and the dataplane's lines would be
// noise on stderr).
func NewRig(cfg dataplane.Config) (*Rig, error) {
	dir, err := os.MkdirTemp("", "vmq-bench")
	if err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d, err := dataplane.New(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Rig{D: d, dir: dir}, nil
}

// Add adds a server port (one queue pair, MTU 1500; port security allows
// mac only, or anything if mac is nil) and dials it with a frontend. The
// dial is retried for a second: the port listens on its socket a little
// after AddPort returns.
func (r *Rig) Add(name string, mac net.HardwareAddr, opts dataplane.PortOptions, cfg frontend.Config) (*frontend.Frontend, error) {
	sock := filepath.Join(r.dir, name+".sock")
	if err := r.D.AddPort(netdev.Config{Name: name, Socket: sock, Role: netdev.RoleServer, QueuePairs: 1, MTU: 1500, MAC: mac}, opts); err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		f, err := frontend.Dial(sock, cfg)
		if err == nil {
			r.fes = append(r.fes, f)
			return f, nil
		}
		if try == 50 {
			return nil, fmt.Errorf("dialling port %s: %w", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close closes the frontends, then the dataplane, and removes the
// sockets' directory.
func (r *Rig) Close() {
	for _, f := range r.fes {
		f.Close()
	}
	r.D.Close()
	os.RemoveAll(r.dir)
}

// Greet has from send a broadcast from mac and each of to receive it, so
// that the switch has learned mac: frames to it are then switched to its
// port alone, not flooded to every port.
func Greet(from *frontend.Frontend, mac [6]byte, to ...*frontend.Frontend) error {
	if err := from.Send(0, Frame(Broadcast, mac)); err != nil {
		return fmt.Errorf("greeting from %x: %w", mac, err)
	}
	for _, f := range to {
		if _, err := f.Recv(0, 5*time.Second); err != nil {
			return fmt.Errorf("greeting from %x: %w", mac, err)
		}
	}
	from.ReclaimTx(0)
	return nil
}

// ParsePolling reads a polling mode as the flags and the API spell it.
func ParsePolling(s string) (dataplane.Polling, error) {
	for _, m := range []dataplane.Polling{dataplane.PollAdaptive, dataplane.PollInterrupt, dataplane.PollBusy} {
		if strings.TrimSpace(s) == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%q is not adaptive, interrupt or busy", s)
}

// Burst is n frames of size bytes from src to dst, for SendBurst.
func Burst(dst, src [6]byte, size, n int) [][]byte {
	b := make([][]byte, n)
	for i := range b {
		b[i] = FrameOf(dst, src, size)
	}
	return b
}

// Pump is a busy pair's guests in the calling goroutine: it sends burst
// on a and drains b, as fast as their rings take them, until stop says
// so, and returns the frames b received. b's frames are discarded, not
// copied out: garbage would bring collections, whose stop-the-world
// pauses halt the dataplane's workers too and grow with the heap (the
// idle ports' Go frontends are in it), which no real guest causes.
func Pump(a, b *frontend.Frontend, burst [][]byte, stop func() bool) (uint64, error) {
	var got uint64
	for !stop() {
		if _, err := a.SendBurst(0, burst); err != nil && !errors.Is(err, frontend.ErrRingFull) {
			return got, fmt.Errorf("sending: %w", err)
		}
		n, _, err := b.Discard(0)
		if err != nil {
			return got, fmt.Errorf("receiving: %w", err)
		}
		got += uint64(n)
		a.ReclaimTx(0)
	}
	return got, nil
}
