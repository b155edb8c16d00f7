package perftest

import (
	"context"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// Overrides are the parameters a user set. A negative field keeps the
// default DefaultParams chooses.
type Overrides struct {
	Iters, Warmup, TxDepth, RxDepth, CQMod, Inline, PostList int
	Event                                                    bool
}

// NoOverrides keeps every default.
var NoOverrides = Overrides{Iters: -1, Warmup: -1, TxDepth: -1, RxDepth: -1, CQMod: -1, Inline: -1, PostList: -1}

// Params returns the parameters of test t at size bytes on a device with
// attributes a: perftest's defaults, less what o overrides. Setting the
// iterations alone makes the warm-up a tenth of them.
func (o Overrides) Params(t Test, size int, a verbs.DeviceAttr) Params {
	p := DefaultParams(t, size, a)
	set := func(dst *int, v int) {
		if v >= 0 {
			*dst = v
		}
	}
	if o.Iters >= 0 {
		p.Iters, p.Warmup = o.Iters, o.Iters/10
	}
	set(&p.Warmup, o.Warmup)
	if t.Latency() {
		// A latency test has one operation in flight: the window applies
		// to bandwidth tests, as in perftest.
	} else {
		set(&p.TxDepth, o.TxDepth)
		set(&p.PostList, o.PostList)
	}
	set(&p.RxDepth, o.RxDepth)
	set(&p.CQMod, o.CQMod)
	set(&p.Inline, o.Inline)
	p.Event = o.Event
	return p
}

// Suite is what a bench invocation runs: every test at every size, with
// the user's overrides.
type Suite struct {
	Tests     []Test
	Sizes     []int
	Overrides Overrides
}

// Params lists the suite's runs on a device with attributes a, test by
// test; atomics run at AtomicSize only.
func (s Suite) Params(a verbs.DeviceAttr) []Params {
	var ps []Params
	for _, t := range s.Tests {
		for _, size := range t.Sizes(s.Sizes) {
			ps = append(ps, s.Overrides.Params(t, size, a))
		}
	}
	return ps
}

// RunOptions are how RunAll runs a suite.
type RunOptions struct {
	// Timeout bounds each run.
	Timeout time.Duration
	// Budget, if set, bounds the measured part of each run: a short
	// probe run first estimates the time an iteration takes, and a run
	// whose iterations would take longer than Budget runs fewer of them
	// (at least MinBudgetIters). The result gives the count it ran.
	Budget time.Duration
	// Progress, if set, is called before each run.
	Progress func(i int, p Params)
}

// Iterations of a budgeted run: at least MinBudgetIters, after a probe of
// probeIters.
const (
	MinBudgetIters = 50
	probeIters     = 20
)

// RunAll runs each of ps against the server at addr from dev. It stops at
// the first failure.
func RunAll(ctx context.Context, dev *verbs.Context, addr string, ps []Params, o RunOptions) ([]*Result, error) {
	var out []*Result
	for i, p := range ps {
		if o.Progress != nil {
			o.Progress(i, p)
		}
		if o.Budget > 0 && p.Iters > MinBudgetIters {
			probe := p
			probe.Iters, probe.Warmup = probeIters, min(p.Warmup, probeIters/2)
			r, err := runOne(ctx, dev, addr, probe, o.Timeout)
			if err != nil {
				return out, err
			}
			if per := r.iterTime(); per > 0 {
				if n := int(o.Budget / per); n < p.Iters {
					p.Iters = max(n, MinBudgetIters)
					p.Warmup = p.Iters / 10
				}
			}
		}
		r, err := runOne(ctx, dev, addr, p, o.Timeout)
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

func runOne(ctx context.Context, dev *verbs.Context, addr string, p Params, timeout time.Duration) (*Result, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return Run(ctx, dev, addr, p)
}

// iterTime estimates the wall time of one iteration of r's loop: a round
// trip of a ping-pong, an operation otherwise.
func (r *Result) iterTime() time.Duration {
	switch {
	case r.Lat != nil && (r.Test == SendLat || r.Test == WriteLat):
		return time.Duration(2 * r.Lat.Avg * float64(time.Microsecond))
	case r.Lat != nil:
		return time.Duration(r.Lat.Avg * float64(time.Microsecond))
	case r.BW != nil && r.BW.Mpps > 0:
		return time.Duration(float64(time.Microsecond) / r.BW.Mpps)
	}
	return 0
}
