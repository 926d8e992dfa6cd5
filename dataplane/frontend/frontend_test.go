package frontend

import (
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vhostmq/vhostmq/dataplane/internal/nettest"
	"github.com/vhostmq/vhostmq/dataplane/vhostuser"
	"github.com/vhostmq/vhostmq/dataplane/virtio"
)

const protoBit = uint64(1) << vhostuser.FeatureProtocolFeatures

type rec struct {
	req     vhostuser.Request
	flags   uint32
	payload []byte
	nfds    int
}

type mapping struct {
	r   vhostuser.MemRegion
	mem []byte
}

// fakeBackend answers the control protocol on one connection and records
// every message. With mapMem it maps the regions of SET_MEM_TABLE the way a
// real backend does (fd + mmap_offset).
type fakeBackend struct {
	conn                                *vhostuser.Conn
	features, proto, queueNum, maxSlots uint64
	nack                                map[vhostuser.Request]uint64
	mapMem                              bool
	mu                                  sync.Mutex
	msgs                                []rec
	maps                                []mapping
	fdSizes                             []int64
	done                                chan struct{} // closed when serve returns
	err                                 error
}

func newFakeBackend(c *net.UnixConn) *fakeBackend {
	return &fakeBackend{
		conn:     vhostuser.NewConn(c),
		features: DefaultFeatures | protoBit | 1<<virtio.NetFCsum,
		proto: 1<<vhostuser.ProtoMQ | 1<<vhostuser.ProtoReplyAck | 1<<vhostuser.ProtoStatus |
			1<<vhostuser.ProtoConfig | 1<<vhostuser.ProtoConfigureMemSlots,
		queueNum: 4,
		maxSlots: 32,
		nack:     map[vhostuser.Request]uint64{},
		done:     make(chan struct{}),
	}
}

func (b *fakeBackend) start() *fakeBackend {
	go func() { b.err = b.serve(); close(b.done) }()
	return b
}

func (b *fakeBackend) serve() error {
	defer b.conn.Close()
	for {
		m, err := b.conn.ReadMessage()
		if err != nil {
			return err
		}
		b.mu.Lock()
		b.msgs = append(b.msgs, rec{m.Request, m.Flags, append([]byte(nil), m.Payload...), len(m.FDs)})
		b.mu.Unlock()
		switch m.Request {
		case vhostuser.ReqSetMemTable:
			regs, err := vhostuser.DecodeMemTable(m.Payload)
			if err != nil {
				return err
			}
			b.mu.Lock()
			for _, fd := range m.FDs {
				var st unix.Stat_t
				if unix.Fstat(fd, &st) == nil {
					b.fdSizes = append(b.fdSizes, st.Size)
				}
			}
			if b.mapMem {
				for _, mp := range b.maps {
					unix.Munmap(mp.mem)
				}
				b.maps = nil
				for i, r := range regs {
					mem, err := unix.Mmap(m.FDs[i], int64(r.MmapOffset), int(r.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
					if err != nil {
						b.mu.Unlock()
						return err
					}
					b.maps = append(b.maps, mapping{r, mem})
				}
			}
			b.mu.Unlock()
		}
		m.CloseFDs()
		switch m.Request {
		case vhostuser.ReqGetFeatures:
			err = b.conn.ReplyU64(m, b.features)
		case vhostuser.ReqGetProtocolFeatures:
			err = b.conn.ReplyU64(m, b.proto)
		case vhostuser.ReqGetQueueNum:
			err = b.conn.ReplyU64(m, b.queueNum)
		case vhostuser.ReqGetMaxMemSlots:
			err = b.conn.ReplyU64(m, b.maxSlots)
		case vhostuser.ReqGetVringBase:
			st, _ := vhostuser.DecodeVringState(m.Payload)
			st.Num = 42
			err = b.conn.Reply(m, st.Encode(nil))
		default:
			if m.NeedReply() {
				b.mu.Lock()
				st := b.nack[m.Request]
				b.mu.Unlock()
				err = b.conn.ReplyU64(m, st)
			}
		}
		if err != nil {
			return err
		}
	}
}

func (b *fakeBackend) records() []rec {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]rec(nil), b.msgs...)
}

