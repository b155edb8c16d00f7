package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// session is one run of a test: the control connection, the test's
// connection and the test's memory.
type session struct {
	cfg    config
	client bool
	pd     *verbs.PD
	out    io.Writer

	l           *cm.Listener // the server's, for both connections
	peerHost    string       // the server's: the host of the control connection's peer
	ctrl        *ctrl
	data        *dataEP
	mr          *verbs.MR // the source area at 0, the peer's area at area()
	peer        dest      // the peer's area, from the handshakes
	peerVersion string
}

// dialRetry is how long a client waits before it dials again a server
// that does not listen yet: perftest's server listens for the test's
// connection only once the handshake before it is done, and its own
// client tries ten times, 100 ms apart.
const dialRetry = 100 * time.Millisecond

// area is the offset of the area the peer writes into or reads from,
// after the source area, on a cache line of its own.
func (s *session) area() int { return (s.cfg.size + 63) &^ 63 }

// run makes perftest's two connections and its exchanges, and runs the
// test.
func (s *session) run(ctx context.Context) error {
	var err error
	if s.mr, err = s.pd.AllocMR(2*s.area(), verbs.AccessLocalWrite|s.cfg.test.access()); err != nil {
		return err
	}
	if err := s.connectCtrl(ctx); err != nil {
		return err
	}
	if err := s.exchangeParams(ctx); err != nil {
		return err
	}
	// The handshake before the test's connection, and the one after it:
	// perftest's address is not set yet in either, and both carry zeros.
	if _, err := s.ctrl.xchg(ctx, s.client, dest{}.encode(), destLen); err != nil {
		return fmt.Errorf("the handshake before the test's connection: %w", err)
	}
	if err := s.connectData(ctx); err != nil {
		return err
	}
	if s.cfg.test == sendLat {
		if err := s.data.postRecvs(s.mr, s.area(), s.cfg.size, min(s.cfg.iters, recvDepth)); err != nil {
			return err
		}
	}
	if _, err := s.ctrl.xchg(ctx, s.client, dest{}.encode(), destLen); err != nil {
		return fmt.Errorf("the handshake after the test's connection: %w", err)
	}
	if err := s.handshakes(ctx); err != nil {
		return err
	}
	start := time.Now()
	switch s.cfg.test {
	case sendLat:
		err = s.sendLat(ctx)
	case writeLat:
		err = s.writeLat(ctx)
	case readLat:
		if s.client {
			err = s.readLat(ctx)
		}
	}
	elapsed := time.Since(start)
	if err != nil {
		return fmt.Errorf("%v: %w", s.cfg.test, err)
	}
	if s.cfg.test.closingHandshake() {
		if _, err := s.ctrl.xchg(ctx, s.client, s.myDest().encode(), destLen); err != nil {
			return fmt.Errorf("the closing handshake: %w", err)
		}
	}
	per, what := elapsed/time.Duration(s.cfg.iters), "per Read"
	switch {
	case s.cfg.test == readLat && !s.client:
		// The Reads complete at the client alone.
		fmt.Fprintf(s.out, "perftestpeer: %v with perftest %s: served the client's Reads of %d bytes: ok\n", s.cfg.test, s.peerVersion, s.cfg.size)
		return nil
	case s.cfg.test != readLat:
		per, what = per/2, "one way"
	}
	fmt.Fprintf(s.out, "perftestpeer: %v with perftest %s: %d iterations of %d bytes: ok, %.2f us %s on average\n",
		s.cfg.test, s.peerVersion, s.cfg.iters, s.cfg.size, float64(per)/float64(time.Microsecond), what)
	return nil
}

// connectCtrl makes the control connection: the server listens (for the
// test's connection too) and accepts it, the client dials it.
func (s *session) connectCtrl(ctx context.Context) error {
	if !s.client {
		var err error
		if s.ctrl, err = newCtrl(s.pd); err != nil {
			return err
		}
		if s.l, err = cm.Listen(s.cfg.url(s.cfg.bind)); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "perftestpeer: %v: serving on %s\n", s.cfg.test, s.l.Addr())
		if s.cfg.ready != nil {
			s.cfg.ready(s.l.Addr())
		}
		req, err := s.l.Accept(ctx)
		if err != nil {
			return fmt.Errorf("waiting for perftest's control connection: %w", err)
		}
		s.peerHost = hostOf(req.Peer())
		if s.ctrl.conn, err = s.ctrl.ep.Accept(req, &cm.Param{}); err != nil {
			return fmt.Errorf("accept the control connection: %w", err)
		}
		return nil
	}
	addr := s.cfg.url(s.cfg.server)
	fmt.Fprintf(s.out, "perftestpeer: %v: connecting to %s\n", s.cfg.test, addr)
	for {
		c, err := newCtrl(s.pd)
		if err != nil {
			return err
		}
		if c.conn, err = c.ep.Dial(ctx, addr, &cm.Param{}); err == nil {
			s.ctrl = c
			return nil
		}
		c.close()
		if err := retry(ctx, err); err != nil {
			return fmt.Errorf("the control connection: %w", err)
		}
	}
}

