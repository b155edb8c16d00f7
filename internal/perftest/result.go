package perftest

import (
	"fmt"
)

// Result is one test at one size: goverbs on a device, or a peer.
type Result struct {
	// Stack is what was measured: "goverbs", or a peer ("ucx",
	// "libfabric", "go").
	Stack string `json:"stack"`
	// Device is the goverbs device ("shm0"); empty for a peer.
	Device string `json:"device,omitempty"`
	// Transport is the device's transport ("shm", "loop", "iwarp") or
	// the peer's ("sm", "tcp", "shm").
	Transport string `json:"transport"`
	Test      Test   `json:"test"`
	// PeerTest is the peer's own name for what it ran ("ucp_put_lat").
	PeerTest string `json:"peer_test,omitempty"`
	Size     int    `json:"bytes"`
	Iters    int    `json:"iterations"`
	// Window is the bandwidth tests' tx depth; PostList, how many work
	// requests the client posted at once when more than one.
	Window   int        `json:"window,omitempty"`
	PostList int        `json:"post_list,omitempty"`
	Event    bool       `json:"event,omitempty"`
	Lat      *Latency   `json:"latency,omitempty"`
	BW       *Bandwidth `json:"bandwidth,omitempty"`
	CPU      *CPU       `json:"cpu,omitempty"`
}

// Name is how tables and plots call the result's source: "goverbs shm0",
// "ucx sm".
func (r *Result) Name() string {
	if r.Device != "" {
		return r.Stack + " " + r.Device
	}
	return r.Stack + " " + r.Transport
}

// CPU is the CPU time (user and system, from getrusage) each process
// used per iteration of the measured loop, in microseconds.
type CPU struct {
	ClientUs float64 `json:"client_us_per_op"`
	ServerUs float64 `json:"server_us_per_op"`
	// SameProcess: the server ran in the client's process (loop0), so
	// ClientUs counts both sides and ServerUs is zero.
	SameProcess bool `json:"same_process,omitempty"`
	// ServerUnknown: the server did not measure its CPU time.
	ServerUnknown bool `json:"server_unknown,omitempty"`
}

// MarshalText makes a Test its name in JSON.
func (t Test) MarshalText() ([]byte, error) {
	if !t.Valid() {
		return nil, fmt.Errorf("invalid test %d", uint8(t))
	}
	return []byte(t.String()), nil
}

// UnmarshalText reads a Test from its name.
func (t *Test) UnmarshalText(b []byte) error {
	v, err := ParseTest(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// Figure is the number a comparison uses for r: the median latency
// (t_typical) in µs for latency tests, falling back to the average for a
// peer that reports only that; the average bandwidth in MiB/s for
// bandwidth tests. better says whether a larger figure is better.
func (r *Result) Figure() (v float64, unit string, better bool) {
	switch {
	case r.Lat != nil && r.Lat.Typical > 0:
		return r.Lat.Typical, "µs", false
	case r.Lat != nil:
		return r.Lat.Avg, "µs avg", false
	case r.BW != nil:
		return r.BW.AvgMiBps, "MiB/s", true
	}
	return 0, "", false
}

// Speedup is how many times faster r is than peer on the figure both
// report: peer's latency over r's, or r's bandwidth over peer's. Above 1,
// r is faster. It is 0 when either lacks the figure.
func Speedup(r, peer *Result) float64 {
	a, ua, better := r.Figure()
	b, ub, _ := peer.Figure()
	if ua != ub {
		// A peer with only an average is compared on averages.
		if r.Lat != nil && peer.Lat != nil {
			a, b = r.Lat.Avg, peer.Lat.Avg
		} else {
			return 0
		}
	}
	if a <= 0 || b <= 0 {
		return 0
	}
	if better {
		return a / b
	}
	return b / a
}
