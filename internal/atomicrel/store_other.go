//go:build !amd64 || race

package atomicrel

import "sync/atomic"

// storeUint64 is sync/atomic's store: on other architectures, and under
// the race detector, which must see the store's ordering.
func storeUint64(p *atomic.Uint64, v uint64) { p.Store(v) }

// storeUint32: see storeUint64.
func storeUint32(p *atomic.Uint32, v uint32) { p.Store(v) }
