package perftest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The outputs under testdata were captured from real runs of
// ucx_perftest 1.13.1 (Debian ucx-utils) and fi_pingpong (libfabric
// 1.17.0, Debian libfabric-bin) on the loopback.

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseUCX(t *testing.T) {
	tests := []struct {
		file    string
		latency bool
		lat     Latency
		bw      Bandwidth
	}{
		{"ucx_sm_ucp_put_lat_8.txt", true, Latency{Typical: 0.143, Avg: 0.153}, Bandwidth{}},
		{"ucx_sm_ucp_get_lat_8.txt", true, Latency{Typical: 0.021, Avg: 0.023}, Bandwidth{}},
		// Interim "[thread 0]" lines precede the final one.
		{"ucx_tcp_ucp_get_lat_8.txt", true, Latency{Typical: 1108.358, Avg: 1120.841}, Bandwidth{}},
		{"ucx_sm_ucp_put_bw_65536.txt", false, Latency{}, Bandwidth{AvgMiBps: 28391.46, Mpps: 0.454263}},
		// The iteration count is right-aligned with a space.
		{"ucx_tcp_tag_bw_1048576.txt", false, Latency{}, Bandwidth{AvgMiBps: 6643.39, Mpps: 0.006643}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r, err := parseUCX(readTestdata(t, tt.file), tt.latency)
			if err != nil {
				t.Fatal(err)
			}
			if tt.latency {
				if r.Lat == nil || r.BW != nil || !near(r.Lat.Typical, tt.lat.Typical) || !near(r.Lat.Avg, tt.lat.Avg) {
					t.Errorf("got %+v %+v, want latency %+v", r.Lat, r.BW, tt.lat)
				}
				return
			}
			if r.BW == nil || r.Lat != nil || !near(r.BW.AvgMiBps, tt.bw.AvgMiBps) || !near(r.BW.Mpps, tt.bw.Mpps) {
				t.Errorf("got %+v %+v, want bandwidth %+v", r.Lat, r.BW, tt.bw)
			}
		})
	}
}

func TestParseUCXBad(t *testing.T) {
	for _, out := range []string{
		"",
		"[1700000000.1] error: connect failed\n",
		"iterations,50.0_percentile_lat,avg_lat\n",
		"iterations,50.0_percentile_lat,avg_lat\n100,abc,1\n",
		"iterations,50.0_percentile_lat,avg_lat\n100,inf,1\n",
		"iterations,50.0_percentile_lat,avg_lat\n100,1,-2\n",
	} {
		if r, err := parseUCX(out, true); err == nil {
			t.Errorf("parseUCX(%q) = %+v, want an error", out, r)
		}
	}
	// A bandwidth run too short for ucx_perftest's clock prints inf.
	bw := "iterations,50.0_percentile_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr\n50,0,0,0,inf,inf,inf,inf\n"
	if r, err := parseUCX(bw, false); err == nil {
		t.Errorf("parseUCX(%q) = %+v, want an error", bw, r)
	}
}

func TestParseFabric(t *testing.T) {
	tests := []struct {
		file string
		size int
		avg  float64
	}{
		{"fi_pingpong_shm_64.txt", 64, 1.52},
		{"fi_pingpong_tcp_65536.txt", 65536, 302.61},    // "64k"
		{"fi_pingpong_shm_1048576.txt", 1 << 20, 70.99}, // "1m"
	}
	for _, tt := range tests {
		r, err := parseFabric(readTestdata(t, tt.file), tt.size)
		if err != nil {
			t.Errorf("%s: %v", tt.file, err)
			continue
		}
		if r.Lat == nil || r.Lat.Typical != 0 || !near(r.Lat.Avg, tt.avg) {
			t.Errorf("%s: got %+v, want a mean of %v µs and no median", tt.file, r.Lat, tt.avg)
		}
	}
	if _, err := parseFabric(readTestdata(t, "fi_pingpong_shm_64.txt"), 128); err == nil {
		t.Error("a result for another size was taken")
	}
	_, err := parseFabric(readTestdata(t, "fi_pingpong_bad_provider.txt"), 64)
	if err == nil || !strings.Contains(err.Error(), "no data or remote connection closed") {
		t.Errorf("a failed run: %v, want an error quoting fi_pingpong", err)
	}
}

func TestFabricSize(t *testing.T) {
	for s, want := range map[string]int{"64": 64, "4k": 4096, "64k": 65536, "1m": 1 << 20, "2g": 2 << 30} {
		if n, ok := fabricSize(s); !ok || n != want {
			t.Errorf("fabricSize(%q) = %d, %v, want %d", s, n, ok, want)
		}
	}
	if _, ok := fabricSize("bytes"); ok {
		t.Error("fabricSize(bytes) succeeded")
	}
}

func TestListensIn(t *testing.T) {
	b := []byte(readTestdata(t, "proc_net_tcp.txt"))
	if !listensIn(b, 13433) {
		t.Error("port 13433 (0x3479) is in state LISTEN in the table")
	}
	if listensIn(b, 33135) {
		t.Error("port 33135 (0x816F) is an established connection, not a listener")
	}
	if listensIn(b, 80) {
		t.Error("port 80 is not in the table")
	}
}
