package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goverbs/goverbs/internal/perftest"
)

// TestSockBenchJSON runs sock bench on loop0 and shm0 with --compare and
// checks that every benchmark has a figure over rsock and over Go TCP,
// with a comparison for each device, that each device's idle connections
// were measured, and that --plot writes the PNG.
func TestSockBenchJSON(t *testing.T) {
	png := filepath.Join(t.TempDir(), "sock.png")
	out, errOut, code := goverbs(t, "sock", "bench", "-d", "loop0,shm0", "-n", "50", "--stream-iters", "3", "--stream-size", "64K",
		"--idle", "20", "--idle-time", "50ms", "--compare", "--json", "--plot", png)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep perftest.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if len(rep.Results) != 6 || len(rep.Peers) != 3 || len(rep.Comparisons) != 6 {
		t.Fatalf("%d results, %d peer results, %d comparisons; want 6, 3, 6", len(rep.Results), len(rep.Peers), len(rep.Comparisons))
	}
	for _, r := range append(rep.Results, rep.Peers...) {
		if v, _, _ := r.Figure(); v <= 0 {
			t.Errorf("%s %s: no figure", r.Name(), r.PeerTest)
		}
	}
	if len(rep.Idle) != 2 {
		t.Fatalf("%d idle measurements, want one per device", len(rep.Idle))
	}
	for i, idle := range rep.Idle {
		if want := []string{"loop0", "shm0"}[i]; idle.Device != want || idle.Conns != 20 || idle.Seconds < 0.05 || idle.Cores < 0 {
			t.Errorf("idle %d: %+v, want 20 connections on %s over at least 50ms", i, *idle, want)
		}
	}
	if fi, err := os.Stat(png); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}

// TestSockBenchUsage checks the errors for a bad invocation.
func TestSockBenchUsage(t *testing.T) {
	for _, args := range [][]string{{"sock"}, {"sock", "bnech"}, {"sock", "bench", "-n", "1"}, {"sock", "bench", "--plot", "x.svg"}, {"sock", "bench", "extra"}, {"sock", "bench", "--idle", "-1"}, {"sock", "bench", "--idle-time", "0s"}} {
		_, errOut, code := goverbs(t, args...)
		if code != 2 || !strings.Contains(errOut, "goverbs sock") {
			t.Errorf("%q: exit %d, %s", args, code, errOut)
		}
	}
}
