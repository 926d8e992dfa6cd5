//go:build !race

package dataplane

const raceDetector = false
