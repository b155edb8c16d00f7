package perftest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// A peer is what goverbs is compared with: a program a user would
// otherwise pick for the same job on the same machine, run on the same
// tests and sizes in the same invocation. A peer that is not installed,
// or a run of it that fails, is skipped and named with the reason; it is
// never replaced by a figure from anywhere else.
type peer struct {
	stack, transport string
	// device is the goverbs device the peer runs on, for a peer that runs
	// on goverbs' own device (perftest's ib_* tools on a kernel device),
	// or "".
	device string
	// test is the peer's own name for its counterpart of t, or "" if it
	// has none.
	test func(t Test) string
	// missing says why the peer cannot run on this machine, or "".
	missing func() string
	// run measures the peer on p.
	run func(ctx context.Context, p Params) (*Result, error)
}

func (p *peer) name() string {
	if p.device != "" {
		return p.stack + " " + p.device
	}
	return p.stack + " " + p.transport
}

// peers are the peers, in the order they run.
func peers() []*peer {
	return []*peer{
		ucxPeer("sm", "sm,self"), ucxPeer("tcp", "tcp"),
		fabricPeer("shm", "rdm"), fabricPeer("tcp", "msg"),
		goTCPPeer(), goTCP2Peer(),
	}
}

// PeerRun is one run of a peer on one test and size.
type PeerRun struct {
	// Params are the test and size, as goverbs runs them.
	Params Params
	peer   *peer
	test   string // the peer's counterpart of Params.Test
}

// PlanPeers lists the runs of every installed peer on each of ps it has a
// counterpart for, peer by peer, and what it skips without running
// anything: peers that are not installed, and tests a peer has no
// counterpart of. Each of kernel is a kernel RDMA device goverbs runs on:
// perftest's own programs run there too, on that device's runs. The
// caller runs them (PeerRun.Run), interleaved with goverbs' own runs of
// the same test and size.
func PlanPeers(ps []Params, kernel ...KernelPlan) ([]PeerRun, []Skip) {
	var (
		runs    []PeerRun
		skipped []Skip
	)
	type planned struct {
		peer *peer
		ps   []Params
	}
	var all []planned
	for _, k := range kernel {
		all = append(all, planned{ibToolsPeer(k.Device), k.Params})
	}
	for _, pr := range peers() {
		all = append(all, planned{pr, ps})
	}
	for _, pl := range all {
		pr, ps := pl.peer, pl.ps
		if why := pr.missing(); why != "" {
			skipped = append(skipped, Skip{Peer: pr.name(), Reason: why})
			continue
		}
		var none []string
		for _, p := range ps {
			pt := pr.test(p.Test)
			if pt == "" {
				if len(none) == 0 || none[len(none)-1] != p.Test.String() {
					none = append(none, p.Test.String())
				}
				continue
			}
			runs = append(runs, PeerRun{Params: p, peer: pr, test: pt})
		}
		if len(none) > 0 && len(none) < len(Tests) {
			skipped = append(skipped, Skip{Peer: pr.name(), Reason: "has no counterpart of " + strings.Join(none, ", ")})
		}
	}
	return runs, skipped
}

// String names the run: the peer, its test and the size.
func (r PeerRun) String() string {
	return fmt.Sprintf("%s %s %d B", r.peer.name(), r.test, r.Params.Size)
}

// Run measures the peer within timeout. A run that fails is skipped: the
// Skip says why.
func (r PeerRun) Run(ctx context.Context, timeout time.Duration) (*Result, *Skip) {
	p := r.Params
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := r.peer.run(rctx, p)
	if err != nil {
		if rctx.Err() == context.DeadlineExceeded {
			err = fmt.Errorf("no result within --timeout %v", timeout)
		}
		return nil, &Skip{Peer: r.peer.name(), Test: r.test, Size: p.Size, Reason: oneLine(err.Error())}
	}
	res.Stack, res.Device, res.Transport, res.Test, res.PeerTest, res.Size = r.peer.stack, r.peer.device, r.peer.transport, p.Test, r.test, p.Size
	res.Event = res.Event && p.Event
	return res, nil
}

