package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Hello is what the new process asks with.
type Hello struct {
	// PID and Build identify the asker in the old process's log.
	PID   int    `json:"pid"`
	Build string `json:"build"`
	// Pod is the asker's pod UID, if it runs in one.
	Pod string `json:"pod,omitempty"`
	// TwoPhase asks for the exchange in two phases (Running state, Ready,
	// Final). A predecessor that predates it rejects the field and closes
	// the connection before it touches a port: the asker asks again
	// without it.
	TwoPhase bool `json:"twoPhase,omitempty"`
}

// State is everything the old process hands over, at a burst boundary
// with its workers stopped. FD fields are indexes into the message's fds
// (-1: none).
type State struct {
	Build string `json:"build"`
	// Pod is the old process's pod UID, if it runs in one: the successor
	// never hands the ports back to that pod (a restart of its container
	// before the pod is deleted).
	Pod string `json:"pod,omitempty"`
	// Deadline is when the old process stops waiting for Taken and goes
	// back to serving: a successor that cannot answer well before it
	// must refuse instead (both run on one node, on one clock).
	Deadline time.Time `json:"deadline"`
	Ports    []Port    `json:"ports"`
	// Networks are the switch's learned MAC entries and DHCP leases per
	// network, in the switch's own encoding.
	Networks json.RawMessage `json:"networks,omitempty"`
	// Uplink is the tap uplink, when the dataplane has one.
	Uplink *Uplink `json:"uplink,omitempty"`
	// Running says the sessions are parked but the rings still run: each
	// ring's Base is where it stood when the state was taken, Networks is
	// a first copy, and Final follows with what to serve from.
	Running bool `json:"running,omitempty"`
}

// Final is the last message of a two-phase exchange: what changed while
// the successor prepared, taken with every ring stopped at a burst
// boundary.
type Final struct {
	// FrozenAt is when the rings stopped: the successor reports the
	// pause from it to its serving (both run on one node, on one clock).
	FrozenAt time.Time `json:"frozenAt"`
	// Deadline is when the old process stops waiting for Taken and
	// serves again.
	Deadline time.Time `json:"deadline"`
	// Ports are State.Ports' rings, in the same order.
	Ports []FinalPort `json:"ports"`
	// Networks are the learned MAC entries at the freeze (as State's).
	Networks json.RawMessage `json:"networks,omitempty"`
}

// FinalPort is one port's rings at the freeze.
type FinalPort struct {
	Vrings []Position `json:"vrings"`
}

// Position is where one ring stopped: Base is the next avail index the
// dataplane will take, Broken why the ring stopped (as in Vring).
type Position struct {
	Index  int    `json:"index"`
	Base   uint16 `json:"base"`
	Broken string `json:"broken,omitempty"`
}

// CheckFinal verifies that f describes exactly the rings of s, port by
// port, in the same order.
func (s *State) CheckFinal(f *Final) error {
	if len(f.Ports) != len(s.Ports) {
		return fmt.Errorf("final.ports: %d ports, the state had %d", len(f.Ports), len(s.Ports))
	}
	for i, fp := range f.Ports {
		sv := s.Ports[i].Vrings
		if len(fp.Vrings) != len(sv) {
			return fmt.Errorf("final.ports[%d].vrings: %d rings, the state had %d", i, len(fp.Vrings), len(sv))
		}
		for j, v := range fp.Vrings {
			if v.Index != sv[j].Index {
				return fmt.Errorf("final.ports[%d].vrings[%d].index: %d, the state had %d", i, j, v.Index, sv[j].Index)
			}
		}
	}
	return nil
}

// Uplink is the dataplane's tap uplink: its config, to be compared with
// the successor's, and its queues (fd indexes, one per worker).
type Uplink struct {
	Kind   string `json:"kind"`
	Name   string `json:"name"`
	Attach string `json:"attach"`
	MTU    int    `json:"mtu"`
	Queues []int  `json:"queues"`
}

