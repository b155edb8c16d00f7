package perftest

import (
	"context"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// Overrides are the parameters a user set. A negative field keeps the
// default DefaultParams chooses.
type Overrides struct {
	Iters, Warmup, TxDepth, RxDepth, CQMod, Inline int
	Event                                          bool
}

// NoOverrides keeps every default.
var NoOverrides = Overrides{Iters: -1, Warmup: -1, TxDepth: -1, RxDepth: -1, CQMod: -1, Inline: -1}

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

// RunAll runs each of ps against the server at addr from dev, each within
// timeout, calling progress before each run. It stops at the first
// failure.
func RunAll(ctx context.Context, dev *verbs.Context, addr string, ps []Params, timeout time.Duration, progress func(i int, p Params)) ([]*Result, error) {
	var out []*Result
	for i, p := range ps {
		if progress != nil {
			progress(i, p)
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		r, err := Run(rctx, dev, addr, p)
		cancel()
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}
