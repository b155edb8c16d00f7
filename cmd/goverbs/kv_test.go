package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKVBench runs goverbs kv bench end to end on shm0 with its own server
// process, memcached left out (it is measured where installed, by hand),
// and checks the table and the plot.
func TestKVBench(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "kv.png")
	out, errOut, code := goverbs(t, "kv", "bench", "-n", "2000", "--keys", "500", "--values", "64,4096", "--no-memcached", "--plot", plot)
	if code != 0 {
		t.Fatalf("goverbs kv bench: exit %d\n%s%s", code, out, errOut)
	}
	rows := 0
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 7 && f[0] == "goverbs-kv" {
			rows++
		}
	}
	if rows != 6 || !strings.Contains(out, "memcached skipped: --no-memcached") {
		t.Fatalf("want 6 goverbs-kv rows (2 sizes x 3 workloads) and memcached named as skipped:\n%s", out)
	}
	f, err := os.Open(plot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("--plot wrote no PNG: %v", err)
	}
	if _, errOut, code := goverbs(t, "kv", "bench", "--plot", "kv.svg"); code != 2 || !strings.Contains(errOut, "PNG") {
		t.Fatalf("--plot kv.svg: exit %d, %q; want a usage error about PNG", code, errOut)
	}
}
