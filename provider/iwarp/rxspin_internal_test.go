package iwarp

import (
	"testing"
	"time"
)

// The receive goroutine spins after FPDUs only when they came within
// rxSpinGap of the ones before: a stream, or a ping-pong slowed by
// wake-ups, keeps it spinning; a connection that receives seldom makes
// it wait for its socket at once.
func TestReceiveGoroutineSpinsOnlyAfterCloseArrivals(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name      string
		last, now time.Time
		want      bool
	}{
		{"first FPDUs of the connection", time.Time{}, t0, false},
		{"within rxSpin of the last", t0, t0.Add(rxSpin / 2), true},
		{"at once after the last", t0, t0, true},
		{"a ping-pong's round trip with two wake-ups", t0, t0.Add(2 * rxSpin), true},
		{"exactly rxSpinGap after the last", t0, t0.Add(rxSpinGap), false},
		{"long after the last (round-robin over many QPs)", t0, t0.Add(10 * time.Millisecond), false},
	} {
		if got := spinsAfter(tc.last, tc.now); got != tc.want {
			t.Errorf("%s: spinsAfter = %v, want %v", tc.name, got, tc.want)
		}
	}
}