// ua translates a frontend user address through the backend's own mappings.
func (b *fakeBackend) ua(addr uint64, n int) []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, mp := range b.maps {
		if addr >= mp.r.UserAddr && addr+uint64(n) <= mp.r.UserAddr+mp.r.Size {
			o := addr - mp.r.UserAddr
			return mp.mem[o : o+uint64(n)]
		}
	}
	return nil
}

func (b *fakeBackend) unmap() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, mp := range b.maps {
		unix.Munmap(mp.mem)
	}
	b.maps = nil
}

// startPair connects a Frontend to a fake backend configured by prep.
func startPair(t testing.TB, cfg Config, prep func(*fakeBackend)) (*Frontend, *fakeBackend, error) {
	t.Helper()
	a, b := nettest.SocketPair(t)
	be := newFakeBackend(b)
	if prep != nil {
		prep(be)
	}
	be.start()
	f, err := New(a, cfg)
	if f != nil {
		t.Cleanup(func() {
			f.Close()
			<-be.done
			be.unmap()
		})
	} else {
		<-be.done
	}
	return f, be, err
}

func reqs(rs []rec) []vhostuser.Request {
	out := make([]vhostuser.Request, len(rs))
	for i, r := range rs {
		out[i] = r.req
	}
	return out
}

func TestSetupSequence(t *testing.T) {
	cfg := Config{QueuePairs: 2, QueueSize: 64, Regions: 3, EnablePairs: 1}
	f, be, err := startPair(t, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A GET round-trip guarantees the backend recorded everything before.
	if base, err := f.GetVringBase(3); err != nil || base != 42 {
		t.Fatalf("GetVringBase = %d, %v", base, err)
	}
	rs := be.records()
	want := []vhostuser.Request{
		vhostuser.ReqSetOwner, vhostuser.ReqGetFeatures, vhostuser.ReqGetProtocolFeatures,
		vhostuser.ReqSetProtocolFeatures, vhostuser.ReqGetQueueNum, vhostuser.ReqSetFeatures,
		vhostuser.ReqSetStatus, vhostuser.ReqSetMemTable,
	}
	for range 4 {
		want = append(want, vhostuser.ReqSetVringNum, vhostuser.ReqSetVringBase, vhostuser.ReqSetVringAddr,
			vhostuser.ReqSetVringKick, vhostuser.ReqSetVringCall)
	}
	for range 4 {
		want = append(want, vhostuser.ReqSetVringEnable)
	}
	want = append(want, vhostuser.ReqSetStatus, vhostuser.ReqGetVringBase)
	got := reqs(rs)
	if len(got) != len(want) {
		t.Fatalf("sequence:\n got %v\nwant %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("message %d: got %v, want %v\nfull: %v", i, got[i], want[i], got)
		}
	}

	info := f.Info()
	wantProto := uint64(1<<vhostuser.ProtoMQ | 1<<vhostuser.ProtoReplyAck | 1<<vhostuser.ProtoStatus)
	if info.ProtocolFeatures != wantProto || info.OfferedProtocolFeatures != be.proto || info.QueueNum != 4 {
		t.Fatalf("info %+v", info)
	}
	if info.Features != DefaultFeatures|protoBit || info.OfferedFeatures != be.features || info.HdrLen != 12 {
		t.Fatalf("features %#x (offered %#x), hdr %d", info.Features, info.OfferedFeatures, info.HdrLen)
	}

	regs := f.Regions()
	if len(regs) != 3 {
		t.Fatalf("regions %+v", regs)
	}
	var total uint64
	for i, r := range regs {
		if r.GuestPhysAddr != f.Config().GPABase+total || r.MmapOffset != total || r.UserAddr != f.UserAddr(0)+total {
			t.Fatalf("region %d %+v not contiguous", i, r)
		}
		total += r.Size
	}
	if total != uint64(len(f.Mem())) || f.Config().GPABase != 0x100000 {
		t.Fatalf("regions cover %d of %d bytes", total, len(f.Mem()))
	}
	be.mu.Lock()
	sizes := append([]int64(nil), be.fdSizes...)
	be.mu.Unlock()
	if len(sizes) != 3 || sizes[0] != int64(len(f.Mem())) {
		t.Fatalf("memfd sizes seen by backend %v", sizes)
	}

	inRegion := func(addr uint64, n int) bool {
		for _, r := range regs {
			if addr >= r.UserAddr && addr+uint64(n) <= r.UserAddr+r.Size {
				return true
			}
		}
		return false
	}
	statusN := 0
	for i, r := range rs {
		wantFDs := 0
		switch r.req {
		case vhostuser.ReqSetMemTable:
			wantFDs = 3
			mt, err := vhostuser.DecodeMemTable(r.payload)
			if err != nil || len(mt) != 3 || mt[1] != regs[1] {
				t.Fatalf("SET_MEM_TABLE payload %v %v", mt, err)
			}
		case vhostuser.ReqSetVringKick, vhostuser.ReqSetVringCall:
			wantFDs = 1
			v, _ := vhostuser.DecodeU64(r.payload)
			if v&vhostuser.VringNoFD != 0 || v > 3 {
				t.Fatalf("%v payload %#x", r.req, v)
			}
		case vhostuser.ReqSetVringAddr:
			a, err := vhostuser.DecodeVringAddr(r.payload)
			if err != nil {
				t.Fatal(err)
			}
			n := 64
			if !inRegion(a.Desc, virtio.DescSize*n) || !inRegion(a.Avail, virtio.AvailRingSize(n)) || !inRegion(a.Used, virtio.UsedRingSize(n)) {
				t.Fatalf("vring addr %+v outside the regions' user address range", a)
			}
			if a.Desc%16 != 0 || a.Avail%2 != 0 || a.Used%4 != 0 || a.Flags != 0 {
				t.Fatalf("vring addr %+v misaligned", a)
			}
			vi, _ := f.Vring(int(a.Index))
			if a.Desc != vi.DescUA || a.Avail != vi.AvailUA || a.Used != vi.UsedUA {
				t.Fatalf("vring addr %+v, layout %+v", a, vi)
			}
		case vhostuser.ReqSetVringNum, vhostuser.ReqSetVringBase:
			st, _ := vhostuser.DecodeVringState(r.payload)
			if (r.req == vhostuser.ReqSetVringNum && st.Num != 64) || (r.req == vhostuser.ReqSetVringBase && st.Num != 0) {
				t.Fatalf("%v %+v", r.req, st)
			}
		case vhostuser.ReqSetVringEnable:
			st, _ := vhostuser.DecodeVringState(r.payload)
			if wantOn := uint32(0); st.Index < 2 && st.Num != 1 || st.Index >= 2 && st.Num != wantOn {
				t.Fatalf("SET_VRING_ENABLE %+v with EnablePairs 1", st)
			}
		case vhostuser.ReqSetStatus:
			v, _ := vhostuser.DecodeU64(r.payload)
			wantV := uint64(virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK)
			if statusN == 1 {
				wantV |= virtio.StatusDriverOK
			}
			statusN++
			if v != wantV {
				t.Fatalf("SET_STATUS %#x, want %#x", v, wantV)
			}
		case vhostuser.ReqSetProtocolFeatures:
			if v, _ := vhostuser.DecodeU64(r.payload); v != wantProto {
				t.Fatalf("SET_PROTOCOL_FEATURES %#x", v)
			}
		case vhostuser.ReqSetFeatures:
			if v, _ := vhostuser.DecodeU64(r.payload); v != DefaultFeatures|protoBit {
				t.Fatalf("SET_FEATURES %#x", v)
			}
		}
		if r.nfds != wantFDs {
			t.Fatalf("message %d %v carried %d fds, want %d", i, r.req, r.nfds, wantFDs)
		}
		// NEED_REPLY exactly on setting messages after REPLY_ACK was negotiated.
		needReply := i > 3 && r.req != vhostuser.ReqGetQueueNum && r.req != vhostuser.ReqGetVringBase
		if (r.flags&vhostuser.FlagNeedReply != 0) != needReply {
			t.Fatalf("message %d %v flags %#x, want NEED_REPLY=%v", i, r.req, r.flags, needReply)
		}
	}
}

func TestReplyAckError(t *testing.T) {
	_, _, err := startPair(t, Config{}, func(b *fakeBackend) { b.nack[vhostuser.ReqSetVringAddr] = 7 })
	var ne *NackError
	if !errors.As(err, &ne) || ne.Request != vhostuser.ReqSetVringAddr || ne.Status != 7 {
		t.Fatalf("New error = %v, want NackError for SET_VRING_ADDR", err)
	}

	f, be, err := startPair(t, Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	be.mu.Lock()
	be.nack[vhostuser.ReqSetVringEnable] = 1
	be.mu.Unlock()
	if err := f.SetVringEnable(0, false); !errors.As(err, &ne) || ne.Request != vhostuser.ReqSetVringEnable {
		t.Fatalf("SetVringEnable error = %v", err)
	}
}

func TestReplyTimeout(t *testing.T) {
	a, b := nettest.SocketPair(t)
	defer b.Close()
	go func() { // reads but never answers
		c := vhostuser.NewConn(b)
		for {
			if _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}()
	_, err := New(a, Config{ReplyTimeout: 50 * time.Millisecond})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("New error = %v, want ErrTimeout", err)
	}
}

func TestNoProtocolFeatures(t *testing.T) {
	f, be, err := startPair(t, Config{Features: NoFeatures}, func(b *fakeBackend) { b.features = DefaultFeatures })
	if err != nil {
		t.Fatal(err)
	}
	f.SetVringEnable(0, true) // plain send; flushes nothing but must not hang
	f.GetVringBase(0)
	for _, r := range be.records() {
		switch r.req {
		case vhostuser.ReqGetProtocolFeatures, vhostuser.ReqSetProtocolFeatures, vhostuser.ReqGetQueueNum, vhostuser.ReqSetStatus:
			t.Fatalf("sent %v without protocol features", r.req)
		case vhostuser.ReqSetFeatures:
			if v, _ := vhostuser.DecodeU64(r.payload); v != 0 {
				t.Fatalf("SET_FEATURES %#x, want 0", v)
			}
		}
		if r.flags&vhostuser.FlagNeedReply != 0 {
			t.Fatalf("%v has NEED_REPLY without REPLY_ACK", r.req)
		}
	}
	if f.Info().HdrLen != virtio.NetHdrLegacySize {
		t.Fatalf("legacy header length %d", f.Info().HdrLen)
	}
	if _, _, err := startPair(t, Config{QueuePairs: 2}, func(b *fakeBackend) { b.features = DefaultFeatures }); err == nil {
		t.Fatal("2 pairs without MQ accepted")
	}
}

func TestQueueNumTooSmall(t *testing.T) {
	_, _, err := startPair(t, Config{QueuePairs: 3}, func(b *fakeBackend) { b.queueNum = 2 })
	if err == nil {
		t.Fatal("3 pairs accepted with GET_QUEUE_NUM 2")
	}
}

func TestMemSlotsAndMemTableChange(t *testing.T) {
	cfg := Config{Regions: 2, UseMemSlots: true,
		ProtocolFeatures: DefaultProtocolFeatures | 1<<vhostuser.ProtoConfigureMemSlots}
	f, be, err := startPair(t, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.Info().MaxMemSlots != 32 {
		t.Fatalf("max mem slots %d", f.Info().MaxMemSlots)
	}
	regs := f.Regions()
	if err := f.RemMemRegion(regs[1]); err != nil {
		t.Fatal(err)
	}
	if err := f.AddMemRegion(regs[1]); err != nil {
		t.Fatal(err)
	}
	if err := f.SetMemTable(5); err != nil {
		t.Fatal(err)
	}
	f.GetVringBase(0)
	var adds, rems, tables, gets int
	for _, r := range be.records() {
		switch r.req {
		case vhostuser.ReqAddMemReg:
			adds++
			if r.nfds != 1 {
				t.Fatalf("ADD_MEM_REG with %d fds", r.nfds)
			}
		case vhostuser.ReqRemMemReg:
			rems++
			if r.nfds != 0 {
				t.Fatalf("REM_MEM_REG with %d fds", r.nfds)
			}
		case vhostuser.ReqSetMemTable:
			tables++
			if r.nfds != 5 {
				t.Fatalf("SET_MEM_TABLE with %d fds", r.nfds)
			}
		case vhostuser.ReqGetMaxMemSlots:
			gets++
		}
	}
	if adds != 3 || rems != 1 || tables != 1 || gets != 1 {
		t.Fatalf("adds %d rems %d tables %d gets %d", adds, rems, tables, gets)
	}
	if len(f.Regions()) != 5 {
		t.Fatalf("regions after SetMemTable(5): %d", len(f.Regions()))
	}
}

func TestListenAccept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vu.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var be *fakeBackend
	dialed := make(chan error, 1)
	go func() {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err == nil {
			be = newFakeBackend(c).start()
		}
		dialed <- err
	}()
	f, err := l.Accept(Config{}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-dialed; err != nil {
		t.Fatal(err)
	}
	if f.Info().QueueNum != 4 {
		t.Fatalf("info %+v", f.Info())
	}

	// Reconnect: the backend "restarts" and dials again.
	f.Close()
	<-be.done
	f2, err := l.Accept(Config{}, 50*time.Millisecond)
	if !errors.Is(err, ErrTimeout) || f2 != nil {
		t.Fatalf("Accept with nobody dialing: %v", err)
	}
}

func TestReattach(t *testing.T) {
	f, be, err := startPair(t, Config{QueueSize: 16}, func(b *fakeBackend) { b.mapMem = true })
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := f.Send(0, make([]byte, 60)); err != nil {
			t.Fatal(err)
		}
	}
	// Pretend the old backend completed one TX chain before dying.
	dev := newTestDevice(t, f)
	if _, _, ok := dev.popTx(1); !ok {
		t.Fatal("no TX chain")
	}
	a, b := nettest.SocketPair(t)
	be2 := newFakeBackend(b)
	be2.mapMem = true
	be2.start()
	defer func() { f.Close(); <-be2.done; be2.unmap() }()
	if err := f.Reattach(a); err != nil {
		t.Fatal(err)
	}
	<-be.done
	f.GetVringBase(0)
	bases := map[uint32]uint32{}
	for _, r := range be2.records() {
		if r.req == vhostuser.ReqSetVringBase {
			st, _ := vhostuser.DecodeVringState(r.payload)
			bases[st.Index] = st.Num
		}
	}
	// RX: nothing used yet; TX: one chain used.
	if bases[0] != 0 || bases[1] != 1 {
		t.Fatalf("SET_VRING_BASE after reattach: %v", bases)
	}
	// The new backend sees the rings through its own mapping.
	vi, _ := f.Vring(1)
	if w := be2.ua(vi.AvailUA, 4); w == nil || w[2] != 3 {
		t.Fatalf("backend view of TX avail idx: %v", w)
	}
}
