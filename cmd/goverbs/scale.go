package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/perftest"
	"github.com/goverbs/goverbs/verbs"
)

const scaleDoc = `Scale measures what many connections cost: it opens --conns connections
between this process and a child goverbs process, every QP of a side on
one shared CQ, and measures 8-byte RDMA Writes from this side, a window of
--window Writes outstanding, every one signaled:

  alone        one QP's rate with no other connection open
  idle         the same QP's rate with the other connections open and idle
  round-robin  Writes spread over every connection in turn
  goroutines   n goroutines each driving its own QP on its own CQ,
               writing a cache line of its own (--goroutines 1,2),
               their aggregate rate

and what each connection costs on each side: resident memory (VmRSS),
file descriptors, memory mappings (lines of /proc/self/maps) and
goroutines, from the difference between before and after the
connections were made, divided by their number.

  goverbs scale -d shm0 --conns 1000
  goverbs scale -d tcp0 --conns 1000 --json`

// scaleConfig is what the scale command's flags set.
type scaleConfig struct {
	device     string
	conns      int
	window     int
	duration   time.Duration
	rounds     int
	cqe        int
	goroutines string
	json       bool
	timeout    time.Duration
	cpuProf    string
	peer       bool // hidden: be the child process
	peerPolls  bool
	gs         []int
}

func runScale(ctx context.Context, e *env, args []string) error {
	var cfg scaleConfig
	fs := newFlagSet("scale", "", scaleDoc, e)
	fs.String(&cfg.device, "device", "d", "shm0", "the `device`: shm0 or tcp0 (a device that crosses processes)")
	fs.Int(&cfg.conns, "conns", "c", 1000, "`n` connections on the shared CQ")
	fs.Int(&cfg.window, "window", "t", 8, "`n` Writes kept outstanding")
	fs.Duration(&cfg.duration, "time", "", 500*time.Millisecond, "measure each rate over this long")
	fs.Int(&cfg.rounds, "rounds", "r", 3, "`n` rounds, each measuring every rate once")
	fs.Int(&cfg.cqe, "cqe", "", 256, "the CQs' size in `entries`, on both sides")
	fs.String(&cfg.goroutines, "goroutines", "g", "1,2", "the goroutine counts to measure, comma separated")
	fs.Bool(&cfg.json, "json", "", "print the results as JSON")
	fs.Duration(&cfg.timeout, "timeout", "", 5*time.Minute, "give up when the whole run takes longer than this")
	fs.String(&cfg.cpuProf, "cpuprofile", "", "", "write a CPU profile of the measuring process to `file`")
	fs.Bool(&cfg.peerPolls, "peer-polls", "", "the peer busy-polls its CQ, as a server that polls for requests does, rather\nthan leaving its connections to their providers' own receiving")
	fs.Hidden(&cfg.peer, "peer", "be the child of a parent goverbs scale: accept connections, print the costs, exit at the end of stdin")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	if err := cfg.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if cfg.peer {
		return scalePeer(ctx, e, cfg)
	}
	if cfg.cpuProf != "" {
		stop, err := startCPUProfile(cfg.cpuProf)
		if err != nil {
			return err
		}
		defer stop()
	}
	res, err := scaleRun(ctx, cfg)
	if err != nil {
		return err
	}
	if cfg.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	res.print(e.stdout)
	return nil
}

func (cfg *scaleConfig) check() error {
	switch {
	case cfg.conns < 1:
		return usageError("--conns %d: give at least 1", cfg.conns)
	case cfg.window < 1:
		return usageError("--window %d: give at least 1", cfg.window)
	case cfg.cqe < cfg.window:
		return usageError("--cqe %d: give at least the window, %d", cfg.cqe, cfg.window)
	case cfg.rounds < 1:
		return usageError("--rounds %d: give at least 1", cfg.rounds)
	case cfg.duration <= 0:
		return usageError("--time must be positive, got %v", cfg.duration)
	case cfg.timeout <= 0:
		return usageError("--timeout must be positive, got %v", cfg.timeout)
	}
	for _, f := range strings.Split(cfg.goroutines, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return usageError("--goroutines %q: give counts of at least 1, comma separated (1,2)", cfg.goroutines)
		}
		cfg.gs = append(cfg.gs, n)
	}
	return nil
}

