package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// Reservations make the agent the one owner of the queue slots when two
// Kubernetes paths hand them out on one node (#18): the device plugin
// reserves what the kubelet allocated ("alloc/<dir>"), the DRA driver
// what it prepares for a claim ("claim/<uid>"). A slot reserved, or used
// by a port, is never reserved again; a port takes a reserved slot only
// when it names the reservation. Reservations are stored with the ports.

var ownerRE = regexp.MustCompile(`^[A-Za-z0-9/._-]{1,128}$`)

// reservation is one owner's slots.
type reservation struct {
	owner string
	slots []*slot
	pods  []string
	numa  int
}

func (r *reservation) proto() *agentv1.Reservation {
	return &agentv1.Reservation{Owner: r.owner, Slots: idsOf(r.slots), Pods: slices.Clone(r.pods), NumaNode: int32(r.numa)}
}

// Reserve implements the API.
func (a *Agent) Reserve(_ context.Context, req *agentv1.ReserveRequest) (*agentv1.Reservation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handing {
		return nil, errHanding
	}
	r, err := a.reserveLocked(req, true)
	if err != nil {
		return nil, err
	}
	return r.proto(), nil
}

// sweepAllocationsLocked drops the device plugin's reservations whose
// allocation directory (under the socket root) is gone: the plugin removes
// it when the kubelet frees the allocation, and its Release may never come
// (the agent down at that moment, the node's pod being deleted). Called
// before slots are counted or reserved, so nothing waits on a lost Release.
func (a *Agent) sweepAllocationsLocked() {
	if a.handing { // the successor owns the state file now
		return
	}
	changed := false
	for owner, r := range a.reservations {
		dir, ok := strings.CutPrefix(owner, agentv1.OwnerAllocation)
		if !ok || strings.Contains(dir, "/") || dir == "" || dir == "." || dir == ".." {
			continue
		}
		if _, err := os.Lstat(filepath.Join(a.cfg.SocketRoot, dir)); !os.IsNotExist(err) {
			continue
		}
		a.releaseLocked(r)
		a.log.Info("reservation dropped: its allocation directory is gone", "owner", owner, "slots", slotIDs(r.slots))
		changed = true
	}
	if changed {
		if err := a.saveLocked(); err != nil {
			a.log.Warn("saving state after dropping reservations", "err", err)
		}
	}
}

// reserveLocked reserves, and saves the state file when save is set.
func (a *Agent) reserveLocked(req *agentv1.ReserveRequest, save bool) (*reservation, error) {
	owner := req.GetOwner()
	if save {
		a.sweepAllocationsLocked()
	}
	switch {
	case !ownerRE.MatchString(owner):
		return nil, status.Errorf(codes.InvalidArgument, "owner: %q must be 1..128 of [A-Za-z0-9/._-]", owner)
	case len(req.GetSlots()) > 0 && req.GetCount() > 0:
		return nil, status.Error(codes.InvalidArgument, "slots, count: give the slots or a count, not both")
	case len(req.GetSlots()) == 0 && req.GetCount() == 0:
		return nil, status.Error(codes.InvalidArgument, "count: give the slots or a count of at least 1")
	}
	for i, p := range req.GetPods() {
		if p == "" || len(p) > 128 {
			return nil, status.Errorf(codes.InvalidArgument, "pods[%d]: %q is not a pod UID", i, p)
		}
	}
	if r, ok := a.reservations[owner]; ok {
		if why := r.differs(req); why != "" {
			return nil, status.Errorf(codes.AlreadyExists, "owner: %q holds a reservation with %s", owner, why)
		}
		if added := r.addPods(req.GetPods()); added && save {
			if err := a.saveLocked(); err != nil {
				return nil, status.Errorf(codes.Internal, "saving state: %v", err)
			}
		}
		return r, nil
	}
	var chosen []*slot
	if len(req.GetSlots()) > 0 {
		seen := map[string]bool{}
		for i, id := range req.GetSlots() {
			s := a.slotByID(id)
			switch {
			case s == nil:
				return nil, status.Errorf(codes.InvalidArgument, "slots[%d]: no slot %q on this node", i, id)
			case seen[id]:
				return nil, status.Errorf(codes.InvalidArgument, "slots[%d]: %s is named twice", i, id)
			case s.reserved != "":
				return nil, status.Errorf(codes.FailedPrecondition, "slots[%d]: %s is reserved by %q", i, id, s.reserved)
			case s.owner != "":
				return nil, status.Errorf(codes.FailedPrecondition, "slots[%d]: %s is in use by port %q", i, id, s.owner)
			}
			seen[id] = true
			chosen = append(chosen, s)
		}
	} else {
		var node *int
		if req.NumaNode != nil {
			n := int(req.GetNumaNode())
			node = &n
		}
		if chosen = a.freeOnOneNode(int(req.GetCount()), node); chosen == nil {
			return nil, status.Errorf(codes.ResourceExhausted, "count: no NUMA node%s has %d free queue slots (free per node: %s)",
				map[bool]string{true: fmt.Sprintf(" (numa_node %d)", req.GetNumaNode()), false: ""}[node != nil], req.GetCount(), a.freePerNode())
		}
	}
	r := &reservation{owner: owner, slots: chosen, pods: slices.Clone(req.GetPods()), numa: chosen[0].numa}
	for _, s := range chosen {
		s.reserved = owner
	}
	a.reservations[owner] = r
	if save {
		if err := a.saveLocked(); err != nil {
			a.releaseLocked(r)
			return nil, status.Errorf(codes.Internal, "saving state: %v", err)
		}
	}
	a.log.Info("slots reserved", "owner", owner, "slots", slotIDs(chosen), "pods", r.pods)
	return r, nil
}

