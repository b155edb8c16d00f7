package perftest

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

func results() (ours, peers []*Result) {
	ours = []*Result{
		{Stack: "goverbs", Device: "loop0", Transport: "loop", Test: WriteLat, Size: 8, Iters: 10, Lat: &Latency{Min: 0.1, Typical: 0.2, Avg: 0.3, P99: 0.4, Max: 0.5}},
		{Stack: "goverbs", Device: "shm0", Transport: "shm", Test: WriteLat, Size: 8, Iters: 10, Lat: &Latency{Min: 0.2, Typical: 0.25, Avg: 0.3, P99: 0.4, Max: 0.5},
			CPU: &CPU{ClientUs: 0.5, ServerUs: 0.4}},
		{Stack: "goverbs", Device: "shm0", Transport: "shm", Test: ReadBW, Size: 65536, Iters: 10, Window: 128, BW: &Bandwidth{PeakMiBps: 3000, AvgMiBps: 2000, Mpps: 0.03}},
		{Stack: "goverbs", Device: "shm0", Transport: "shm", Test: SendLat, Size: 64, Iters: 10, Lat: &Latency{Min: 0.4, Typical: 0.5, Avg: 0.6, P99: 0.7, Max: 0.8}},
	}
	peers = []*Result{
		{Stack: "ucx", Transport: "sm", Test: WriteLat, PeerTest: "ucp_put_lat", Size: 8, Iters: 10, Lat: &Latency{Typical: 0.125, Avg: 0.15}},
		{Stack: "ucx", Transport: "tcp", Test: ReadBW, PeerTest: "ucp_get", Size: 65536, Iters: 10, BW: &Bandwidth{AvgMiBps: 1000, Mpps: 0.015}},
		{Stack: "libfabric", Transport: "shm", Test: SendLat, PeerTest: "fi_pingpong", Size: 64, Iters: 10, Lat: &Latency{Avg: 1.2}},
		{Stack: "ucx", Transport: "sm", Test: AtomicLat, PeerTest: "ucp_fadd", Size: 8, Iters: 10, Lat: &Latency{Typical: 0.1}},
	}
	return ours, peers
}

func TestCompare(t *testing.T) {
	ours, peers := results()
	cs := Compare(ours, peers)
	if len(cs) != 3 {
		t.Fatalf("%d comparisons, want 3 (atomic_lat has no goverbs result): %+v", len(cs), cs)
	}
	// UCX over shared memory is paired with shm0, not loop0; speed is
	// 0.125/0.25: goverbs takes twice as long.
	if c := cs[0]; c.Ours != "goverbs shm0" || c.Peer != "ucx sm" || !near(c.Speedup, 0.5) || c.Unit != "µs" {
		t.Errorf("write_lat: %+v", c)
	}
	// Bandwidth: 2000 over 1000 MiB/s.
	if c := cs[1]; c.Ours != "goverbs shm0" || !near(c.Speedup, 2) || c.Unit != "MiB/s" {
		t.Errorf("read_bw: %+v", c)
	}
	// fi_pingpong gives only a mean: means are compared.
	if c := cs[2]; !near(c.Speedup, 2) || !near(c.OurValue, 0.6) || c.Unit != "µs avg" {
		t.Errorf("send_lat against a mean: %+v", c)
	}
}

