package main

import (
	"encoding/json"
	"testing"
)

// goverbs scale runs between two processes on shm0 and tcp0, measures
// every rate it names, and reports each side's cost per connection: the
// descriptors and goroutines every connection holds.
func TestScale(t *testing.T) {
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			out, errOut, code := goverbs(t, "scale", "-d", dev, "--conns", "6", "--rounds", "2", "--time", "20ms", "--goroutines", "1,2", "--cqe", "32", "--json")
			if code != 0 {
				t.Fatalf("goverbs scale: exit %d, stderr %q", code, errOut)
			}
			var r ScaleResult
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("goverbs scale --json printed %q: %v", out, err)
			}
			if r.Device != dev || r.Conns != 6 || r.Window != 8 || r.Rounds != 2 || r.CQE != 32 {
				t.Errorf("the result names device %s, %d connections, window %d, %d rounds, CQs of %d", r.Device, r.Conns, r.Window, r.Rounds, r.CQE)
			}
			for name, v := range map[string]float64{"alone": r.Alone, "idle": r.Idle, "round-robin": r.RoundRobin,
				"idle ratio": r.IdleRatio.Median, "round-robin ratio": r.RoundRobinRatio.Median} {
				if v <= 0 {
					t.Errorf("%s: %v, want a positive rate", name, v)
				}
			}
			if len(r.Goroutines) != 2 || r.Goroutines[0].N != 1 || r.Goroutines[1].N != 2 || r.Goroutines[1].Mops <= 0 {
				t.Errorf("goroutine rates %+v, want 1 and 2 goroutines' positive rates", r.Goroutines)
			}
			for side, p := range map[string]PerConn{"client": r.Client, "server": r.Server} {
				// Every connection holds at least a socket and a goroutine
				// on both providers.
				if p.FDs < 1 || p.Goroutines < 1 || p.Total.FDs < 6 || p.Total.RSSKiB <= 0 {
					t.Errorf("%s: per connection %+v: want at least a descriptor and a goroutine each", side, p)
				}
			}
		})
	}
}

// goverbs scale refuses what it cannot measure.
func TestScaleErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--conns", "0"},
		{"--window", "0"},
		{"--rounds", "0"},
		{"--cqe", "4"},
		{"--goroutines", "1,x"},
		{"--time", "0s"},
		{"extra"},
	} {
		_, errOut, code := goverbs(t, append([]string{"scale"}, args...)...)
		if code != 2 || errOut == "" {
			t.Errorf("goverbs scale %q: exit %d, stderr %q; want a usage error", args, code, errOut)
		}
	}
}
