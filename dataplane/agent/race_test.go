//go:build race

package agent

// raceDetector: this test binary runs under -race, whose atomics are
// carried out by the detector's C runtime. A fault there (a ring index
// read from memory the frontend took back) cannot become a Go panic, so
// the fault-injection tests run without -race only (make test-unit).
const raceDetector = true
