//go:build !amd64 || race

package release

import "sync/atomic"

// Store32 stores v at p with release order.
func Store32(p *uint32, v uint32) { atomic.StoreUint32(p, v) }

// Store64 stores v at p with release order; p must be 8-aligned.
func Store64(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
