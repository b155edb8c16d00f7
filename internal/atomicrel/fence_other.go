//go:build !linux || !amd64 || race

package atomicrel

// Fence is the heavy side of an asymmetric fence (see the amd64 build).
// Here StoreUint64 and StoreUint32 are sync/atomic's sequentially
// consistent stores, which no later load passes, so a goroutine that
// published with them and then loads a flag needs no help: Fence only
// orders the caller's own stores before its loads.
func Fence() { fullFence() }
