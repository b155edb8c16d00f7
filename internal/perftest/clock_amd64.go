package perftest

import (
	"os"
	"strings"
)

// useTSC says whether stamp reads the time-stamp counter: where the
// kernel keeps time with it, which it does only if the TSC is invariant
// and synchronised across CPUs; in a virtual machine whose kernel keeps
// time with a paravirtual clock (KVM's kvm-clock, Hyper-V's TSC page,
// Xen's), which is the host's TSC scaled, if the TSC is invariant
// (constant_tsc and nonstop_tsc) and declared synchronised across CPUs
// (tsc_reliable): a read of such a clock costs 30 ns or more against the
// TSC's 8; and in one whose kernel keeps time with an
// emulated legacy timer (HPET, ACPI PM: under qemu's TCG), where every
// read of the system clock traps to the emulator and costs microseconds,
// while the virtual TSC follows the host's. perftest reads the TSC
// everywhere, and so does ucx_perftest; toNanos scales the stamps by the
// monotonic clock over the run, so the TSC's rate need not be known.
var useTSC = func() bool {
	b, err := os.ReadFile("/sys/devices/system/clocksource/clocksource0/current_clocksource")
	if err != nil {
		return false
	}
	switch strings.TrimSpace(string(b)) {
	case "tsc":
		return true
	case "kvm-clock", "hyperv_clocksource_tsc_page", "xen":
		// Invariant, and declared synchronised (tsc_reliable): stamps
		// taken on two CPUs are comparable.
		f := cpuFlags()
		return f["constant_tsc"] && f["nonstop_tsc"] && f["tsc_reliable"]
	case "hpet", "acpi_pm":
		f := cpuFlags()
		return f["hypervisor"] && f["tsc"]
	}
	return false
}()

// cpuFlags returns the flags /proc/cpuinfo lists for the first CPU.
func cpuFlags() map[string]bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return nil
	}
	flags := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "flags" {
			for _, f := range strings.Fields(v) {
				flags[f] = true
			}
			break
		}
	}
	return flags
}

// rdtsc reads the time-stamp counter.
func rdtsc() int64