// TestSummarize: rounds of the same comparison merge into one with the
// medians and the speedups' range; others stay apart, in first-seen order.
func TestSummarize(t *testing.T) {
	ours, peers := results()
	var rounds []Comparison
	for i, typical := range []float64{0.25, 0.5, 0.125} {
		o := *ours[1]
		lat := *o.Lat
		lat.Typical = typical
		o.Lat = &lat
		// The read_bw peer only in the first round.
		n := 1
		if i == 0 {
			n = 2
		}
		rounds = append(rounds, Compare([]*Result{&o, ours[2]}, peers[:n])...)
	}
	cs := Summarize(rounds)
	if len(cs) != 2 {
		t.Fatalf("%d comparisons, want 2: %+v", len(cs), cs)
	}
	// write_lat: goverbs took 0.25, 0.5, 0.125 µs against UCX's 0.125.
	if c := cs[0]; c.Test != WriteLat || c.Rounds != 3 || !near(c.Speedup, 0.5) || !near(c.SpeedupMin, 0.25) || !near(c.SpeedupMax, 1) ||
		!near(c.OurValue, 0.25) || !near(c.Value, 0.125) {
		t.Errorf("write_lat over 3 rounds: %+v", c)
	}
	if c := cs[1]; c.Test != ReadBW || c.Rounds != 1 || !near(c.Speedup, 2) || !near(c.SpeedupMin, 2) || !near(c.SpeedupMax, 2) {
		t.Errorf("read_bw, one round: %+v", c)
	}
	var b bytes.Buffer
	if err := WriteComparison(&b, cs, nil); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "Over 3 rounds") || !strings.Contains(out, "0.25–1.00× (3)") || !strings.Contains(out, "2.00–2.00× (1)") {
		t.Errorf("comparison table over rounds:\n%s", out)
	}
	if got := median([]float64{1, 2, 3, 10}); got != 2.5 {
		t.Errorf("median of an even count: %v, want 2.5", got)
	}
}

func TestWriteTable(t *testing.T) {
	ours, _ := results()
	var b bytes.Buffer
	if err := WriteTable(&b, ours); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"goverbs shm0: write_lat (RDMA Write ping-pong polling the last byte, half the round trip; polling)",
		"t_typical[µs]", "BW peak[MiB/s]", "MsgRate[Mpps]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "#bytes") != 4 {
		t.Errorf("want a header per source and test (4):\n%s", out)
	}
}

func TestWriteCSVAndJSON(t *testing.T) {
	ours, peers := results()
	var b bytes.Buffer
	if err := WriteCSV(&b, append(ours, peers...)); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1+len(ours)+len(peers) || rows[0][0] != "stack" || rows[2][10] != "0.25" || rows[2][17] != "0.5" {
		t.Errorf("CSV rows %q", rows)
	}
	b.Reset()
	rep := &Report{Date: "2026-01-02T03:04:05Z", Results: ours, Peers: peers, Comparisons: Compare(ours, peers),
		Skipped: []Skip{{Peer: "ucx tcp", Reason: "ucx_perftest is not installed"}}}
	if err := WriteJSON(&b, rep); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Results[1].Test != WriteLat || back.Results[1].Lat.Typical != 0.25 || back.Comparisons[0].PeerTest != "ucp_put_lat" {
		t.Errorf("JSON round trip: %+v", back.Results[1])
	}
	if !strings.Contains(b.String(), `"test": "write_lat"`) {
		t.Errorf("tests are named in JSON:\n%s", b.String())
	}
}

func TestPlot(t *testing.T) {
	ours, peers := results()
	file := t.TempDir() + "/bench.png"
	if err := Plot(file, &Report{Date: "2026-01-02T03:04:05Z", Host: "test", Results: ours, Peers: peers}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("%s is not a PNG", file)
	}
}

// TestPlotSeriesRounds: a run repeated over rounds (--repeat) is one
// point per size, the median of the rounds, in order of size.
func TestPlotSeriesRounds(t *testing.T) {
	lat := func(size int, typical float64) *Result {
		return &Result{Stack: "goverbs", Device: "shm0", Transport: "shm", Test: SendLat, Size: size, Iters: 10, Lat: &Latency{Typical: typical}}
	}
	all := []*Result{lat(64, 0.5), lat(8, 0.3), lat(64, 0.9), lat(8, 0.1), lat(64, 0.4), lat(8, 0.2)}
	xys, label := series(SendLat, all, "goverbs shm0")
	if label != "goverbs shm0" {
		t.Errorf("label %q", label)
	}
	want := []struct{ x, y float64 }{{8, 0.2}, {64, 0.5}}
	if len(xys) != len(want) {
		t.Fatalf("points %v, want %v", xys, want)
	}
	for i, w := range want {
		if xys[i].X != w.x || !near(xys[i].Y, w.y) {
			t.Errorf("point %d: %v, want %v", i, xys[i], w)
		}
	}
}