// differs says how req asks for something else than r ("" if it asks for
// r): other slots, another count or NUMA node.
func (r *reservation) differs(req *agentv1.ReserveRequest) string {
	have := idsOf(r.slots)
	if len(req.GetSlots()) > 0 {
		want := slices.Clone(req.GetSlots())
		sort.Strings(want)
		got := slices.Clone(have)
		sort.Strings(got)
		if !slices.Equal(want, got) {
			return "slots " + strings.Join(have, ",")
		}
		return ""
	}
	if int(req.GetCount()) != len(r.slots) {
		return fmt.Sprintf("count %d", len(r.slots))
	}
	if req.NumaNode != nil && int(req.GetNumaNode()) != r.numa {
		return fmt.Sprintf("numa_node %d", r.numa)
	}
	return ""
}

// addPods adds the pods r does not have yet (a claim used by one more
// pod); true if it added any.
func (r *reservation) addPods(pods []string) bool {
	added := false
	for _, p := range pods {
		if !slices.Contains(r.pods, p) {
			r.pods = append(r.pods, p)
			added = true
		}
	}
	return added
}

// freeOnOneNode picks n slots neither reserved nor used, all on one NUMA
// node (node, or the first one with enough), on distinct CPUs first; nil
// if no node has n.
func (a *Agent) freeOnOneNode(n int, node *int) []*slot {
	byNode := map[int][]*slot{}
	var nodes []int
	for _, s := range a.slots {
		if s.owner != "" || s.reserved != "" || node != nil && s.numa != *node {
			continue
		}
		if _, ok := byNode[s.numa]; !ok {
			nodes = append(nodes, s.numa)
		}
		byNode[s.numa] = append(byNode[s.numa], s)
	}
	sort.Ints(nodes)
	for _, nd := range nodes {
		if free := distinctCPUsFirst(byNode[nd]); len(free) >= n {
			return free[:n]
		}
	}
	return nil
}

// freePerNode says how many slots are free on each NUMA node, for errors.
func (a *Agent) freePerNode() string {
	free := map[int]int{}
	var nodes []int
	for _, s := range a.slots {
		if _, ok := free[s.numa]; !ok {
			nodes = append(nodes, s.numa)
			free[s.numa] = 0
		}
		if s.owner == "" && s.reserved == "" {
			free[s.numa]++
		}
	}
	sort.Ints(nodes)
	var parts []string
	for _, nd := range nodes {
		parts = append(parts, fmt.Sprintf("node %d: %d", nd, free[nd]))
	}
	return strings.Join(parts, ", ")
}

// Release implements the API.
func (a *Agent) Release(_ context.Context, req *agentv1.ReleaseRequest) (*agentv1.ReleaseResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.handing {
		return nil, errHanding
	}
	r, ok := a.reservations[req.GetOwner()]
	if !ok {
		return &agentv1.ReleaseResponse{}, nil
	}
	a.releaseLocked(r)
	if err := a.saveLocked(); err != nil {
		return nil, status.Errorf(codes.Internal, "saving state: %v", err)
	}
	a.log.Info("slots released", "owner", r.owner, "slots", slotIDs(r.slots))
	return &agentv1.ReleaseResponse{}, nil
}

func (a *Agent) releaseLocked(r *reservation) {
	for _, s := range r.slots {
		if s.reserved == r.owner {
			s.reserved = ""
		}
	}
	delete(a.reservations, r.owner)
}

// ListReservations implements the API.
func (a *Agent) ListReservations(_ context.Context, req *agentv1.ListReservationsRequest) (*agentv1.ListReservationsResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweepAllocationsLocked()
	out := &agentv1.ListReservationsResponse{}
	for _, r := range a.reservations {
		if req.GetPod() == "" || slices.Contains(r.pods, req.GetPod()) {
			out.Reservations = append(out.Reservations, r.proto())
		}
	}
	sort.Slice(out.Reservations, func(i, j int) bool { return out.Reservations[i].Owner < out.Reservations[j].Owner })
	return out, nil
}

// restoreReservations takes the stored reservations back (before the
// stored ports, which may name them); one that no longer fits this node
// (a slot gone or taken twice) is dropped with a log line.
func (a *Agent) restoreReservations(stored []*agentv1.Reservation) {
	for _, sr := range stored {
		if _, err := a.reserveLocked(&agentv1.ReserveRequest{Owner: sr.GetOwner(), Slots: sr.GetSlots(), Pods: sr.GetPods()}, false); err != nil {
			a.log.Error("stored reservation dropped", "owner", sr.GetOwner(), "slots", sr.GetSlots(), "err", err)
		}
	}
}

// reservationsLocked lists the reservations for the state file.
func (a *Agent) reservationsLocked() []*agentv1.Reservation {
	var out []*agentv1.Reservation
	for _, r := range a.reservations {
		out = append(out, r.proto())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Owner < out[j].Owner })
	return out
}

func idsOf(slots []*slot) []string {
	ids := make([]string, len(slots))
	for i, s := range slots {
		ids[i] = s.id
	}
	return ids
}
