package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// ServeOptions configure a bench server.
type ServeOptions struct {
	// Only, if not empty, are the tests the server runs; it refuses
	// requests for others.
	Only []Test
	// Log, if set, gets a line for each run served or refused.
	Log io.Writer
	// RunTimeout bounds each run, from its request to the end (default
	// one minute): a client that connects and then does nothing holds
	// the server, which serves one run at a time, no longer.
	RunTimeout time.Duration
	// MaxSize is the largest message size a client may ask for (default
	// MaxAllSize): a request for more is refused before the server
	// registers memory for it.
	MaxSize int
}

func (o *ServeOptions) defaults() {
	if o.RunTimeout <= 0 {
		o.RunTimeout = time.Minute
	}
	if o.MaxSize <= 0 {
		o.MaxSize = MaxAllSize
	}
}

// Serve is the bench server: it accepts connections on l, one at a time,
// and takes its side of the test each one asks for, on device dev. A run
// that fails is logged and the server goes on; so does a failed accept.
// Serve returns nil when ctx ends, or an error once the listener is
// closed.
func Serve(ctx context.Context, dev *verbs.Context, l *cm.Listener, o ServeOptions) error {
	o.defaults()
	for {
		req, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, verbs.ErrClosed) {
				return fmt.Errorf("accept on %s: %w", l.Addr(), err)
			}
			// A failed accept (out of descriptors, say): the listener
			// goes on after a pause, and so does the server.
			if o.Log != nil {
				fmt.Fprintf(o.Log, "goverbs bench server: accept on %s: %v\n", l.Addr(), err)
			}
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, o.RunTimeout)
		p, err := serveOne(rctx, dev, req, o)
		cancel()
		if o.Log != nil {
			if err != nil {
				fmt.Fprintf(o.Log, "goverbs bench server: %v of %d B: %v\n", p.Test, p.Size, err)
			} else {
				fmt.Fprintf(o.Log, "goverbs bench server: served %v of %d B, %d iterations\n", p.Test, p.Size, p.Iters)
			}
		}
	}
}

// serveOne takes the server's side of one run.
func serveOne(ctx context.Context, dev *verbs.Context, req *cm.Request, o ServeOptions) (p Params, err error) {
	name := dev.Device().Name
	attr := dev.QueryDevice()
	reject := func(err error) (Params, error) {
		req.Reject(rejectReason(err, attr.MaxPrivateData))
		return p, err
	}
	p, client, credits, err := decodeRequest(req.PrivateData())
	if err != nil {
		return reject(err)
	}
	if len(o.Only) > 0 && !slices.Contains(o.Only, p.Test) {
		return reject(fmt.Errorf("%w: this server runs only %s: ask for that, or start the server without naming tests",
			ErrUnsupported, joinTests(o.Only)))
	}
	if p.Size > o.MaxSize {
		return reject(fmt.Errorf("%w: this server runs messages of up to %d bytes, not %d", ErrUnsupported, o.MaxSize, p.Size))
	}
	if err := p.Check(name+" (at the server)", attr); err != nil {
		return reject(err)
	}
	e, err := newEndpoint(ctx, dev, p)
	if err != nil {
		return reject(fmt.Errorf("the server cannot set up %v: %w", p.Test, err))
	}
	defer e.close()
	e.connected(client)
	e.credits = p.Test == SendBW && credits
	preposted := 0
	if p.Test == SendLat || p.Test == SendBW {
		// The client's done message follows the last data message.
		e.ctrlAfterData = true
		if preposted, err = e.prepostRecv(); err != nil {
			return reject(err)
		}
	} else if err := e.postCtrlRecv(); err != nil {
		return reject(err)
	}
	if e.conn, err = req.Accept(e.qp, param(encodeReply(e.target()))); err != nil {
		return p, err
	}
	switch p.Test {
	case SendLat:
		err = e.sendLat(false, nil, preposted)
	case WriteLat:
		err = e.writeLat(false, nil)
	case SendBW:
		err = e.recvBW(preposted)
	default:
		// One-sided: this side's CPU takes no part. It sleeps until the
		// client says it is done.
		e.mark()
	}
	if err != nil {
		return p, err
	}
	if _, err := e.ctrlRecv(ctrlDone); err != nil {
		return p, err
	}
	if !p.Test.twoSided() {
		e.markEnd()
	}
	if err := e.ctrlSend(ctrlReport, ctrlMsg{cpu: e.cpu(), pid: os.Getpid()}); err != nil {
		return p, err
	}
	// The client hangs up once it has the report.
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-e.conn.Done():
	case <-ctx.Done():
	case <-t.C:
	}
	return p, nil
}
