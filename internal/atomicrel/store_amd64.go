//go:build amd64 && !race

package atomicrel

import "sync/atomic"

// storeUint64 and storeUint32 are a plain MOV (store_amd64.s); the call
// is a compiler barrier. atomic.Uint64 and atomic.Uint32 hold their value
// at offset 0, aligned.
//
//go:noescape
func storeUint64(p *atomic.Uint64, v uint64)

//go:noescape
func storeUint32(p *atomic.Uint32, v uint32)
