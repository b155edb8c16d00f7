//go:build amd64 && !race

package atomicrel

import (
	"sync/atomic"
	"unsafe"
)

// StoreUint64 stores v into *p with release order: a plain MOV. On amd64
// every store has release order (x86-TSO), and the compiler emits a
// function's stores in the order the function makes them (its SSA threads
// every store, and every load, through one memory state, and schedules
// them in that order), so the caller's earlier stores are not moved after
// this one. It inlines, leaving the caller one instruction and no call,
// which lets the data path's small functions that publish with it (a spin
// lock's Unlock, a queue's produce and take) inline in turn.
// atomic.Uint64 and atomic.Uint32 hold their value at offset 0, aligned.
func StoreUint64(p *atomic.Uint64, v uint64) { *(*uint64)(unsafe.Pointer(p)) = v }

// StoreUint32 stores v into *p with release order (see StoreUint64).
func StoreUint32(p *atomic.Uint32, v uint32) { *(*uint32)(unsafe.Pointer(p)) = v }
