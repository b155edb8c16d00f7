package kvbench

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestPlot draws results of two systems, three workloads and three sizes,
// one of them without a server CPU figure, and decodes the PNG.
func TestPlot(t *testing.T) {
	var rs []Result
	for i, size := range []int{64, 512, 4096} {
		for j, wl := range []string{"95%get/uniform", "95%get/zipf0.99", "100%get/uniform"} {
			cpu := time.Duration(i+j) * time.Millisecond
			rs = append(rs,
				Result{System: "goverbs-kv", ValueSize: size, Workload: wl, Gets: 950, Puts: 50,
					GetP50: time.Duration(300+100*i) * time.Nanosecond, Elapsed: time.Millisecond, ServerCPU: 0},
				Result{System: "memcached", ValueSize: size, Workload: wl, Gets: 950, Puts: 50,
					GetP50: 9 * time.Microsecond, Elapsed: 10 * time.Millisecond, ServerCPU: cpu - time.Duration(j)*time.Hour})
		}
	}
	file := filepath.Join(t.TempDir(), "kv.png")
	if err := Plot(file, "test", rs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if r := img.Bounds(); r.Dx() < 1000 || r.Dy() < 400 {
		t.Fatalf("image of %v", r)
	}
}
