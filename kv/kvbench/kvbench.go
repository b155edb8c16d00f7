// Package kvbench measures key-value stores side by side on one workload:
// goverbs kv, whose GET is a one-sided RDMA Read, and memcached over TCP.
// Keys are 16 bytes; each operation is a GET or, with the configured
// probability, a PUT; keys are chosen uniformly or by a Zipf distribution.
// It reports GET latency percentiles, throughput with one client, and the
// server's CPU seconds per million GETs.
package kvbench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Store is a key-value client under test.
type Store interface {
	// GetInto copies the value of key into dst and returns its length.
	GetInto(key, dst []byte) (int, error)
	Put(key, value []byte) error
}

// Workload describes one run.
type Workload struct {
	Keys      int     // key space, preloaded before measuring
	ValueSize int     // bytes per value
	GetRatio  float64 // fraction of GETs (0.95)
	Zipf      float64 // Zipf exponent θ (0 for uniform; 0.99 YCSB's default)
	Ops       int     // operations measured
	Seed      uint64
}

// Name describes the workload: the GET share and the key distribution,
// as "95%get/uniform" or "100%get/zipf0.99".
func (w Workload) Name() string {
	dist := "uniform"
	if w.Zipf != 0 {
		dist = fmt.Sprintf("zipf%.2f", w.Zipf)
	}
	return fmt.Sprintf("%.0f%%get/%s", w.GetRatio*100, dist)
}

// Result is what one run measured.
type Result struct {
	System     string
	ValueSize  int
	Workload   string
	Gets, Puts int
	GetP50     time.Duration
	GetP99     time.Duration
	PutP50     time.Duration // 0 without PUTs
	Elapsed    time.Duration
	// ServerCPU is the server process's CPU time (user+system) during the
	// measured phase; -1 if unknown.
	ServerCPU time.Duration
}

// OpsPerSec is the throughput of the run.
func (r Result) OpsPerSec() float64 { return float64(r.Gets+r.Puts) / r.Elapsed.Seconds() }

// CPUPerMillionGets is the server's CPU seconds per million GETs, -1 if
// unknown.
func (r Result) CPUPerMillionGets() float64 {
	if r.ServerCPU < 0 || r.Gets == 0 {
		return -1
	}
	return r.ServerCPU.Seconds() * 1e6 / float64(r.Gets)
}

// key writes the 16-byte key of index i into b.
func key(b []byte, i int) []byte {
	b = b[:16]
	copy(b, "key:")
	s := strconv.AppendInt(b[4:4], int64(i), 10)
	for j := 4 + len(s); j < 16; j++ {
		b[j] = '.'
	}
	return b
}

// Run preloads the key space and measures the workload on s. serverPID,
// if not 0, is the server process whose CPU time is measured.
func Run(system string, s Store, w Workload, serverPID int) (Result, error) {
	r := Result{System: system, ValueSize: w.ValueSize, Workload: w.Name(), ServerCPU: -1}
	kb := make([]byte, 16)
	val := make([]byte, w.ValueSize)
	for i := range val {
		val[i] = byte('a' + i%26)
	}
	for i := range w.Keys {
		if err := s.Put(key(kb, i), val); err != nil {
			return r, fmt.Errorf("%s: preload: %w", system, err)
		}
	}
	rng := rand.New(rand.NewPCG(w.Seed, 1))
	pick := uniform(rng, w.Keys)
	if w.Zipf > 0 {
		pick = newZipf(rng, w.Keys, w.Zipf).next
	}
	dst := make([]byte, w.ValueSize+64)
	lat := make([]time.Duration, 0, w.Ops)
	var putLat []time.Duration
	cpu0, cpuErr := processCPU(serverPID)
	start := time.Now()
	for range w.Ops {
		k := key(kb, pick())
		if rng.Float64() < w.GetRatio {
			t0 := time.Now()
			n, err := s.GetInto(k, dst)
			lat = append(lat, time.Since(t0))
			if err != nil {
				return r, fmt.Errorf("%s: get: %w", system, err)
			}
			if n != w.ValueSize {
				return r, fmt.Errorf("%s: get returned %d bytes, want %d", system, n, w.ValueSize)
			}
			r.Gets++
		} else {
			t0 := time.Now()
			err := s.Put(k, val)
			putLat = append(putLat, time.Since(t0))
			if err != nil {
				return r, fmt.Errorf("%s: put: %w", system, err)
			}
			r.Puts++
		}
	}
	r.Elapsed = time.Since(start)
	if cpu1, err := processCPU(serverPID); serverPID != 0 && cpuErr == nil && err == nil {
		r.ServerCPU = cpu1 - cpu0
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		r.GetP50 = lat[len(lat)/2]
		r.GetP99 = lat[len(lat)*99/100]
	}
	slices.Sort(putLat)
	if len(putLat) > 0 {
		r.PutP50 = putLat[len(putLat)/2]
	}
	return r, nil
}

func uniform(rng *rand.Rand, n int) func() int { return func() int { return rng.IntN(n) } }

// zipf draws from a Zipf distribution over [0, n) with exponent theta < 1,
// as YCSB's ZipfianGenerator (Gray et al., "Quickly generating
// billion-record synthetic databases").
type zipf struct {
	rng                      *rand.Rand
	n                        int
	theta, alpha, zetan, eta float64
}

func newZipf(rng *rand.Rand, n int, theta float64) *zipf {
	zeta := func(m int) float64 {
		s := 0.0
		for i := 1; i <= m; i++ {
			s += 1 / math.Pow(float64(i), theta)
		}
		return s
	}
	z := &zipf{rng: rng, n: n, theta: theta, alpha: 1 / (1 - theta), zetan: zeta(n)}
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta(2)/z.zetan)
	return z
}

func (z *zipf) next() int {
	u := z.rng.Float64()
	uz := u * z.zetan
	switch {
	case uz < 1:
		return 0
	case uz < 1+math.Pow(0.5, z.theta):
		return 1
	}
	return min(int(float64(z.n)*math.Pow(z.eta*u-z.eta+1, z.alpha)), z.n-1)
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times, 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// processCPU returns the user+system CPU time of process pid.
func processCPU(pid int) (time.Duration, error) {
	if pid == 0 {
		return 0, errors.New("no process")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may contain spaces) start
	// after the last ')'; utime and stime are fields 14 and 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}
