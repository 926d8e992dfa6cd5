//go:build amd64 && !race

package release

// Store32 stores v at p with release order (a MOV).
//
//go:noescape
func Store32(p *uint32, v uint32)

// Store64 stores v at p with release order (a MOV); p must be 8-aligned.
//
//go:noescape
func Store64(p *uint64, v uint64)
