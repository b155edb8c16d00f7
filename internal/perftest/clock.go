package perftest

import "time"

// The loops timestamp every post of a latency test (and, in bandwidth
// tests, the first post of each signaled group and every polled signaled
// completion), so the clock is part of what they measure. As
// perftest reads the CPU's cycle counter (get_cycles) rather than the
// system clock, stamp reads the time-stamp counter where the kernel
// itself keeps time with it (an invariant TSC, synchronised across
// CPUs): about a third of a vDSO clock_gettime; in a virtual machine whose
// system clock is a paravirtual one made from an invariant TSC; and in one
// whose system clock is an emulated timer, a read of which costs
// microseconds (see useTSC). toNanos turns a run's
// stamps into nanoseconds afterwards, scaled by the monotonic clock over
// the life of the process, so no calibration wait is needed.

// clockBase is a pair of readings of both clocks, taken at start-up.
var clockBase struct {
	t     time.Time
	stamp int64
}

func init() {
	clockBase.t = time.Now()
	if useTSC {
		clockBase.stamp = rdtsc()
	}
}

// stamp reads the cheap clock: the TSC when useTSC, otherwise monotonic
// nanoseconds since clockBase.
func stamp() int64 {
	if useTSC {
		return rdtsc()
	}
	return int64(time.Since(clockBase.t))
}

// toNanos converts stamps, in place, into nanoseconds since clockBase.
func toNanos(stamps ...[]int64) {
	if !useTSC {
		return
	}
	ns, ticks := time.Since(clockBase.t), rdtsc()-clockBase.stamp
	if ticks <= 0 || ns <= 0 {
		return
	}
	scale := float64(ns) / float64(ticks)
	for _, s := range stamps {
		for i, v := range s {
			s[i] = int64(float64(v-clockBase.stamp) * scale)
		}
	}
}
