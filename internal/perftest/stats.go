package perftest

import (
	"math"
	"slices"
)

// Latency is a latency test's result in microseconds. A figure a peer
// does not report is zero.
type Latency struct {
	Min     float64 `json:"t_min_us,omitempty"`
	Typical float64 `json:"t_typical_us,omitempty"` // the median
	Avg     float64 `json:"t_avg_us,omitempty"`
	P99     float64 `json:"t_p99_us,omitempty"`
	Max     float64 `json:"t_max_us,omitempty"`
}

// Bandwidth is a bandwidth test's result. MiB are 2^20 bytes, as
// perftest's and ucx_perftest's "MB"; Mpps are 10^6 messages a second. A
// figure a peer does not report is zero.
type Bandwidth struct {
	PeakMiBps float64 `json:"bw_peak_mib_s,omitempty"`
	AvgMiBps  float64 `json:"bw_avg_mib_s,omitempty"`
	Mpps      float64 `json:"msg_rate_mpps,omitempty"`
}

// latTail is how many of the largest samples perftest leaves out
// (LAT_MEASURE_TAIL).
const latTail = 2

// latencyStats computes perftest's latency figures (print_report_lat)
// from the times, in nanoseconds, at which consecutive iterations were
// posted: the samples are the differences between neighbours, halved for
// a ping-pong (half); the two largest are dropped; t_typical is the
// median, t_p99 the sample at rank ⌈0.99·n⌉ and t_max, as in perftest,
// the sample just past the ones kept. It sorts a copy into scratch, which
// it may grow. posted needs at least latTail+2 entries.
func latencyStats(posted []int64, half bool, scratch []int64) (Latency, []int64) {
	delta := scratch[:0]
	for i := 1; i < len(posted); i++ {
		delta = append(delta, posted[i]-posted[i-1])
	}
	slices.Sort(delta)
	n := len(delta) - latTail
	if n < 1 {
		return Latency{}, delta
	}
	us := 1e3 // ns per µs
	if half {
		us *= 2
	}
	var median float64
	if (n-1)%2 != 0 {
		median = float64(delta[n/2]+delta[n/2-1]) / 2
	} else {
		median = float64(delta[n/2])
	}
	var sum float64
	for _, d := range delta[:n] {
		sum += float64(d)
	}
	p99 := int(math.Ceil(float64(n) * 0.99))
	return Latency{
		Min:     float64(delta[0]) / us,
		Typical: median / us,
		Avg:     sum / float64(n) / us,
		P99:     float64(delta[min(p99, len(delta)-1)]) / us,
		Max:     float64(delta[n]) / us,
	}, delta
}

// maxPeakWork bounds the pairs bandwidthStats examines for the peak.
const maxPeakWork = 50_000_000

// bandwidthStats computes perftest's bandwidth figures (print_report_bw)
// for n messages of size bytes from the time each was posted and the
// time its completion was polled, in nanoseconds. completed is read only
// at the signaled indices (every cqMod-th, and the last), as perftest
// does, and posted only at the first of each signaled group (the indices
// that are multiples of cqMod). The peak is the best rate over any run of
// messages from the first of a group to a signaled completion (perftest
// starts a run at any post); where that search would be too long, it
// starts only at every k-th group.
func bandwidthStats(size int, posted, completed []int64, cqMod int) Bandwidth {
	n := len(posted)
	if n == 0 || len(completed) != n {
		return Bandwidth{}
	}
	total := completed[n-1] - posted[0]
	if total <= 0 {
		total = 1
	}
	best := float64(total) / float64(n)
	stride := cqMod
	if work := int64(n/cqMod+1) * int64(n/cqMod+1); work > maxPeakWork {
		stride *= int(work/maxPeakWork) + 1
	}
	for i := 0; i < n; i += stride {
		for j := (i+cqMod)/cqMod*cqMod - 1; j < n; j += cqMod {
			if t := float64(completed[j]-posted[i]) / float64(j-i+1); t < best && t > 0 {
				best = t
			}
		}
		if n%cqMod != 0 {
			j := n - 1
			if t := float64(completed[j]-posted[i]) / float64(j-i+1); t < best && t > 0 {
				best = t
			}
		}
	}
	const mib = 1 << 20
	secs := float64(total) / 1e9
	avg := float64(size) * float64(n) / secs / mib
	return Bandwidth{
		// The whole run is one of the runs the peak is the best of: at
		// least the average, also where the two round differently.
		PeakMiBps: max(float64(size)/(best/1e9)/mib, avg),
		AvgMiBps:  avg,
		Mpps:      float64(n) / secs / 1e6,
	}
}