// ScaleResult is what goverbs scale measures.
type ScaleResult struct {
	Device string `json:"device"`
	Conns  int    `json:"conns"`
	Window int    `json:"window"`
	CQE    int    `json:"cqe"`
	Rounds int    `json:"rounds"`
	// PeerPolls: the peer busy-polled its CQ.
	PeerPolls bool `json:"peer_polls"`
	// Rates in million Writes per second, medians over the rounds.
	Alone      float64 `json:"alone_mops"`
	Idle       float64 `json:"idle_mops"`
	RoundRobin float64 `json:"round_robin_mops"`
	// The ratios to the rate alone: medians of the rounds' own ratios.
	IdleRatio       Ratio           `json:"idle_ratio"`
	RoundRobinRatio Ratio           `json:"round_robin_ratio"`
	Goroutines      []GoroutineRate `json:"goroutines"`
	Client          PerConn         `json:"client"` // this side
	Server          PerConn         `json:"server"` // the child's side
}

// GoroutineRate is the aggregate rate of N goroutines.
type GoroutineRate struct {
	N     int     `json:"n"`
	Mops  float64 `json:"mops"`
	Ratio Ratio   `json:"ratio"`
}

// PerConn is one side's cost of a connection.
type PerConn struct {
	RSSKiB     float64 `json:"rss_kib"`
	FDs        float64 `json:"fds"`
	Maps       float64 `json:"maps"`
	Goroutines float64 `json:"goroutines"`
	// Total is the process's totals with every connection open.
	Total procCounts `json:"total"`
}

// procCounts is a process's resources, from /proc/self.
type procCounts struct {
	RSSKiB     int `json:"rss_kib"`
	FDs        int `json:"fds"`
	Maps       int `json:"maps"`
	Goroutines int `json:"goroutines"`
}

// readProcCounts reads this process's resident memory, open file
// descriptors, mappings and goroutines.
func readProcCounts() (procCounts, error) {
	var c procCounts
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return c, fmt.Errorf("read resident memory: %w", err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				c.RSSKiB, _ = strconv.Atoi(f[0])
			}
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return c, fmt.Errorf("count file descriptors: %w", err)
	}
	c.FDs = len(fds)
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return c, fmt.Errorf("count mappings: %w", err)
	}
	c.Maps = bytes.Count(maps, []byte{'\n'})
	c.Goroutines = runtime.NumGoroutine()
	return c, nil
}

// perConn is the cost of each of n connections: after less before,
// divided by n.
func perConn(before, after procCounts, n int) PerConn {
	d := float64(n)
	return PerConn{
		RSSKiB:     float64(after.RSSKiB-before.RSSKiB) / d,
		FDs:        float64(after.FDs-before.FDs) / d,
		Maps:       float64(after.Maps-before.Maps) / d,
		Goroutines: float64(after.Goroutines-before.Goroutines) / d,
		Total:      after,
	}
}

