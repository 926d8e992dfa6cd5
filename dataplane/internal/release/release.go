// Package release stores a word with release order and nothing more: the
// stores before it are visible before it, but unlike sync/atomic's Store,
// an XCHG on amd64, it is no full fence and no locked instruction (#29:
// locked instructions make the worker wait for its stores to drain).
//
// For a word one goroutine writes at a time (a used ring's index, a
// counter its vring's lock serialises) and others read with atomic loads.
// On amd64 it is a plain MOV in assembly: every amd64 store has release
// order (TSO), and a call into assembly keeps the compiler from moving
// earlier stores after it. Elsewhere, and in race builds (the race
// detector does not see assembly), it is sync/atomic's Store.
package release
