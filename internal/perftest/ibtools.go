package perftest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/goverbs/goverbs/verbs"
)

// ibTools are perftest's own programs (linux-rdma/perftest, Debian
// package perftest), whose tests and conventions this package follows:
// each test's counterpart is the program of the same name.
var ibTools = map[Test]string{
	SendLat: "ib_send_lat", WriteLat: "ib_write_lat", ReadLat: "ib_read_lat", AtomicLat: "ib_atomic_lat",
	SendBW: "ib_send_bw", WriteBW: "ib_write_bw", ReadBW: "ib_read_bw", AtomicBW: "ib_atomic_bw",
}

// ibToolAttempts is how many times a perftest run whose clock calibration
// failed (it then prints "inf" for every figure) is tried before it is
// skipped. perftest times in CPU cycles and converts with a frequency it
// samples at start; on a loaded or emulated machine the sample is
// sometimes too noisy and perftest gives up on it.
const ibToolAttempts = 5

// errUncalibrated marks a perftest run whose figures are "inf".
var errUncalibrated = errors.New("perftest could not calibrate its clock (its figures are inf)")

// KernelPlan is a kernel RDMA device goverbs runs on and the runs it
// makes there, which perftest's own tools repeat on the same device.
type KernelPlan struct {
	Device KernelDevice
	Params []Params
}

// ibToolsPeer is perftest's ib_* programs on kernel device d, server and
// client both on d. Where d has an IP address they connect through
// rdma_cm (-R) to it, as goverbs does, so that both sides' QPs get the
// attributes rdma_cm gives them, not perftest's own (on rxe in a VM,
// ib_write_bw made 8-12 MiB/s with its own and 6-8 with rdma_cm's);
// otherwise the out-of-band exchange goes over TCP on the
// loopback and the QPs address d's own GID (-x). Work requests are posted
// with ibv_post_send (--use_old_post_send), through the same device
// operations goverbs' ibverbs provider calls.
func ibToolsPeer(d KernelDevice) *peer {
	return &peer{
		stack: "perftest", transport: d.transport(), device: d.Name,
		test: func(t Test) string { return ibTools[t] },
		missing: func() string {
			if why := lookPath("ib_write_lat", "perftest"); why != "" {
				return why
			}
			switch {
			case d.IWARP && !d.IP.IsValid():
				return fmt.Sprintf("perftest reaches iWARP device %s only through rdma_cm, and it has no IP address", d.Name)
			case !d.viaCM() && d.LinkLayer == "Ethernet" && d.GIDIndex < 0:
				return fmt.Sprintf("RoCE device %s has no IP address for rdma_cm nor a RoCE v2 GID for perftest's -x", d.Name)
			}
			return ""
		},
		run: func(ctx context.Context, p Params) (*Result, error) {
			var err error
			for range ibToolAttempts {
				var r *Result
				r, err = runIBTool(ctx, d, p)
				if err == nil {
					return r, nil
				}
				if !errors.Is(err, errUncalibrated) {
					return nil, err
				}
			}
			return nil, fmt.Errorf("%w, %d times", err, ibToolAttempts)
		},
	}
}

// ibToolArgs are the arguments of perftest's program for p on d, both
// sides; the client adds the server's address.
func ibToolArgs(d KernelDevice, p Params, port int) []string {
	args := []string{"-d", d.Name, "-i", "1", "-p", itoa(port), "-n", itoa(p.Iters), "-F", "--use_old_post_send"}
	switch {
	case d.viaCM():
		args = append(args, "-R")
	case d.GIDIndex >= 0:
		args = append(args, "-x", itoa(d.GIDIndex))
	}
	if !p.Test.Atomic() {
		args = append(args, "-s", itoa(p.Size))
	}
	if op := p.Test.Opcode(); op == verbs.OpSend || op == verbs.OpRDMAWrite {
		args = append(args, "-I", itoa(p.Inline))
	}
	if !p.Test.Latency() {
		args = append(args, "-t", itoa(p.TxDepth), "-Q", itoa(p.cqMod()))
		if p.postList() > 1 {
			args = append(args, "-l", itoa(p.postList()))
		}
		if p.Test == SendBW {
			args = append(args, "-r", itoa(p.RxDepth))
		}
	}
	if p.Event {
		args = append(args, "-e")
	}
	return args
}

