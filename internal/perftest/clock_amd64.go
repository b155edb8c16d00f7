package perftest

import (
	"os"
	"strings"
)

// useTSC says whether stamp reads the time-stamp counter: only where the
// kernel keeps time with it, which it does only if the TSC is invariant
// and synchronised across CPUs.
var useTSC = func() bool {
	b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	return err == nil && strings.TrimSpace(string(b)) == "tsc"
}()

// rdtsc reads the time-stamp counter.
func rdtsc() int64
