package config

import (
	"strings"
	"testing"
	"time"

	"github.com/vhostmq/vhostmq/dataplane"
)

func TestRebalance(t *testing.T) {
	c, err := Parse([]byte("cpus: [0]\nrebalance: {intervalSeconds: 10, threshold: 80, improvement: 30, crossNUMA: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := dataplane.RebalanceConfig{Interval: 10 * time.Second, Threshold: 80, Improvement: 30, CrossNUMA: true}
	if got := c.RebalanceConfig(); got != want {
		t.Errorf("RebalanceConfig() = %+v, want %+v", got, want)
	}
	c, err = Parse([]byte("cpus: [0]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.RebalanceConfig(); got != (dataplane.RebalanceConfig{}) {
		t.Errorf("absent: %+v, want off", got)
	}
	for y, field := range map[string]string{
		"rebalance: {intervalSeconds: -1}":  "rebalance.intervalSeconds",
		"rebalance: {threshold: 101}":       "rebalance.threshold",
		"rebalance: {improvement: -5}":      "rebalance.improvement",
		"rebalance: {intervalSeconds: 1.5}": "rebalance.intervalSeconds",
		"rebalance: {interval: 5}":          "interval",
	} {
		_, err := Parse([]byte("cpus: [0]\n" + y + "\n"))
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err %v, want one naming %s", y, err, field)
		}
	}
}

func TestWatchdog(t *testing.T) {
	c, err := Parse([]byte("cpus: [0]\nwatchdog: {stallMillis: 250, ringDumpSeconds: 5}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := dataplane.WatchdogConfig{Bound: 250 * time.Millisecond, RingDump: 5 * time.Second}
	if got := c.WatchdogConfig(); got != want {
		t.Errorf("WatchdogConfig() = %+v, want %+v", got, want)
	}
	c, err = Parse([]byte("cpus: [0]\nwatchdog: {stallMillis: -1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.WatchdogConfig(); got.Bound >= 0 {
		t.Errorf("stallMillis -1: %+v, want off (negative bound)", got)
	}
	for y, field := range map[string]string{
		"watchdog: {stallMillis: -2}":     "watchdog.stallMillis",
		"watchdog: {stallMillis: 70000}":  "watchdog.stallMillis",
		"watchdog: {ringDumpSeconds: -1}": "watchdog.ringDumpSeconds",
		"watchdog: {stall: 5}":            "stall",
	} {
		_, err := Parse([]byte("cpus: [0]\n" + y + "\n"))
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err %v, want one naming %s", y, err, field)
		}
	}
}
