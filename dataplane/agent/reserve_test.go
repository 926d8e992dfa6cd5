package agent

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// TestReservations: the agent is the one owner of the slots when two
// Kubernetes paths hand them out. A reservation takes free slots on
// distinct CPUs and keeps them from every other reservation and from ports
// that do not name it; asking again is idempotent, asking for something
// else is refused naming the field; claims are unhealthy to the device
// plugin; reservations survive a restart and Release frees them.
func TestReservations(t *testing.T) {
	dir := shortDir(t)
	e := start(t, dir, []int{0, 1}, 2) // 4 slots: c0-s0 c0-s1 c1-s0 c1-s1
	ctx := context.Background()
	reserve := func(r *agentv1.ReserveRequest) (*agentv1.Reservation, error) { return e.client.Reserve(ctx, r) }

	for _, bad := range []struct {
		req   *agentv1.ReserveRequest
		code  codes.Code
		field string
	}{
		{&agentv1.ReserveRequest{Owner: "", Count: 1}, codes.InvalidArgument, "owner"},
		{&agentv1.ReserveRequest{Owner: "claim/a b", Count: 1}, codes.InvalidArgument, "owner"},
		{&agentv1.ReserveRequest{Owner: strings.Repeat("x", 129), Count: 1}, codes.InvalidArgument, "owner"},
		{&agentv1.ReserveRequest{Owner: "claim/x"}, codes.InvalidArgument, "count"},
		{&agentv1.ReserveRequest{Owner: "claim/x", Count: 1, Slots: []string{"c0-s0"}}, codes.InvalidArgument, "slots, count"},
		{&agentv1.ReserveRequest{Owner: "claim/x", Slots: []string{"c9-s9"}}, codes.InvalidArgument, "slots[0]"},
		{&agentv1.ReserveRequest{Owner: "claim/x", Slots: []string{"c0-s0", "c0-s0"}}, codes.InvalidArgument, "slots[1]"},
		{&agentv1.ReserveRequest{Owner: "claim/x", Count: 1, Pods: []string{""}}, codes.InvalidArgument, "pods[0]"},
		{&agentv1.ReserveRequest{Owner: "claim/x", Count: 5}, codes.ResourceExhausted, "count"},
	} {
		if _, err := reserve(bad.req); code(err) != bad.code || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("Reserve(%v): %v, want %v naming %q", bad.req, err, bad.code, bad.field)
		}
	}
	if l, _ := e.client.ListReservations(ctx, &agentv1.ListReservationsRequest{}); len(l.GetReservations()) != 0 {
		t.Fatalf("refused requests left reservations: %v", l)
	}

	// A claim of 2: distinct CPUs, one NUMA node; idempotent.
	claim, err := reserve(&agentv1.ReserveRequest{Owner: "claim/uid-1", Count: 2, Pods: []string{"pod-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(claim.Slots) != 2 || claim.Slots[0][:2] == claim.Slots[1][:2] {
		t.Fatalf("claim of 2 got %v, want two slots on distinct CPUs", claim.Slots)
	}
	again, err := reserve(&agentv1.ReserveRequest{Owner: "claim/uid-1", Count: 2, Pods: []string{"pod-2"}})
	if err != nil || !slices.Equal(again.Slots, claim.Slots) || !slices.Equal(again.Pods, []string{"pod-1", "pod-2"}) {
		t.Fatalf("the same claim again: %v %v, want slots %v for pods pod-1, pod-2", again, err, claim.Slots)
	}
	if _, err := reserve(&agentv1.ReserveRequest{Owner: "claim/uid-1", Count: 1}); code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "count 2") {
		t.Errorf("the claim with another count: %v, want AlreadyExists naming count 2", err)
	}
	// Its slots are nobody else's: not another reservation's, not a port's
	// that does not name it.
	if _, err := reserve(&agentv1.ReserveRequest{Owner: "alloc/dir-1", Slots: []string{claim.Slots[0]}}); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `reserved by "claim/uid-1"`) {
		t.Errorf("a claimed slot reserved again: %v", err)
	}
	s := e.spec("p", 1)
	s.Slots = []string{claim.Slots[1]}
	if _, err := e.create(s); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "spec.slots[0]") {
		t.Errorf("a port on a claimed slot without naming the claim: %v", err)
	}
	s = e.spec("q", 1)
	s.Reservation = "claim/nope"
	if _, err := e.create(s); code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "spec.reservation") {
		t.Errorf("a port naming no reservation: %v", err)
	}
	// The device plugin's allocation takes the other two; automatic
	// placement then finds nothing free.
	if err := os.Mkdir(filepath.Join(e.root, "dir-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	alloc, err := reserve(&agentv1.ReserveRequest{Owner: "alloc/dir-1", Count: 2, Pods: []string{"pod-3"}})
	if err != nil {
		t.Fatal(err)
	}
	if overlap := slices.ContainsFunc(alloc.Slots, func(id string) bool { return slices.Contains(claim.Slots, id) }); overlap {
		t.Fatalf("allocation %v shares a slot with claim %v", alloc.Slots, claim.Slots)
	}
	if _, err := e.create(e.spec("auto", 1)); code(err) != codes.ResourceExhausted {
		t.Errorf("automatic placement with every slot reserved: %v, want ResourceExhausted", err)
	}
	if _, err := reserve(&agentv1.ReserveRequest{Owner: "claim/uid-2", Count: 1}); code(err) != codes.ResourceExhausted {
		t.Errorf("a claim with nothing free: %v, want ResourceExhausted", err)
	}

	// The claim's port gets exactly its slots.
	s = e.spec("vm", 2)
	s.Reservation = "claim/uid-1"
	p, err := e.create(s)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range p.Status.Queues {
		got = append(got, q.Slot)
	}
	if !sameSet(got, claim.Slots) {
		t.Errorf("the claim's port is on %v, want %v", got, claim.Slots)
	}

	// Claims are unhealthy for the device plugin, allocations are not.
	for _, sh := range e.ag.health.compute().Slots {
		claimed := slices.Contains(claim.Slots, sh.Id)
		if sh.Healthy == claimed || claimed && !strings.Contains(sh.Reason, "claim/uid-1") {
			t.Errorf("slot %s: healthy %v (%q); claimed %v", sh.Id, sh.Healthy, sh.Reason, claimed)
		}
	}
	// Only the pod's reservations when asked by pod.
	if l, _ := e.client.ListReservations(ctx, &agentv1.ListReservationsRequest{Pod: "pod-3"}); len(l.GetReservations()) != 1 || l.Reservations[0].Owner != "alloc/dir-1" {
		t.Errorf("reservations of pod-3: %v", l)
	}

	// The next process restores both, with the port on the claim's slots.
	e.stop()
	stored, err := os.ReadFile(filepath.Join(e.state, stateName))
	if err != nil || !strings.Contains(string(stored), `"schemaVersion": 3`) {
		t.Fatalf("state file with reservations: %v\n%s", err, stored)
	}
	e2 := start(t, dir, []int{0, 1}, 2)
	l, err := e2.client.ListReservations(ctx, &agentv1.ListReservationsRequest{})
	if err != nil || len(l.Reservations) != 2 || !sameSet(l.Reservations[1].Slots, claim.Slots) || !sameSet(l.Reservations[0].Slots, alloc.Slots) {
		t.Fatalf("restored reservations %v (%v), want alloc %v and claim %v", l, err, alloc.Slots, claim.Slots)
	}
	if _, err := e2.client.Release(ctx, &agentv1.ReleaseRequest{Owner: "alloc/dir-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e2.client.Release(ctx, &agentv1.ReleaseRequest{Owner: "alloc/dir-1"}); err != nil {
		t.Errorf("releasing twice: %v", err)
	}
	if _, err := e2.create(e2.spec("auto", 2)); err != nil {
		t.Errorf("a port on the released slots: %v", err)
	}
}

// An allocation whose directory is gone loses its reservation without a
// Release (the device plugin's came while the agent was down).
func TestReservationOfGoneAllocation(t *testing.T) {
	e2 := start(t, shortDir(t), []int{0, 1}, 2)
	ctx := context.Background()
	gone := filepath.Join(e2.root, "dir-2")
	if err := os.Mkdir(gone, 0o755); err != nil {
		t.Fatal(err)
	}
	held, err := e2.client.Reserve(ctx, &agentv1.ReserveRequest{Owner: "alloc/dir-2", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e2.client.Reserve(ctx, &agentv1.ReserveRequest{Owner: "claim/uid-3", Slots: held.Slots}); code(err) != codes.FailedPrecondition {
		t.Errorf("a claim on a live allocation's slot: %v, want FailedPrecondition", err)
	}
	os.Remove(gone)
	if l, _ := e2.client.ListReservations(ctx, &agentv1.ListReservationsRequest{}); slices.ContainsFunc(l.GetReservations(), func(r *agentv1.Reservation) bool { return r.Owner == "alloc/dir-2" }) {
		t.Errorf("alloc/dir-2 still listed after its directory went: %v", l)
	}
	if _, err := e2.client.Reserve(ctx, &agentv1.ReserveRequest{Owner: "claim/uid-3", Slots: held.Slots}); err != nil {
		t.Errorf("a claim on the slot of an allocation whose directory went: %v", err)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
