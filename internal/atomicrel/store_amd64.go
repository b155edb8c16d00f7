//go:build amd64 && !race

package atomicrel

import (
	"sync/atomic"
	"unsafe"
)

// storeUint64 and storeUint32 are a plain MOV: on amd64 every store has
// release order. The call, which the compiler may not inline, is the
// compiler barrier that keeps the caller's earlier stores before it; a Go
// function rather than an assembly one, so that the call passes its
// arguments in registers with no ABI wrapper. atomic.Uint64 and
// atomic.Uint32 hold their value at offset 0, aligned.
//
//go:noinline
func storeUint64(p *atomic.Uint64, v uint64) { *(*uint64)(unsafe.Pointer(p)) = v }

//go:noinline
func storeUint32(p *atomic.Uint32, v uint32) { *(*uint32)(unsafe.Pointer(p)) = v }
