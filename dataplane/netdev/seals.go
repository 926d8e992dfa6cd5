package netdev

import (
	"fmt"

	"github.com/vhostmq/vhostmq/dataplane/guestmem"
)

// MemorySeals says whether the frontend can still take back the memory it
// shared: a file sealed against shrinking (F_SEAL_SHRINK, which QEMU's
// memory-backend-memfd sets by default) cannot be cut under the
// dataplane; hugetlbfs and plain files cannot be sealed.
type MemorySeals struct {
	Regions      int `json:"regions"`
	ShrinkSealed int `json:"shrinkSealed"` // regions whose file is sealed against shrinking
	// Log: a dirty log is mapped; LogShrinkSealed: its file is sealed
	// against shrinking
	Log             bool `json:"log"`
	LogShrinkSealed bool `json:"logShrinkSealed"`
}

// Sealed reports whether none of the memory can be taken back.
func (m MemorySeals) Sealed() bool {
	return m.ShrinkSealed == m.Regions && (!m.Log || m.LogShrinkSealed)
}

// MemorySeals reports the current session's memory seals.
func (p *Port) MemorySeals() MemorySeals {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	var m MemorySeals
	for _, r := range p.ctl.mem.Regions() {
		m.Regions++
		if r.Seals().Shrink {
			m.ShrinkSealed++
		}
	}
	if l := p.ctl.log; l != nil {
		m.Log, m.LogShrinkSealed = true, l.Seals().Shrink
	}
	return m
}

// checkSealed refuses memory whose file the frontend could shrink, when
// the port requires sealed memory (Config.RequireSealedMemory).
func (p *Port) checkSealed(what string, s guestmem.Seals) error {
	if !p.cfg.RequireSealedMemory || s.Shrink {
		return nil
	}
	why := "its file is not sealed against shrinking (F_SEAL_SHRINK)"
	if !s.Sealable {
		why = "its file cannot be sealed (not a memfd: hugetlbfs or a plain file)"
	}
	return fmt.Errorf("port %q: %s: %s, and the dataplane requires sealed memory (requireSealedMemory): "+
		"the frontend could take it back; give QEMU memory-backend-memfd with seal=on", p.cfg.Name, what, why)
}
