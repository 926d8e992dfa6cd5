// Package docscheck holds no code: its tests (docscheck_test.go, run by
// `go test ./...` and so by `make test`) keep the Markdown documentation
// and the code from drifting apart:
//
//   - every annotation the code reads (the vhostmq.io/ and
//     kubernetes.io/*-bandwidth Annotation* constants) is documented, and
//     every vhostmq.io/ name the documentation mentions exists in the code;
//   - every vhostmq_ metric the dataplane serves is documented
//     (docs/reference/metrics.md), and every vhostmq_ name the
//     documentation mentions exists;
//   - every relative link of the documentation resolves: its file exists
//     and its #anchor is a heading of the target as GitHub slugifies it.
//
// They read the Go sources with go/parser and the Markdown as text, with
// the standard library only. A failure names file:line and what is wrong.
package docscheck