// parseFigure reads a peer program's figure s from its column: a finite
// number, not negative. A peer prints "inf" where its run was too short
// for its clock (ucx_perftest's bandwidth of a few microseconds); that run
// is skipped with the reason rather than compared, or written as JSON,
// which has no infinity.
func parseFigure(program, column, s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s's %s is %q: %w", program, column, s, err)
	case math.IsInf(v, 0) || math.IsNaN(v) || v < 0:
		return 0, fmt.Errorf("%s's %s is %q: not a measurement (a run too short for its clock?)", program, column, s)
	}
	return v, nil
}

// lookPath says why program is missing, naming the Debian package that
// has it, or "".
func lookPath(program, pkg string) string {
	if _, err := exec.LookPath(program); err != nil {
		return fmt.Sprintf("%s is not installed (Debian: apt-get install %s)", program, pkg)
	}
	return ""
}

// freePort returns a TCP port on the loopback that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// runPair runs a peer's server and then its client on the loopback, and
// returns the client's standard output. The server must listen on port
// for its out-of-band connection before the client starts; both are
// killed when ctx ends.
func runPair(ctx context.Context, env []string, server, client []string, port int) (string, error) {
	out, _, err := runPairOutputs(ctx, env, server, client, port)
	return out, err
}

// runPairOutputs is runPair, returning the client's standard error too.
// A port of 0 is a server whose listening /proc/net/tcp does not show (an
// rdma_cm listener on a RoCE or InfiniBand device): the client is run
// again, for up to 10 seconds, while it fails and the server runs.
func runPairOutputs(ctx context.Context, env []string, server, client []string, port int) (stdout, stderr string, err error) {
	srv := exec.CommandContext(ctx, server[0], server[1:]...)
	srv.Env = append(os.Environ(), env...)
	DieWithParent(srv)
	var srvOut bytes.Buffer
	srv.Stdout, srv.Stderr = &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		return "", "", err
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Wait() }()
	defer func() {
		srv.Process.Kill()
		<-srvDone
	}()
	if port > 0 {
		if err := waitListening(ctx, port, srvDone); err != nil {
			return "", "", fmt.Errorf("%s server: %w: %s", server[0], err, firstLine(srvOut.String()))
		}
	}
	var out, errOut bytes.Buffer
	for start := time.Now(); ; {
		out.Reset()
		errOut.Reset()
		cl := exec.CommandContext(ctx, client[0], client[1:]...)
		cl.Env = srv.Env
		DieWithParent(cl)
		cl.Stdout, cl.Stderr = &out, &errOut
		err := cl.Run()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return "", "", ctx.Err()
		}
		if port > 0 || time.Since(start) > 10*time.Second || serverExited(srvDone) {
			msg := firstLine(errOut.String() + out.String())
			return "", "", fmt.Errorf("%s client: %v: %s", client[0], err, msg)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", "", ctx.Err()
		case <-t.C:
		}
	}
	// The server ends with the run; give it a moment to say goodbye.
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-srvDone:
		srvDone <- nil
	case <-t.C:
	}
	return out.String(), errOut.String(), nil
}

// serverExited reports whether the server's Wait has returned, leaving
// its result in done for the next reader.
func serverExited(done chan error) bool {
	select {
	case err := <-done:
		done <- err
		return true
	default:
		return false
	}
}

// waitListening waits until a socket listens on TCP port (as
// /proc/net/tcp tells), the server exits, or ctx ends. Where /proc is not
// there it waits half a second.
func waitListening(ctx context.Context, port int, exited chan error) error {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		ok, err := listening(port)
		if err != nil {
			return sleepCtx(ctx, 500*time.Millisecond)
		}
		if ok {
			return nil
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("exited before listening (%v)", err)
		case <-deadline.C:
			return errors.New("did not listen within 10s")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// listening reports whether a TCP socket is in the LISTEN state on port.
func listening(port int) (bool, error) {
	found := false
	var lastErr error
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			lastErr = err
			continue
		}
		lastErr = nil
		if listensIn(b, port) {
			found = true
		}
	}
	return found, lastErr
}

// listensIn reports whether the /proc/net/tcp table b has a socket in
// state LISTEN (0A) on local port.
func listensIn(b []byte, port int) bool {
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "0A" {
			return true
		}
	}
	return false
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return "(no output)"
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func itoa(n int) string { return strconv.Itoa(n) }
