package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// table aligns columns for people; cells are tab-separated, empty cells
// print as "-".
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer) *table {
	return &table{tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
}

func (t *table) row(cells ...string) {
	for i, s := range cells {
		if s == "" {
			cells[i] = "-"
		}
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

// line writes text that is not part of the columns (it ends the current
// column block).
func (t *table) line(format string, a ...any) { fmt.Fprintf(t.tw, format+"\n", a...) }

func (t *table) flush() error { return t.tw.Flush() }

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

var siPrefixes = []string{"", "k", "M", "G", "T", "P", "E"}

// humanRate formats a per-second rate with an SI prefix and two or three
// significant digits: 950 pps, 1.2 Mpps, 12.0 Gbit/s, 250 kpps.
func humanRate(v float64, unit string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "?"
	}
	if v < 999.5 {
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	i := 0
	for (i == 0 || v >= 999.5) && i < len(siPrefixes)-1 {
		v /= 1000
		i++
	}
	if v >= 99.95 {
		return fmt.Sprintf("%.0f %s%s", v, siPrefixes[i], unit)
	}
	return fmt.Sprintf("%.1f %s%s", v, siPrefixes[i], unit)
}

func pps(v float64) string { return humanRate(v, "pps") }
func bps(v float64) string { return humanRate(v, "bit/s") }

// perSecond formats a rate whose unit is in the column header: 950, 1.2k.
func perSecond(v float64) string {
	return strings.TrimSpace(strings.Replace(humanRate(v, ""), " ", "", 1))
}

func percent(v float64) string { return fmt.Sprintf("%.1f%%", v) }

func count(n uint64) string { return strconv.FormatUint(n, 10) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func busyTime(ns uint64) string {
	return time.Duration(ns).Round(time.Millisecond).String()
}

// round3 keeps JSON rates readable: 1234.568, not 1234.5678901234.
func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

func joinInts[T ~int32 | ~uint32](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatInt(int64(v), 10)
	}
	return strings.Join(s, ",")
}

// Labels the CNI plugin sets, shown as POD.
const (
	labelPodNamespace = "k8s.pod.namespace"
	labelPodName      = "k8s.pod.name"
)

// pod names the pod a port belongs to: namespace/name, or "" when the
// labels do not say.
func pod(labels map[string]string) string {
	ns, name := labels[labelPodNamespace], labels[labelPodName]
	switch {
	case name == "":
		return ""
	case ns == "":
		return name
	}
	return ns + "/" + name
}
