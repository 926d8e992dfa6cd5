package ctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/spf13/pflag"
	"k8s.io/utils/ptr"

	agentv1 "github.com/vhostmq/vhostmq/dataplane/api/v1"
)

// top is a full-screen view that refreshes itself, like top(1) or
// OVS-DPDK's pmd-stats-show run in a loop: ports, queue pairs or workers,
// with their rates since the last refresh. bubbletea draws it (alternate
// screen, resize, keys), so it works wherever a terminal does, kubectl
// exec -it included.

// topView is what the screen lists.
type topView int

const (
	viewPorts topView = iota
	viewQueues
	viewWorkers
)

var topViewNames = [...]string{"ports", "queues", "workers"}

// topColumns are each view's columns; the ones marked sortable (key
// != nil) can be sorted on with s, the first of them being the default.
type topColumn struct {
	head string
	key  func(r topRow) float64 // nil: not sortable
}

// topRow is one line of the table: its cells and the numbers it sorts by.
type topRow struct {
	name  string // sorted on by name (ascending) when no numeric key is chosen
	cells []string
	vals  map[string]float64
}

func byVal(k string) func(topRow) float64 { return func(r topRow) float64 { return r.vals[k] } }

var topColumnsOf = [...][]topColumn{
	viewPorts: {{"PORT", nil}, {"POD", nil}, {"CONN", nil}, {"PAIRS", nil},
		{"RX PPS", byVal("rx")}, {"RX BIT/S", byVal("rxb")}, {"TX PPS", byVal("tx")}, {"TX BIT/S", byVal("txb")},
		{"DROP/S", byVal("drop")}, {"STALLS", byVal("stalls")}, {"HELD/S", byVal("held")}, {"DROPS BY REASON /S", nil}},
	viewQueues: {{"PORT", nil}, {"PAIR", nil}, {"SLOT", nil}, {"CPU", nil},
		{"RX PPS", byVal("rx")}, {"TX PPS", byVal("tx")}, {"DROP/S", byVal("drop")}, {"BUSY", byVal("busy")},
		{"STALLS", byVal("stalls")}, {"HELD/S", byVal("held")}},
	viewWorkers: {{"CPU", nil}, {"NUMA", nil}, {"PAIRS", byVal("pairs")}, {"BUSY", byVal("busy")}, {"UPLINK", byVal("uplink")}},
}

// topModel is the screen's state (bubbletea's Model).
type topModel struct {
	c        *cli
	ctx      context.Context
	interval time.Duration

	sample  statsSample // cur: the latest; prev: the one before (nil at first)
	at      time.Time   // when cur was taken
	view    topView
	sortCol int  // index into the view's columns; 0 = by name
	reverse bool // ascending instead of the default (largest first)
	err     error
	height  int
}

type topStatsMsg struct {
	resp *agentv1.GetStatsResponse
	at   time.Time
	err  error
}
type topTickMsg struct{}

func (m *topModel) fetch() tea.Msg {
	resp, err := call(m.ctx, m.c, agentv1.AgentClient.GetStats, &agentv1.GetStatsRequest{})
	return topStatsMsg{resp: resp, at: m.c.now(), err: err}
}

func (m *topModel) Init() tea.Cmd { return m.fetch }

func (m *topModel) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	switch msg := msg.(type) {
	case topStatsMsg:
		if msg.err != nil {
			m.err = msg.err
			return m, tea.Quit
		}
		m.push(msg.resp, msg.at)
		return m, tea.Tick(m.interval, func(time.Time) tea.Msg { return topTickMsg{} })
	case topTickMsg:
		return m, m.fetch
	case tea.WindowSizeMsg:
		m.height = msg.Height
	case tea.KeyMsg:
		switch msg.String() {
		case "q", "ctrl+c", "esc":
			return m, tea.Quit
		case "p":
			m.setView(viewPorts)
		case "u":
			m.setView(viewQueues)
		case "w":
			m.setView(viewWorkers)
		case "tab":
			m.setView((m.view + 1) % topView(len(topViewNames)))
		case "s":
			cols := topColumnsOf[m.view]
			for i := 1; i <= len(cols); i++ { // the next sortable column, or by name
				n := (m.sortCol + i) % len(cols)
				if n == 0 || cols[n].key != nil {
					m.sortCol = n
					break
				}
			}
		case "r":
			m.reverse = !m.reverse
		}
	}
	return m, nil
}

func (m *topModel) setView(v topView) {
	if v != m.view {
		m.view, m.sortCol, m.reverse = v, 0, false
	}
}

// push takes a new sample; rates are over the time since the last one
// (the agent's clock when it says).
func (m *topModel) push(resp *agentv1.GetStatsResponse, at time.Time) {
	prev := m.sample.cur
	m.sample = statsSample{cur: resp, prev: prev}
	if prev != nil {
		m.sample.seconds = sampleSeconds(prev, resp, m.at, at, m.interval)
	}
	m.at = at
}

