package perftest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// fabricPeer is libfabric's fi_pingpong over provider prov with endpoint
// type ep, server and client on 127.0.0.1. It is a message ping-pong, the
// counterpart of send_lat only.
func fabricPeer(prov, ep string) *peer {
	return &peer{
		stack: "libfabric", transport: prov,
		test: func(t Test) string {
			if t == SendLat {
				return "fi_pingpong"
			}
			return ""
		},
		missing: func() string { return lookPath("fi_pingpong", "libfabric-bin") },
		run: func(ctx context.Context, p Params) (*Result, error) {
			port, err := freePort()
			if err != nil {
				return nil, err
			}
			args := []string{"-p", prov, "-e", ep, "-I", itoa(p.Iters), "-S", itoa(p.Size)}
			server := append([]string{"fi_pingpong", "-B", itoa(port)}, args...)
			client := append([]string{"fi_pingpong", "-P", itoa(port)}, append(args, "127.0.0.1")...)
			out, err := runPair(ctx, nil, server, client, port)
			if err != nil {
				return nil, err
			}
			r, err := parseFabric(out, p.Size)
			if err != nil {
				return nil, err
			}
			r.Iters = p.Iters
			return r, nil
		},
	}
}

// parseFabric reads fi_pingpong's result line for size bytes:
//
//	bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
//	64      1k      =1k      125k        0.00s     56.04       1.14       0.88
//	64k     1k      =1k      125m        0.61s    216.57     302.61       0.00
//
// usec/xfer is the mean one-way time (the run's time over twice the
// iterations): half the round trip, as send_lat reports.
func parseFabric(out string, size int) (*Result, error) {
	var cols []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "bytes" {
			cols = f
			continue
		}
		if cols == nil || len(f) != len(cols) {
			continue
		}
		if n, ok := fabricSize(f[0]); !ok || n != size {
			continue
		}
		for i, c := range cols {
			if c == "usec/xfer" {
				v, err := parseFigure("fi_pingpong", c, f[i])
				if err != nil {
					return nil, err
				}
				return &Result{Lat: &Latency{Avg: v}}, nil
			}
		}
		return nil, fmt.Errorf("fi_pingpong's output has no usec/xfer column: %s", strings.Join(cols, " "))
	}
	return nil, fmt.Errorf("no result line for %d bytes in fi_pingpong's output: %s", size, firstLine(out))
}

// fabricSize reads fi_pingpong's byte counts: 64, 4k, 1m, 2g (powers of
// 1024).
func fabricSize(s string) (int, bool) {
	mul := 1
	switch {
	case strings.HasSuffix(s, "k"):
		mul = 1 << 10
	case strings.HasSuffix(s, "m"):
		mul = 1 << 20
	case strings.HasSuffix(s, "g"):
		mul = 1 << 30
	}
	if mul > 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, false
	}
	return n * mul, true
}
