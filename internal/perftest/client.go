package perftest

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// Run runs one test as the client: it connects to the bench server at
// addr from device dev, runs the measured loop and returns the result.
// A refusal by the server is a *RejectedError; parameters the device
// cannot run are refused before connecting, with ErrUnsupported.
func Run(ctx context.Context, dev *verbs.Context, addr string, p Params) (*Result, error) {
	e, preposted, err := dial(ctx, dev, addr, p)
	if err != nil {
		return nil, err
	}
	defer e.close()
	res, err := e.measure(preposted)
	if err != nil {
		return nil, fmt.Errorf("%v of %d B on %s: %w", p.Test, p.Size, dev.Device().Name, err)
	}
	if err := e.finish(res); err != nil {
		return nil, fmt.Errorf("end of %v: %w", p.Test, err)
	}
	return res, nil
}

// dial sets up the client's side of a run and connects it to the server.
func dial(ctx context.Context, dev *verbs.Context, addr string, p Params) (*endpoint, int, error) {
	name := dev.Device().Name
	if err := p.Check(name, dev.QueryDevice()); err != nil {
		return nil, 0, err
	}
	e, err := newEndpoint(ctx, dev, p)
	if err != nil {
		return nil, 0, fmt.Errorf("set up %v on %s: %w", p.Test, name, err)
	}
	preposted := 0
	if p.Test == SendLat {
		if preposted, err = e.prepostRecv(); err != nil {
			e.close()
			return nil, 0, err
		}
	}
	e.credits = p.Test == SendBW && needCredits(dev.QueryDevice())
	conn, err := cm.Dial(ctx, addr, e.qp, param(encodeRequest(p, e.target(), e.credits)))
	if err != nil {
		e.close()
		var rej *cm.RejectError
		if errors.As(err, &rej) {
			return nil, 0, &RejectedError{Reason: string(rej.PrivateData)}
		}
		return nil, 0, err
	}
	e.conn = conn
	remote, err := decodeReply(conn.PrivateData())
	if err != nil {
		e.close()
		return nil, 0, err
	}
	e.connected(remote)
	return e, preposted, nil
}

// stamps makes room for n timestamps and touches every page of it, as
// perftest clears its arrays before a run: the loop would otherwise take
// a page fault each 512 iterations (2-3% of an 8-byte write_bw).
func stamps(n int) []int64 {
	s := make([]int64, n)
	for i := 0; i < n; i += 512 {
		s[i] = 0
	}
	return s
}

// measure runs the client's measured loop and computes the figures.
func (e *endpoint) measure(preposted int) (*Result, error) {
	p := e.p
	attr := e.pd.Context().QueryDevice()
	res := &Result{Stack: "goverbs", Device: e.pd.Context().Device().Name, Transport: attr.Transport,
		Test: p.Test, Size: p.Size, Iters: p.Iters, Event: p.Event}
	var err error
	if p.Test.Latency() {
		posted := stamps(p.total())
		switch p.Test {
		case SendLat:
			err = e.sendLat(true, posted, preposted)
		case WriteLat:
			err = e.writeLat(true, posted)
		default:
			err = e.opLat(posted)
		}
		if err != nil {
			return nil, err
		}
		toNanos(posted)
		lat, _ := latencyStats(posted[p.Warmup:], p.Test == SendLat || p.Test == WriteLat, nil)
		res.Lat = &lat
		return res, nil
	}
	res.Window = p.TxDepth
	if p.postList() > 1 {
		res.PostList = p.postList()
	}
	n := max(p.Iters, p.Warmup)
	posted, completed := stamps(n), stamps(n)
	if p.Warmup > 0 {
		if err := e.bw(p.Warmup, posted[:p.Warmup], completed[:p.Warmup]); err != nil {
			return nil, err
		}
	}
	e.mark()
	err = e.bw(p.Iters, posted[:p.Iters], completed[:p.Iters])
	e.markEnd()
	if err != nil {
		return nil, err
	}
	toNanos(posted, completed)
	bw := bandwidthStats(p.Size, posted[:p.Iters], completed[:p.Iters], p.cqMod())
	res.BW = &bw
	return res, nil
}

// finish tells the server the run is over, learns its CPU time and adds
// both sides' CPU time per iteration to res.
func (e *endpoint) finish(res *Result) error {
	if err := e.postCtrlRecv(); err != nil {
		return err
	}
	if err := e.ctrlSend(ctrlDone, ctrlMsg{cpu: e.cpu(), pid: os.Getpid()}); err != nil {
		return err
	}
	rep, err := e.ctrlRecv(ctrlReport)
	if err != nil {
		return err
	}
	cpu := e.cpu()
	if cpu < 0 {
		return nil
	}
	per := func(d int64) float64 { return float64(d) / 1e3 / float64(e.p.Iters) }
	res.CPU = &CPU{ClientUs: per(int64(cpu))}
	switch {
	case rep.pid == os.Getpid():
		res.CPU.SameProcess = true
	case rep.cpu < 0:
		res.CPU.ServerUnknown = true
	default:
		res.CPU.ServerUs = per(int64(rep.cpu))
	}
	return nil
}
