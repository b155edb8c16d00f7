//go:build amd64 && !race

package atomicrel

import "sync/atomic"

// storeUint64 is a plain MOV (store_amd64.s); the call is a compiler
// barrier. atomic.Uint64 holds its value at offset 0, 8-byte aligned.
//
//go:noescape
func storeUint64(p *atomic.Uint64, v uint64)