// runIBTool runs perftest's program for p on d once.
func runIBTool(ctx context.Context, d KernelDevice, p Params) (*Result, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := ibToolArgs(d, p, port)
	prog := ibTools[p.Test]
	server := append([]string{prog}, args...)
	target, ready := "127.0.0.1", port
	if d.viaCM() {
		// rdma_cm on RoCE listens where /proc/net/tcp does not show.
		target, ready = d.IP.String(), 0
	}
	client := append(append([]string{prog}, args...), target)
	out, errOut, err := runPairOutputs(ctx, nil, server, client, ready)
	if err != nil {
		return nil, err
	}
	r, err := parseIBTool(errOut+out, p)
	if err != nil {
		return nil, err
	}
	r.Iters = p.Iters
	if !p.Test.Latency() {
		r.Window = p.TxDepth
		if p.postList() > 1 {
			r.PostList = p.postList()
		}
	}
	r.Event = p.Event
	return r, nil
}

// parseIBTool reads the result of a perftest program's run of p from its
// output. A latency test's table is
//
//	#bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
//	8       1000          25.78          5850.46      54.71               94.08           307.60          1836.79                 5850.46
//
// (send and write latencies are half the round trip, read and atomic
// latencies the whole operation, as this package's); a bandwidth test's is
//
//	#bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
//	65536      1000             33.02              16.03               0.000256
//
// with MB of 2^20 bytes. The run's header says how many bytes perftest
// sent inline ("Max inline data : 0[B]"); perftest turns inline sends off
// on devices it does not know to have them, and a run that sent less
// inline than p asks measures other work than goverbs' and is refused.
// A run whose clock calibration failed ("Correlation coefficient r^2:
// ... < 0.9"; its figures are then inf, or 0 for bandwidth) is
// errUncalibrated.
func parseIBTool(out string, p Params) (*Result, error) {
	prog := ibTools[p.Test]
	if strings.Contains(out, "Correlation coefficient r^2") {
		return nil, errUncalibrated
	}
	var cols, vals []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Max inline data" {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), "[B]"))
			if err == nil && n < p.Inline && p.Size <= p.Inline {
				return nil, fmt.Errorf("%s sent up to %d bytes inline, not the %d asked (perftest turns inline off on devices it does not know): give -I %d to compare like with like", prog, n, p.Inline, n)
			}
			continue
		}
		if strings.HasPrefix(line, "#bytes") {
			cols = ibToolColumns(line)
			continue
		}
		f := strings.Fields(line)
		if cols == nil || len(f) != len(cols) {
			continue
		}
		if n, err := strconv.Atoi(f[0]); err == nil && n == p.Size {
			vals = f
		}
	}
	if cols == nil || vals == nil {
		return nil, fmt.Errorf("no result line for %d bytes in %s's output: %s", p.Size, prog, firstLine(out))
	}
	col := func(name string) (float64, error) {
		for i, c := range cols {
			if c == name {
				if vals[i] == "inf" {
					return 0, errUncalibrated
				}
				return parseFigure(prog, c, vals[i])
			}
		}
		return 0, fmt.Errorf("%s's output has no %s column: %s", prog, name, strings.Join(cols, " "))
	}
	figures := func(names ...string) ([]float64, error) {
		v := make([]float64, len(names))
		for i, n := range names {
			var err error
			if v[i], err = col(n); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	if p.Test.Latency() {
		v, err := figures("t_min[usec]", "t_typical[usec]", "t_avg[usec]", "99% percentile[usec]", "t_max[usec]")
		if err != nil {
			return nil, err
		}
		return &Result{Lat: &Latency{Min: v[0], Typical: v[1], Avg: v[2], P99: v[3], Max: v[4]}}, nil
	}
	v, err := figures("BW peak[MB/sec]", "BW average[MB/sec]", "MsgRate[Mpps]")
	if err != nil {
		return nil, err
	}
	return &Result{BW: &Bandwidth{PeakMiBps: v[0], AvgMiBps: v[1], Mpps: v[2]}}, nil
}

// ibToolColumns splits perftest's table header into its columns, whose
// names may hold one space ("BW peak[MB/sec]", "99% percentile[usec]").
func ibToolColumns(header string) []string {
	var cols []string
	f := strings.Fields(header)
	for i := 0; i < len(f); i++ {
		c := f[i]
		if (c == "BW" || strings.HasSuffix(c, "%")) && i+1 < len(f) {
			c += " " + f[i+1]
			i++
		}
		cols = append(cols, c)
	}
	return cols
}
