package perftest

import (
	"context"
	"fmt"
	"strings"
)

// ucxTests are ucx_perftest's counterparts of the tests. Latency tests
// keep one operation outstanding (-O 1) so that ucp_get and ucp_fadd time
// whole operations, as read_lat and atomic_lat do; ucp_put_lat and
// tag_lat are ping-pongs that report half the round trip, as write_lat
// and send_lat do. Bandwidth tests keep the window outstanding.
var ucxTests = map[Test]string{
	SendLat: "tag_lat", WriteLat: "ucp_put_lat", ReadLat: "ucp_get", AtomicLat: "ucp_fadd",
	SendBW: "tag_bw", WriteBW: "ucp_put_bw", ReadBW: "ucp_get", AtomicBW: "ucp_fadd",
}

// ucxPeer is ucx_perftest over the UCX transports tls (UCX_TLS), server
// and client on the loopback.
func ucxPeer(transport, tls string) *peer {
	return &peer{
		stack: "ucx", transport: transport,
		test:    func(t Test) string { return ucxTests[t] },
		missing: func() string { return lookPath("ucx_perftest", "ucx-utils") },
		run: func(ctx context.Context, p Params) (*Result, error) {
			port, err := freePort()
			if err != nil {
				return nil, err
			}
			outstanding := 1
			if !p.Test.Latency() {
				outstanding = p.TxDepth
			}
			args := []string{"-t", ucxTests[p.Test], "-s", itoa(p.Size), "-n", itoa(p.Iters),
				"-w", itoa(p.Warmup), "-O", itoa(outstanding), "-p", itoa(port)}
			env := []string{"UCX_TLS=" + tls, "UCX_WARN_UNUSED_ENV_VARS=n"}
			server := append([]string{"ucx_perftest"}, args...)
			client := append([]string{"ucx_perftest", "127.0.0.1"}, append(args, "-v")...)
			out, err := runPair(ctx, env, server, client, port)
			if err != nil {
				return nil, err
			}
			r, err := parseUCX(out, p.Test.Latency())
			if err != nil {
				return nil, err
			}
			r.Iters = p.Iters
			if !p.Test.Latency() {
				r.Window = outstanding
			}
			return r, nil
		},
	}
}

// parseUCX reads the final line of ucx_perftest's CSV output (-v):
//
//	iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
//	10000,0.133,0.149,0.149,51.20,51.20,6711423,6711423
//
// Latencies are in µs (half the round trip for ping-pong tests), the
// bandwidth in MB/s of 2^20 bytes, the message rate in messages a second.
// Interim lines of long runs begin with "[thread N]". For a latency test
// it keeps the median and mean latency, for a bandwidth test the overall
// bandwidth and message rate.
func parseUCX(out string, latency bool) (*Result, error) {
	var header []string
	var last []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "iterations,"):
			header = strings.Split(line, ",")
		case header != nil && line != "" && line[0] >= '0' && line[0] <= '9':
			if f := strings.Split(line, ","); len(f) == len(header) {
				last = f
			}
		}
	}
	if last == nil {
		return nil, fmt.Errorf("no result line in ucx_perftest's output: %s", firstLine(out))
	}
	col := func(suffix string) (float64, error) {
		for i, h := range header {
			if h == suffix || strings.HasSuffix(h, "_"+suffix) {
				return parseFigure("ucx_perftest", h, strings.TrimSpace(last[i]))
			}
		}
		return 0, fmt.Errorf("ucx_perftest's output has no %s column", suffix)
	}
	var r Result
	if latency {
		typ, err := col("percentile_lat")
		if err != nil {
			return nil, err
		}
		avg, err := col("avg_lat")
		if err != nil {
			return nil, err
		}
		r.Lat = &Latency{Typical: typ, Avg: avg}
		return &r, nil
	}
	bw, err := col("overall_bw")
	if err != nil {
		return nil, err
	}
	mr, err := col("overall_mr")
	if err != nil {
		return nil, err
	}
	r.BW = &Bandwidth{AvgMiBps: bw, Mpps: mr / 1e6}
	return &r, nil
}
