//go:build !amd64

package perftest

// useTSC is false: stamp reads the monotonic clock.
const useTSC = false

func rdtsc() int64 { return 0 }