// Port is one vhost-user port and its live session.
type Port struct {
	// Spec is the agent's port spec (protojson of agentv1.PortSpec).
	Spec json.RawMessage `json:"spec"`
	// Listener is the listening socket (server role), Conn the vhost-user
	// connection (-1: no frontend attached).
	Listener int `json:"listener"`
	Conn     int `json:"conn"`
	// Negotiated state of the session.
	Features         uint64   `json:"features"`
	FeaturesSet      bool     `json:"featuresSet"`
	ProtocolFeatures uint64   `json:"protocolFeatures"`
	Status           uint8    `json:"status"`
	MTU              int      `json:"mtu"`
	Owned            bool     `json:"owned"`
	Regions          []Region `json:"regions"`
	Log              *Log     `json:"log,omitempty"`
	Vrings           []Vring  `json:"vrings"`
}

// Region is one guest-memory region as SET_MEM_TABLE or ADD_MEM_REG gave it.
type Region struct {
	GPA        uint64 `json:"gpa"`
	UVA        uint64 `json:"uva"`
	Size       uint64 `json:"size"`
	MmapOffset uint64 `json:"mmapOffset"`
	FD         int    `json:"fd"`
	// Adds counts the ADD_MEM_REG messages for this region still to be
	// matched by a REM_MEM_REG.
	Adds int `json:"adds"`
}

// Log is the dirty-page log of SET_LOG_BASE.
type Log struct {
	Size   uint64 `json:"size"`
	Offset uint64 `json:"offset"`
	FD     int    `json:"fd"`
}

// Vring is one ring's state. Base is the next avail index the dataplane
// will take (every chain before it has been completed).
type Vring struct {
	Index   int      `json:"index"`
	Num     int      `json:"num"`
	Base    uint16   `json:"base"`
	Addr    *Address `json:"addr,omitempty"`
	Kick    int      `json:"kick"`
	Call    int      `json:"call"`
	Err     int      `json:"err"`
	Started bool     `json:"started"`
	Enabled bool     `json:"enabled"`
	// Broken is why the ring was stopped for breaking the protocol ("" if
	// it was not).
	Broken string `json:"broken,omitempty"`
}

// Address is SET_VRING_ADDR's payload.
type Address struct {
	Flags uint32 `json:"flags"`
	Desc  uint64 `json:"desc"`
	Used  uint64 `json:"used"`
	Avail uint64 `json:"avail"`
	Log   uint64 `json:"log"`
}

// Check verifies that every fd index of s is -1 or names one of nfds fds,
// and that no fd is named twice: what the new process then closes or
// keeps is exactly what it received.
func (s *State) Check(nfds int) error {
	seen := make(map[int]string)
	use := func(fd int, what string) error {
		if fd == -1 {
			return nil
		}
		if fd < 0 || fd >= nfds {
			return fmt.Errorf("%s: fd index %d outside the message's %d fds", what, fd, nfds)
		}
		if other, ok := seen[fd]; ok {
			return fmt.Errorf("%s: fd index %d also names %s", what, fd, other)
		}
		seen[fd] = what
		return nil
	}
	for i, p := range s.Ports {
		at := fmt.Sprintf("ports[%d]", i)
		if len(p.Spec) == 0 {
			return fmt.Errorf("%s.spec: missing", at)
		}
		if err := use(p.Listener, at+".listener"); err != nil {
			return err
		}
		if err := use(p.Conn, at+".conn"); err != nil {
			return err
		}
		for j, r := range p.Regions {
			if r.FD == -1 {
				return fmt.Errorf("%s.regions[%d].fd: a region needs its fd", at, j)
			}
			if err := use(r.FD, fmt.Sprintf("%s.regions[%d].fd", at, j)); err != nil {
				return err
			}
		}
		if p.Log != nil {
			if err := use(p.Log.FD, at+".log.fd"); err != nil {
				return err
			}
		}
		for j, v := range p.Vrings {
			vat := fmt.Sprintf("%s.vrings[%d]", at, j)
			for _, f := range []struct {
				fd   int
				name string
			}{{v.Kick, "kick"}, {v.Call, "call"}, {v.Err, "err"}} {
				if err := use(f.fd, vat+"."+f.name); err != nil {
					return err
				}
			}
		}
	}
	if u := s.Uplink; u != nil {
		if len(u.Queues) == 0 {
			return errors.New("uplink.queues: none")
		}
		for i, fd := range u.Queues {
			if fd == -1 {
				return fmt.Errorf("uplink.queues[%d]: a queue needs its fd", i)
			}
			if err := use(fd, fmt.Sprintf("uplink.queues[%d]", i)); err != nil {
				return err
			}
		}
	}
	return nil
}
