// Package charts holds no code: its tests render the Helm chart in
// vhostmq/ with helm and check what it exposes (chart_test.go).
package charts
