package perftest

import (
	"testing"
	"time"
)

// TestStampNanos: stamps converted with toNanos measure what the
// monotonic clock measures.
func TestStampNanos(t *testing.T) {
	s := []int64{stamp(), 0}
	start := time.Now()
	for time.Since(start) < 5*time.Millisecond {
	}
	s[1] = stamp()
	want := time.Since(start)
	toNanos(s)
	got := time.Duration(s[1] - s[0])
	if got < want*9/10 || got > want*11/10+time.Millisecond {
		t.Fatalf("stamps 5 ms apart measure %v; the monotonic clock %v (TSC: %v)", got, want, useTSC)
	}
}