func (r *ScaleResult) print(w io.Writer) {
	fmt.Fprintf(w, "goverbs scale: %s, %d connections, one CQ of %d entries per side, 8 B RDMA Writes, %d outstanding, all signaled\n", r.Device, r.Conns, r.CQE, r.Window)
	if r.PeerPolls {
		fmt.Fprintf(w, "the peer busy-polls its CQ\n")
	}
	fmt.Fprintf(w, "rates in Mops/s, medians of %d rounds; ratios to the rate alone, median (range) of the rounds' own\n", r.Rounds)
	fmt.Fprintf(w, "  alone          %8.3f\n", r.Alone)
	fmt.Fprintf(w, "  %4d idle      %8.3f  %v\n", r.Conns-1, r.Idle, r.IdleRatio)
	fmt.Fprintf(w, "  round-robin    %8.3f  %v\n", r.RoundRobin, r.RoundRobinRatio)
	for _, g := range r.Goroutines {
		fmt.Fprintf(w, "  %d goroutine(s) %8.3f  %v\n", g.N, g.Mops, g.Ratio)
	}
	fmt.Fprintf(w, "per connection   RSS KiB    fds   maps  goroutines   (process totals: RSS KiB, fds, maps, goroutines)\n")
	for _, s := range []struct {
		name string
		p    PerConn
	}{{"client", r.Client}, {"server", r.Server}} {
		fmt.Fprintf(w, "  %-12s %9.1f %6.2f %6.2f %11.2f   (%d, %d, %d, %d)\n", s.name, s.p.RSSKiB, s.p.FDs, s.p.Maps, s.p.Goroutines,
			s.p.Total.RSSKiB, s.p.Total.FDs, s.p.Total.Maps, s.p.Total.Goroutines)
	}
}

// scaleTarget is where the Writes go: the child's region, sent in each
// connection's private data.
type scaleTarget struct {
	addr uint64
	rkey uint32
}

func (t scaleTarget) encode() []byte {
	var b [12]byte
	binary.BigEndian.PutUint64(b[0:], t.addr)
	binary.BigEndian.PutUint32(b[8:], t.rkey)
	return b[:]
}

func decodeTarget(b []byte) (scaleTarget, error) {
	if len(b) < 12 {
		return scaleTarget{}, fmt.Errorf("the scale peer sent %d bytes of private data, want 12", len(b))
	}
	return scaleTarget{addr: binary.BigEndian.Uint64(b[0:]), rkey: binary.BigEndian.Uint32(b[8:])}, nil
}

// scaleSide is one process's device, PD, region and shared CQ.
type scaleSide struct {
	dev *verbs.Context
	pd  *verbs.PD
	mr  *verbs.MR
	cq  *verbs.CQ
}

func openScaleSide(device string, cqe int, access verbs.AccessFlags) (*scaleSide, error) {
	dev, err := verbs.Open(device)
	if err != nil {
		return nil, err
	}
	s := &scaleSide{dev: dev}
	if s.pd, err = dev.AllocPD(); err == nil {
		if s.mr, err = s.pd.AllocMR(scaleRegion, access); err == nil {
			s.cq, err = dev.CreateCQ(cqe)
		}
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	return s, nil
}

func (s *scaleSide) newQP(cq *verbs.CQ, depth int) (*verbs.QP, error) {
	return s.pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: uint32(depth), MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
}

// scaleConn is a connection and its QP.
type scaleConn struct {
	conn *cm.Conn
	qp   *verbs.QP
}

func (c scaleConn) close() {
	c.conn.Close()
	c.qp.Destroy()
}

// scalePeer is the child: it accepts connections, each on a QP of its
// shared CQ, until its standard input ends, and closes those the parent
// closed; once it has accepted cfg.conns, it prints what they cost.
func scalePeer(ctx context.Context, e *env, cfg scaleConfig) error {
	addr, err := defaultAddr(transportOf(cfg.device), "goverbs-scale")
	if err != nil {
		return err
	}
	s, err := openScaleSide(cfg.device, cfg.cqe, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		return err
	}
	defer s.dev.Close()
	l, err := cm.Listen(addr)
	if err != nil {
		return err
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stdinDone := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(stdinDone)
		cancel()
	}()
	runtime.GC()
	before, err := readProcCounts()
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "listening %s\n", l.Addr())
	pd := scaleTarget{addr: s.mr.Addr(), rkey: s.mr.RKey()}.encode()
	var conns []scaleConn
	defer func() {
		for _, c := range conns {
			c.close()
		}
	}()
	if cfg.peerPolls {
		var polling sync.WaitGroup
		stop := make(chan struct{})
		polling.Go(func() {
			wc := make([]verbs.WorkCompletion, 16)
			for {
				select {
				case <-stop:
					return
				default:
				}
				s.cq.Poll(wc)
			}
		})
		defer func() {
			close(stop)
			polling.Wait()
		}()
	}
	accepted := 0
	for {
		req, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				<-stdinDone
				return nil
			}
			return err
		}
		qp, err := s.newQP(s.cq, 1)
		if err != nil {
			req.Reject(nil)
			return err
		}
		conn, err := req.Accept(qp, &cm.Param{PrivateData: pd})
		if err != nil {
			qp.Destroy()
			return err
		}
		// The parent closes the connections of a round at its end.
		conns = slices.DeleteFunc(conns, func(c scaleConn) bool {
			select {
			case <-c.conn.Done():
				c.close()
				return true
			default:
				return false
			}
		})
		conns = append(conns, scaleConn{conn, qp})
		if accepted++; accepted == cfg.conns {
			runtime.GC()
			after, err := readProcCounts()
			if err != nil {
				return err
			}
			b, _ := json.Marshal(perConn(before, after, cfg.conns))
			fmt.Fprintf(e.stdout, "costs %s\n", b)
		}
	}
}

