package perftest

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// TestLatencyStats checks perftest's conventions on samples whose order
// statistics are known: 10 posts give 9 gaps of 1..9 µs (shuffled); the
// two largest (8, 9) are dropped; 7 remain.
func TestLatencyStats(t *testing.T) {
	gaps := []int64{5, 9, 1, 7, 3, 2, 8, 4, 6} // µs
	posted := []int64{0}
	for _, g := range gaps {
		posted = append(posted, posted[len(posted)-1]+g*1000)
	}
	got, _ := latencyStats(posted, false, nil)
	// n = 7 kept: 1..7. (n-1)%2 == 0, so the median is delta[3] = 4.
	// p99 is delta[ceil(6.93)] = delta[7] = 8; t_max is delta[n] = 8.
	want := Latency{Min: 1, Typical: 4, Avg: 4, P99: 8, Max: 8}
	if got != want {
		t.Errorf("latencyStats = %+v, want %+v", got, want)
	}
	half, _ := latencyStats(posted, true, nil)
	if !near(half.Typical, 2) || !near(half.Min, 0.5) || !near(half.Avg, 2) {
		t.Errorf("a ping-pong reports half the round trip: got %+v", half)
	}
	// An even count of kept samples averages the middle two, as
	// perftest's get_median does: 11 posts, 10 gaps, 8 kept (1..8).
	posted = append(posted, posted[len(posted)-1]+10_000)
	got, _ = latencyStats(posted, false, nil)
	if !near(got.Typical, 4.5) || !near(got.Avg, 4.5) || got.Max != 9 {
		t.Errorf("8 kept samples: %+v, want median 4.5, mean 4.5, max 9", got)
	}
}

func TestLatencyStatsTooFew(t *testing.T) {
	if got, _ := latencyStats([]int64{0, 1, 2}, false, nil); got != (Latency{}) {
		t.Errorf("2 samples, both dropped: got %+v, want zero", got)
	}
}

// TestBandwidthStats: 4 messages of 1 MiB, every second one signaled,
// the groups posted at 0 and 2 ms and completing at 2 ms (the first pair)
// and 6 ms (the second). The post times of the second of each pair are
// not read: the bw loop does not record them.
func TestBandwidthStats(t *testing.T) {
	const ms = 1_000_000
	posted := []int64{0, -99 * ms, 2 * ms, 99 * ms}
	completed := []int64{0, 2 * ms, 0, 6 * ms}
	got := bandwidthStats(1<<20, posted, completed, 2)
	// Average: 4 MiB in 6 ms. Peak: the best of (c[j]-p[i])/(j-i+1) for
	// group starts i and signaled j >= i: i=0,j=1: 1 ms; i=2,j=3: 2 ms;
	// i=0,j=3: 1.5 ms. So 1 MiB/ms.
	if want := 4 / 0.006; !near(got.AvgMiBps, want) {
		t.Errorf("average %v MiB/s, want %v", got.AvgMiBps, want)
	}
	if want := 1000.0; !near(got.PeakMiBps, want) {
		t.Errorf("peak %v MiB/s, want %v", got.PeakMiBps, want)
	}
	if want := 4 / 0.006 / 1e6; !near(got.Mpps, want) {
		t.Errorf("rate %v Mpps, want %v", got.Mpps, want)
	}
	// A last message that is not on a cq-mod boundary is signaled too.
	got = bandwidthStats(1<<20, posted[:3], []int64{0, 2 * ms, 4 * ms}, 2)
	if want := 3 / 0.004; !near(got.AvgMiBps, want) {
		t.Errorf("3 messages: average %v MiB/s, want %v", got.AvgMiBps, want)
	}
}
