package ctl

import (
	"context"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"
)

// TestTopKeys drives the screen's model as bubbletea would: two samples,
// then keys that switch the view and the sort; q quits; a failed sample
// (the agent gone) quits too, keeping the error.
func TestTopKeys(t *testing.T) {
	sock := newFakeAgent().serve(t)
	clock := statsEpoch
	c := &cli{socket: sock, output: "table", timeout: DefaultTimeout,
		now:   func() time.Time { clock = clock.Add(time.Second); return clock },
		sleep: func(context.Context, time.Duration) error { return nil }}
	m := &topModel{c: c, ctx: context.Background(), interval: time.Second}
	for range 2 {
		if _, cmd := m.Update(m.fetch()); cmd == nil {
			t.Fatal("a sample scheduled no refresh")
		}
	}
	key := func(k string) string {
		t.Helper()
		msg := tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
		if k == "tab" {
			msg = tea.KeyMsg{Type: tea.KeyTab}
		}
		if _, cmd := m.Update(msg); cmd != nil {
			t.Fatalf("key %q quit", k)
		}
		return m.View()
	}
	v := m.View()
	if !strings.Contains(v, "view: ports  sort: name") || !strings.Contains(v, "vm1-net0") || strings.Contains(v, "rates after") {
		t.Fatalf("first screen:\n%s", v)
	}
	// sorted by RX PPS, largest first: vm1-net0 (2.5 Mpps) before vm2-net0
	v = key("s")
	if !strings.Contains(v, "sort: RX PPS, largest first") || !strings.Contains(v, "RX PPS*") || strings.Index(v, "vm1-net0") > strings.Index(v, "vm2-net0") {
		t.Errorf("after s:\n%s", v)
	}
	if v = key("r"); strings.Index(v, "vm2-net0") > strings.Index(v, "vm1-net0") {
		t.Errorf("after r (smallest first) vm2-net0 should lead:\n%s", v)
	}
	if v = key("u"); !strings.Contains(v, "view: queues  sort: name") || !strings.Contains(v, "SLOT") {
		t.Errorf("queues view:\n%s", v)
	}
	if v = key("w"); !strings.Contains(v, "view: workers") || !strings.Contains(v, "UPLINK") {
		t.Errorf("workers view:\n%s", v)
	}
	if v = key("tab"); !strings.Contains(v, "view: ports") {
		t.Errorf("tab after workers:\n%s", v)
	}
	if _, cmd := m.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("q")}); cmd == nil || cmd() != tea.Quit() {
		t.Error("q did not quit")
	}

	gone := &topModel{c: &cli{socket: t.TempDir() + "/none.sock", timeout: time.Second, now: time.Now}, ctx: context.Background(), interval: time.Second}
	if _, cmd := gone.Update(gone.fetch()); cmd == nil || cmd() != tea.Quit() || gone.err == nil {
		t.Errorf("no agent: quit %v, err %v", cmd, gone.err)
	}
}