// transportOf returns the transport of a device, for its default
// address.
func transportOf(device string) string {
	for _, d := range verbs.Devices() {
		if d.Name == device {
			return d.Transport
		}
	}
	return ""
}

// scaleChild is the child process.
type scaleChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	exited chan error
	stderr bytes.Buffer
}

func startScaleChild(ctx context.Context, cfg scaleConfig) (*scaleChild, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("cannot find the goverbs executable to start the scale peer: %w", err)
	}
	c := &scaleChild{lines: make(chan string, 4), exited: make(chan error, 1)}
	c.cmd = exec.Command(exe, "scale", "--peer", "-d", cfg.device, "--conns", strconv.Itoa(cfg.conns), "--cqe", strconv.Itoa(cfg.cqe), "--timeout", cfg.timeout.String())
	if cfg.peerPolls {
		c.cmd.Args = append(c.cmd.Args, "--peer-polls")
	}
	perftest.DieWithParent(c.cmd)
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		return nil, "", err
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	c.cmd.Stderr = &c.stderr
	if err := c.cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start the scale peer: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		io.Copy(io.Discard, stdout)
		c.exited <- c.cmd.Wait()
	}()
	line, err := c.line(ctx, "listening ")
	if err != nil {
		c.stop()
		return nil, "", err
	}
	return c, line, nil
}

// line waits for the child's line that starts with prefix and returns
// the rest.
func (c *scaleChild) line(ctx context.Context, prefix string) (string, error) {
	select {
	case s, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("the scale peer ended early: %s", oneLine(c.stderr.String()))
		}
		rest, found := strings.CutPrefix(s, prefix)
		if !found {
			return "", fmt.Errorf("the scale peer said %q, want %q...", s, prefix)
		}
		return rest, nil
	case <-ctx.Done():
		return "", fmt.Errorf("waiting for the scale peer: %w", ctx.Err())
	}
}

// stop closes the child's standard input and waits for it to exit.
func (c *scaleChild) stop() error {
	c.stdin.Close()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case err := <-c.exited:
		if err != nil {
			return fmt.Errorf("the scale peer failed: %v: %s", err, oneLine(c.stderr.String()))
		}
		return nil
	case <-t.C:
		c.cmd.Process.Kill()
		<-c.exited
		return errors.New("the scale peer did not stop; killed it")
	}
}

