//go:build !amd64 || race

package atomicrel

import "sync/atomic"

// StoreUint64 stores v into *p with release order: sync/atomic's store, on
// other architectures, and under the race detector, which must see the
// store's ordering.
func StoreUint64(p *atomic.Uint64, v uint64) { p.Store(v) }

// StoreUint32 stores v into *p with release order (see StoreUint64).
func StoreUint32(p *atomic.Uint32, v uint32) { p.Store(v) }