func (m *topModel) View() string {
	var b strings.Builder
	cols := topColumnsOf[m.view]
	order := "largest first"
	if m.reverse {
		order = "smallest first"
	}
	sortName := "name"
	if m.sortCol > 0 {
		sortName = cols[m.sortCol].head + ", " + order
	}
	fmt.Fprintf(&b, "vhostmq top  every %s  view: %s  sort: %s\n", m.interval, topViewNames[m.view], sortName)
	fmt.Fprintf(&b, "keys: p ports  u queues  w workers  tab next view  s sort  r reverse  q quit\n\n")
	if m.sample.cur == nil {
		b.WriteString("waiting for the agent...\n")
		return b.String()
	}
	rows := m.rows()
	if m.sortCol > 0 {
		key := cols[m.sortCol].key
		slices.SortStableFunc(rows, func(x, y topRow) int {
			if m.reverse {
				return cmp.Compare(key(x), key(y))
			}
			return cmp.Compare(key(y), key(x))
		})
	} else {
		slices.SortStableFunc(rows, func(x, y topRow) int {
			if m.reverse {
				return cmp.Compare(y.name, x.name)
			}
			return cmp.Compare(x.name, y.name)
		})
	}
	t := newTable(&b)
	heads := make([]string, len(cols))
	for i, c := range cols {
		heads[i] = c.head
		if i == m.sortCol && i > 0 {
			heads[i] += "*"
		}
	}
	t.row(heads...)
	room := len(rows)
	if m.height > 5 && room > m.height-5 {
		room = m.height - 5
	}
	for _, r := range rows[:room] {
		t.row(r.cells...)
	}
	t.flush()
	if room < len(rows) {
		fmt.Fprintf(&b, "... %d more (a taller terminal shows them)\n", len(rows)-room)
	}
	if m.sample.prev == nil {
		b.WriteString("(rates after the next refresh)\n")
	}
	return b.String()
}

// rows are the current view's lines, unsorted.
func (m *topModel) rows() []topRow {
	s := m.sample
	rated := s.prev != nil && s.seconds > 0
	rateOf := func(d *counters) rates {
		if !rated || d == nil {
			return rates{}
		}
		return d.per(s.seconds)
	}
	var out []topRow
	switch m.view {
	case viewPorts:
		for _, pr := range s.rows(nil) {
			r := rateOf(pr.delta)
			var reasons []string
			for i, v := range r.drops {
				if v > 0 {
					reasons = append(reasons, dropReasons[i]+" "+perSecond(v))
				}
			}
			owner := pod(pr.ps.GetLabels())
			if owner == "" {
				owner = "-"
			}
			out = append(out, topRow{name: pr.ps.GetId(),
				cells: []string{pr.ps.GetId(), owner, yesNo(pr.ps.GetConnected()), fmt.Sprint(len(pr.queues)),
					pps(r.rxPps), bps(r.rxBps), pps(r.txPps), bps(r.txBps), perSecond(r.dropTotal),
					count(pr.total.stalls), perSecond(r.held), strings.Join(reasons, ", ")},
				vals: map[string]float64{"rx": r.rxPps, "rxb": r.rxBps, "tx": r.txPps, "txb": r.txBps, "drop": r.dropTotal,
					"stalls": float64(pr.total.stalls), "held": r.held}})
		}
	case viewQueues:
		for _, pr := range s.rows(nil) {
			for _, q := range pr.queues {
				r := rateOf(q.delta)
				out = append(out, topRow{name: fmt.Sprintf("%s/%04d", pr.ps.GetId(), q.q.GetPair()),
					cells: []string{pr.ps.GetId(), fmt.Sprint(q.q.GetPair()), q.q.GetSlot(), fmt.Sprint(q.q.GetCpu()),
						pps(r.rxPps), pps(r.txPps), perSecond(r.dropTotal), percent(r.busyPct), count(q.cur.stalls), perSecond(r.held)},
					vals: map[string]float64{"rx": r.rxPps, "tx": r.txPps, "drop": r.dropTotal, "busy": r.busyPct,
						"stalls": float64(q.cur.stalls), "held": r.held}})
			}
		}
	case viewWorkers:
		for _, w := range workerLoads(s) { // by CPU
			busy, uplink := ptr.Deref(w.BusyPercent, 0), ptr.Deref(w.UplinkBusyPercent, 0) // nil: not measured yet
			out = append(out, topRow{name: fmt.Sprintf("%04d", w.CPU),
				cells: []string{fmt.Sprint(w.CPU), fmt.Sprint(w.NumaNode), fmt.Sprint(w.QueuePairs), percent(busy), percent(uplink)},
				vals:  map[string]float64{"pairs": float64(w.QueuePairs), "busy": busy, "uplink": uplink}})
		}
	}
	return out
}

func topSetup(fs *pflag.FlagSet) runFunc {
	interval := time.Second
	fs.Var(&durationValue{p: &interval}, "interval", "refresh every `DURATION`")
	var once bool
	fs.BoolVar(&once, "once", false, "print one screen (rates over --interval) and exit, without taking the terminal")
	return func(ctx context.Context, c *cli, _ []string) error {
		if interval <= 0 {
			return usageErrorf("--interval: %s is not positive", interval)
		}
		m := &topModel{c: c, ctx: ctx, interval: interval}
		if once {
			// the same two samples, interval apart, as stats
			s, err := c.sampleStats(ctx, nil, interval)
			if err != nil {
				return err
			}
			m.sample = s
			_, err = fmt.Fprint(c.stdout, m.View())
			return err
		}
		p := tea.NewProgram(m, tea.WithAltScreen(), tea.WithContext(ctx))
		if _, err := p.Run(); err != nil && ctx.Err() == nil {
			return err
		}
		if m.err != nil { // the agent went away: exit status 3, as when it cannot be reached
			var un *unreachableError
			if errors.As(m.err, &un) {
				return m.err
			}
			return &unreachableError{socket: c.socket, err: fmt.Errorf("lost the agent: %w", m.err)}
		}
		return nil
	}
}
