package dataplane

import (
	"encoding/binary"
	"encoding/json"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/frontend"
	"github.com/vhostmq/vhostmq/dataplane/handoff"
	"github.com/vhostmq/vhostmq/dataplane/netdev"
)

// TestExportDescribesTheLiveSession: a frozen port's export (the first half
// of a handoff, #17) carries what the frontend negotiated, its memory table
// with fds that map the guest's very memory, and every ring at a position
// that equals the used index the guest sees; it crosses the handoff wire
// whole.
func TestExportDescribesTheLiveSession(t *testing.T) {
	d := newDataplane(t)
	a := dial(t, addPort(t, d, "a", netdev.RoleServer, 2), frontend.Config{QueuePairs: 2})
	b := dial(t, addPort(t, d, "b", netdev.RoleServer, 1), frontend.Config{})
	learn(t, a, b, 1)
	for i := range 20 {
		if err := sendRetry(a, 0, numbered(macB, macA, i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		if _, err := b.Recv(0, 2*time.Second); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
	}
	p, ok := d.Port("a")
	if !ok {
		t.Fatal("no port a")
	}
	unfreeze := p.Freeze()
	st, fds, err := p.Export()
	unfreeze()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()

	info := a.Info()
	if st.Features != info.Features || !st.FeaturesSet || st.ProtocolFeatures != info.ProtocolFeatures || !st.Owned {
		t.Errorf("negotiated state: features %#x set %v protocol %#x owned %v; frontend acked %#x, %#x",
			st.Features, st.FeaturesSet, st.ProtocolFeatures, st.Owned, info.Features, info.ProtocolFeatures)
	}
	regs := a.Regions()
	if len(st.Regions) != len(regs) {
		t.Fatalf("%d regions exported, the frontend has %d", len(st.Regions), len(regs))
	}
	for i, r := range regs {
		e := st.Regions[i]
		if e.GPA != r.GuestPhysAddr || e.Size != r.Size || e.UVA != r.UserAddr || e.MmapOffset != r.MmapOffset {
			t.Errorf("region %d: exported %+v, frontend %+v", i, e, r)
		}
	}
	if st.Log != nil {
		t.Errorf("a dirty log exported without SET_LOG_BASE: %+v", st.Log)
	}
	// usedIdx reads a ring's used index through the exported region fds:
	// the guest's memory as the successor would map it
	usedIdx := func(uva uint64) uint16 {
		t.Helper()
		for _, r := range st.Regions {
			if uva < r.UVA || uva+4 > r.UVA+r.Size {
				continue
			}
			m, err := unix.Mmap(fds[r.FD], 0, int(r.MmapOffset+r.Size), unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(m)
			off := r.MmapOffset + uva - r.UVA
			return binary.LittleEndian.Uint16(m[off+2:])
		}
		t.Fatalf("used ring at %#x in no exported region", uva)
		return 0
	}
	if len(st.Vrings) != 4 {
		t.Fatalf("%d vrings exported, want 4", len(st.Vrings))
	}
	for _, v := range st.Vrings {
		if v.Addr == nil || !v.Started || !v.Enabled || v.Kick < 0 || v.Call < 0 || v.Num == 0 || v.Broken != "" {
			t.Errorf("vring %d not exported as a running ring: %+v", v.Index, v)
			continue
		}
		if u := usedIdx(v.Addr.Used); u != v.Base {
			t.Errorf("vring %d: exported base %d, the guest's used index %d (a chain in hand at the freeze?)", v.Index, v.Base, u)
		}
	}
	if st.Vrings[1].Base < 21 {
		t.Errorf("a's TX ring exported at %d, it sent 21 frames", st.Vrings[1].Base)
	}

	// across the handoff wire: whole, fds included
	st.Spec = json.RawMessage(`{"id":"a"}`)
	oldEnd, newEnd := handoffPair(t)
	sent := make(chan error, 1)
	go func() {
		sent <- oldEnd.Send(handoff.KindState, handoff.State{Build: "test", Ports: []handoff.Port{st}}, fds)
	}()
	var got handoff.State
	rfds, err := newEnd.Recv(handoff.KindState, &got)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, fd := range rfds {
			unix.Close(fd)
		}
	}()
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := got.Check(len(rfds)); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(st)
	have, _ := json.Marshal(got.Ports[0])
	if string(want) != string(have) || len(rfds) != len(fds) {
		t.Errorf("the state changed on the wire:\n sent %s\n got  %s (%d of %d fds)", want, have, len(rfds), len(fds))
	}
}

// halt stops the worker's goroutine so that a test can run its passes by
// hand, with every ring active (a sleeping worker parked them: active.go).
func (w *worker) halt() {
	w.stopping.Store(true)
	w.wake()
	<-w.done
	for _, a := range w.list.Load().list {
		a.parked = false
		a.swept.Store(false)
	}
	w.seen = nil
}