// scaleRun is the measuring side. Each round measures one QP alone,
// opens the other connections, measures the QP beside them, the
// round-robin and the goroutines, and closes them again: on a shared
// machine, whose speed drifts, each ratio compares rates seconds apart,
// and the result is the median over the rounds.
func scaleRun(ctx context.Context, cfg scaleConfig) (res ScaleResult, err error) {
	res = ScaleResult{Device: cfg.device, Conns: cfg.conns, Window: cfg.window, CQE: cfg.cqe, Rounds: cfg.rounds, PeerPolls: cfg.peerPolls}
	child, addr, err := startScaleChild(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer func() {
		if e := child.stop(); err == nil {
			err = e
		}
	}()
	s, err := openScaleSide(cfg.device, cfg.cqe, verbs.AccessLocalWrite)
	if err != nil {
		return res, err
	}
	defer s.dev.Close()
	var conns []scaleConn
	defer func() {
		for _, c := range conns {
			c.close()
		}
	}()
	var target scaleTarget
	dial := func(cq *verbs.CQ) error {
		qp, err := s.newQP(cq, cfg.window)
		if err != nil {
			return err
		}
		conn, err := cm.Dial(ctx, addr, qp, nil)
		if err != nil {
			qp.Destroy()
			return fmt.Errorf("connection %d: %w", len(conns)+1, err)
		}
		conns = append(conns, scaleConn{conn, qp})
		target, err = decodeTarget(conn.PrivateData())
		return err
	}
	closeFrom := func(i int) {
		for _, c := range conns[i:] {
			c.close()
		}
		conns = conns[:i]
	}
	runtime.GC()
	before, err := readProcCounts()
	if err != nil {
		return res, err
	}
	if err := dial(s.cq); err != nil {
		return res, err
	}
	w := scaleWriter{cq: s.cq, window: cfg.window, target: target, src: s.mr}
	rounds := make([]scaleRound, cfg.rounds)
	for r := range rounds {
		m := &rounds[r]
		if m.alone, err = w.rate(ctx, conns[:1], cfg.duration); err != nil {
			return res, fmt.Errorf("alone: %w", err)
		}
		for len(conns) < cfg.conns {
			if err := dial(s.cq); err != nil {
				return res, err
			}
		}
		if r == 0 {
			runtime.GC()
			after, err := readProcCounts()
			if err != nil {
				return res, err
			}
			res.Client = perConn(before, after, cfg.conns)
			costs, err := child.line(ctx, "costs ")
			if err != nil {
				return res, err
			}
			if err := json.Unmarshal([]byte(costs), &res.Server); err != nil {
				return res, fmt.Errorf("the scale peer's costs: %w", err)
			}
		}
		if m.idle, err = w.rate(ctx, conns[:1], cfg.duration); err != nil {
			return res, fmt.Errorf("with idle connections: %w", err)
		}
		if m.rr, err = w.rate(ctx, conns, cfg.duration); err != nil {
			return res, fmt.Errorf("round-robin: %w", err)
		}
		// The goroutines' connections, each on its own CQ.
		var own []scaleWriter
		for _, g := range cfg.gs {
			for len(own) < g {
				cq, err := s.dev.CreateCQ(cfg.cqe)
				if err != nil {
					return res, err
				}
				defer cq.Destroy()
				if err := dial(cq); err != nil {
					return res, err
				}
				// Each goroutine writes a cache line of its own, as
				// independent writers would: on one line, two cores
				// would measure the line's handoffs between them.
				off := uint64(len(own)*writerStride) % scaleRegion
				own = append(own, scaleWriter{cq: cq, window: cfg.window, target: target, src: s.mr, off: off})
			}
			rate, err := parallelRate(ctx, own[:g], conns[cfg.conns:cfg.conns+g], cfg.duration)
			if err != nil {
				return res, fmt.Errorf("%d goroutines: %w", g, err)
			}
			m.gs = append(m.gs, rate)
		}
		closeFrom(1)
	}
	res.summarize(rounds, cfg.gs)
	return res, nil
}

// scaleRound is one round's rates.
type scaleRound struct {
	alone, idle, rr float64
	gs              []float64
}

// summarize sets the result's rates, the medians over the rounds, and
// the ratios, the medians of the rounds' own ratios with their range.
func (r *ScaleResult) summarize(rounds []scaleRound, gs []int) {
	pick := func(f func(m scaleRound) float64) []float64 {
		v := make([]float64, len(rounds))
		for i, m := range rounds {
			v[i] = f(m)
		}
		return v
	}
	ratio := func(f func(m scaleRound) float64) Ratio {
		return ratioOf(pick(func(m scaleRound) float64 {
			if m.alone == 0 {
				return 0
			}
			return f(m) / m.alone
		}))
	}
	r.Alone = median(pick(func(m scaleRound) float64 { return m.alone }))
	r.Idle = median(pick(func(m scaleRound) float64 { return m.idle }))
	r.RoundRobin = median(pick(func(m scaleRound) float64 { return m.rr }))
	r.IdleRatio = ratio(func(m scaleRound) float64 { return m.idle })
	r.RoundRobinRatio = ratio(func(m scaleRound) float64 { return m.rr })
	for i, g := range gs {
		get := func(m scaleRound) float64 { return m.gs[i] }
		r.Goroutines = append(r.Goroutines, GoroutineRate{N: g, Mops: median(pick(get)), Ratio: ratio(get)})
	}
}

// Ratio is a ratio's median over the rounds and its range.
type Ratio struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func ratioOf(v []float64) Ratio {
	return Ratio{Median: median(v), Min: slices.Min(v), Max: slices.Max(v)}
}

func (r Ratio) String() string {
	return fmt.Sprintf("%.2fx alone (%.2f-%.2f)", r.Median, r.Min, r.Max)
}

// parallelRate runs ws[i] on conns[i] in a goroutine each and returns
// their aggregate rate.
func parallelRate(ctx context.Context, ws []scaleWriter, conns []scaleConn, d time.Duration) (float64, error) {
	rates := make([]float64, len(ws))
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i := range ws {
		wg.Go(func() { rates[i], errs[i] = ws[i].rate(ctx, conns[i:i+1], d) })
	}
	wg.Wait()
	sum := 0.0
	for _, r := range rates {
		sum += r
	}
	return sum, errors.Join(errs...)
}

// scaleWriter keeps a window of signaled 8 B Writes outstanding on one
// CQ, from offset off of src to offset off of the target region.
type scaleWriter struct {
	cq     *verbs.CQ
	window int
	target scaleTarget
	src    *verbs.MR
	off    uint64
}

// scaleRegion is the size of each side's region; writerStride is how far
// apart the goroutines' Writes lie in it, two cache lines (a processor
// may fetch lines in adjacent pairs).
const (
	scaleRegion  = 4096
	writerStride = 128
)

// rate posts Writes over conns in turn, keeping w.window outstanding,
// for about d, and returns the rate in million Writes per second.
func (w scaleWriter) rate(ctx context.Context, conns []scaleConn, d time.Duration) (float64, error) {
	wr := []verbs.SendWR{{Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{w.src.SGE(int(w.off), 8)}, RemoteAddr: w.target.addr + w.off, RKey: w.target.rkey}}
	wc := make([]verbs.WorkCompletion, 16)
	next := 0
	post := func() error {
		_, err := conns[next].qp.PostSend(wr)
		if next++; next == len(conns) {
			next = 0
		}
		return err
	}
	outstanding := 0
	for outstanding < w.window {
		if err := post(); err != nil {
			return 0, err
		}
		outstanding++
	}
	var done int64
	start := time.Now()
	deadline := start.Add(d)
	stopping := false
	for outstanding > 0 {
		n := w.cq.Poll(wc)
		if n == 0 {
			if err := w.cq.Err(); err != nil {
				return 0, err
			}
			continue
		}
		for i := range n {
			if wc[i].Status != verbs.WCSuccess {
				return 0, fmt.Errorf("a Write completed with %v", wc[i].Status)
			}
		}
		outstanding -= n
		done += int64(n)
		if !stopping && done&^1023 != (done-int64(n))&^1023 {
			stopping = time.Now().After(deadline) || ctx.Err() != nil
		}
		if stopping {
			continue
		}
		for range n {
			if err := post(); err != nil {
				return 0, err
			}
			outstanding++
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return float64(done) / time.Since(start).Seconds() / 1e6, nil
}