// connectData makes the test's connection: the server accepts the next
// request, which must come from the control connection's peer; the
// client dials until the server listens.
func (s *session) connectData(ctx context.Context) error {
	if !s.client {
		d, err := newDataEP(s.pd, s.cfg)
		if err != nil {
			return err
		}
		s.data = d
		var req *cm.Request
		for {
			if req, err = s.l.Accept(ctx); err != nil {
				return fmt.Errorf("waiting for perftest's test connection: %w", err)
			}
			// Where the provider names the peer (tcp0 does), a request
			// from another host is not perftest's.
			if h := hostOf(req.Peer()); h == s.peerHost {
				break
			}
			req.Reject(nil)
		}
		if d.conn, err = d.ep.Accept(req, &cm.Param{}); err != nil {
			return fmt.Errorf("accept the test's connection: %w", err)
		}
		return nil
	}
	addr := s.cfg.url(s.cfg.server)
	for {
		d, err := newDataEP(s.pd, s.cfg)
		if err != nil {
			return err
		}
		if d.conn, err = d.ep.Dial(ctx, addr, &cm.Param{}); err == nil {
			s.data = d
			return nil
		}
		d.close()
		if err := retry(ctx, err); err != nil {
			return fmt.Errorf("the test's connection: %w", err)
		}
	}
}

// retry returns nil after dialRetry if err says that nothing listens
// (yet) at the address, else err (or ctx's error).
func retry(ctx context.Context, err error) error {
	if !errors.Is(err, cm.ErrRefused) {
		return err
	}
	t := time.NewTimer(dialRetry)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (last try: %w)", ctx.Err(), err)
	case <-t.C:
		return nil
	}
}

// hostOf is the host of a "host:port" peer name, or the name.
func hostOf(peer string) string {
	if h, _, err := net.SplitHostPort(peer); err == nil {
		return h
	}
	return peer
}

// exchangeParams exchanges what perftest exchanges before its handshakes:
// versions, buffer and cache line sizes, and path MTUs.
func (s *session) exchangeParams(ctx context.Context) error {
	v, err := s.ctrl.xchg(ctx, s.client, encodeVersion(s.cfg.version), versionLen)
	if err != nil {
		return fmt.Errorf("the version exchange: %w", err)
	}
	if s.peerVersion, err = checkVersion(v); err != nil {
		return err
	}
	for _, p := range []struct {
		what string
		val  uint32
	}{{"buffer size", pageSize}, {"cache line size", cacheLine}} {
		if _, err := s.ctrl.xchg(ctx, s.client, be32(p.val), 4); err != nil {
			return fmt.Errorf("the %s exchange: %w", p.what, err)
		}
	}
	if _, err := s.ctrl.xchg(ctx, s.client, encodeMTU(s.ctrl.ep.QP()), mtuLen); err != nil {
		return fmt.Errorf("the MTU exchange: %w", err)
	}
	return nil
}

// Sizes this side tells perftest, which takes the larger of its own and
// the peer's for its buffers: a page and a cache line.
const (
	pageSize  = 4096
	cacheLine = 64
)

// myDest is this side's struct pingpong_dest: its QP, and the area the
// peer writes into or reads from.
func (s *session) myDest() dest {
	d := dest{outReads: 1, qpn: s.data.ep.QP().Num(), rkey: s.mr.RKey(), vaddr: s.mr.Addr() + uint64(s.area()), gidIndex: -1}
	if a, err := s.data.ep.QP().Query(); err == nil {
		d.psn = a.SQPSN
	}
	return d
}

// handshakes makes the four handshakes before the test, which tell each
// side the other's area, and checks that the peer's are all the same.
// The last tells the client that the server's receives are posted.
func (s *session) handshakes(ctx context.Context) error {
	mine := s.myDest().encode()
	for i := range 4 {
		b, err := s.ctrl.xchg(ctx, s.client, mine, destLen)
		if err != nil {
			return fmt.Errorf("handshake %d of 4 before the test: %w", i+1, err)
		}
		d := decodeDest(b)
		if i > 0 && !d.same(s.peer) {
			return fmt.Errorf("handshake %d of 4 before the test: the peer's area changed from %v to %v", i+1, s.peer, d)
		}
		s.peer = d
	}
	if s.cfg.test != sendLat && s.peer.vaddr > ^uint64(0)-uint64(s.cfg.size) {
		return fmt.Errorf("the peer's area %v wraps around the address space", s.peer)
	}
	return nil
}

func (s *session) close() {
	var errs []error
	if s.data != nil {
		errs = append(errs, s.data.close())
	}
	if s.ctrl != nil {
		errs = append(errs, s.ctrl.close())
	}
	if s.l != nil {
		s.l.Close()
	}
	if s.mr != nil {
		errs = append(errs, s.mr.Dereg())
	}
	errs = append(errs, s.pd.Dealloc())
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "perftestpeer: releasing the objects:", err)
	}
}
