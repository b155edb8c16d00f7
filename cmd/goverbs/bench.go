package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/coreprobe"
	"github.com/goverbs/goverbs/internal/perftest"
	"github.com/goverbs/goverbs/verbs"
)

// benchConfig is what the bench command's flags and arguments set.
type benchConfig struct {
	device  string
	listen  string
	addr    string // the server to run against; empty: self-contained
	tests   []perftest.Test
	size    sizeFlag
	all     bool
	o       perftest.Overrides
	compare bool
	repeat  int // --compare's rounds
	json    bool
	csv     bool
	plot    string
	md      string   // write a Markdown report to this file
	args    []string // the command line, for the Markdown report
	timeout time.Duration
	cpuProf string // write a CPU profile of this process here
	peer    bool   // hidden: serve for a parent goverbs bench
	goTCP   bool   // hidden: be the server process of the Go TCP peer
}

const benchDoc = `Bench measures goverbs devices with perftest's tests and conventions:
send_lat, write_lat, read_lat and atomic_lat (latency) and send_bw,
write_bw, read_bw and atomic_bw (bandwidth and message rate). Name the
tests to run; without names it runs them all.

Latency: send_lat and write_lat are ping-pongs and report half the round
trip (write_lat polls the last byte of its buffer for the peer's write);
read_lat and atomic_lat (fetch-and-add) report the whole operation.
Figures are t_min, t_typical (the median), t_avg, the 99th percentile and
t_max in microseconds. Bandwidth: a window (--tx-depth) of work requests
is kept outstanding; BW peak and BW average are in MiB/s (2^20 bytes, as
perftest and ucx_perftest count "MB"), the message rate in Mpps. Every
result also gives the CPU time per iteration of both processes.

With no address, bench is self-contained: for every local device it
starts a bench server (another goverbs process for devices that cross
processes, such as shm0; a goroutine for loop0) and runs the tests
against it. With --compare it runs each test and size, right after
goverbs has, on the peers that are installed (ucx_perftest over shared
memory and TCP, fi_pingpong over libfabric's shm and tcp providers,
plain Go TCP, and on a kernel RDMA device such as rxe0 perftest's own
ib_* programs on the same device) and prints their figures beside
goverbs' with the ratio:
on a shared machine, whose speed drifts over a run, each ratio compares
runs seconds apart. --repeat n makes n such rounds of each test and size
and gives each ratio's median and range over them.

Across processes or hosts, start a server and point a client at it:

  goverbs bench -l shm://@bench          # server (tcp://:18515 across hosts)
  goverbs bench shm://@bench write_bw    # client (tcp://server:18515 ...)`

func runBench(ctx context.Context, e *env, args []string) error {
	cfg := benchConfig{o: perftest.NoOverrides, args: args}
	fs := newFlagSet("bench", "[address] [test ...]", benchDoc, e)
	iters, warmup := optInt{v: &cfg.o.Iters}, optInt{v: &cfg.o.Warmup}
	txDepth, rxDepth := optInt{v: &cfg.o.TxDepth}, optInt{v: &cfg.o.RxDepth}
	cqMod, inline := optInt{v: &cfg.o.CQMod}, optInt{v: &cfg.o.Inline}
	postList := optInt{v: &cfg.o.PostList}
	fs.String(&cfg.device, "device", "d", "", "the `device` to use (default: every local device; with an address, the one that\nserves its scheme)")
	fs.String(&cfg.listen, "listen", "l", "", "serve as the bench server on this cm `address` (shm://@name, shm:///path.sock)")
	fs.Value(&cfg.size, "size", "s", "message size in `bytes` (suffixes K, M: 64K) (default: 8, 64, 4K, 64K and 1M);\nwith -l, the largest the server runs (default 8M)")
	fs.Bool(&cfg.all, "all", "a", "run every size from 2 bytes to 8 MiB")
	fs.Value(&iters, "iters", "n", "`n` measured iterations (default: 1000 for latency tests, 5000 for bandwidth)")
	fs.Value(&warmup, "warmup", "w", "`n` unmeasured warm-up iterations first (default: a tenth of --iters)")
	fs.Value(&txDepth, "tx-depth", "t", "the bandwidth tests' window: `n` work requests kept outstanding (default 128)")
	fs.Value(&rxDepth, "rx-depth", "r", "`n` receives kept posted in Send tests (default 512)")
	fs.Value(&cqMod, "cq-mod", "Q", "signal one send work request in `n` (default 100)")
	fs.Value(&postList, "post-list", "", "bandwidth tests post `n` work requests per PostSend (perftest's --post_list) (default 1)")
	fs.Value(&inline, "inline", "I", "send messages of up to `bytes` inline; 0: never (default: 236 for Sends, 220\nfor Writes, capped to the device's limit)")
	fs.Bool(&cfg.o.Event, "event", "e", "wait for completions (CQ.Wait: ReqNotify and the completion channel)\ninstead of busy polling")
	fs.Bool(&cfg.compare, "compare", "", "also run the installed peers (ucx_perftest, fi_pingpong, Go TCP; perftest's\nib_* on a kernel device) on the same tests and sizes, and print their figures with the ratio")
	fs.Int(&cfg.repeat, "repeat", "", 1, "with --compare, run each test and size `n` times, goverbs and the peers in turn,\nand give the median and range of each ratio")
	fs.Bool(&cfg.json, "json", "", "print the results as JSON")
	fs.Bool(&cfg.csv, "csv", "", "print the results as CSV")
	fs.String(&cfg.plot, "plot", "", "", "draw latency and bandwidth against size into this PNG `file`")
	fs.String(&cfg.md, "markdown", "", "", "also write the results, how they were measured and the command that made them\ninto this Markdown `file` (as docs/performance.md is made)")
	fs.Duration(&cfg.timeout, "timeout", "", time.Minute, "give up on a run that takes longer than this (with -l: end a run\nthat takes longer, a client's included)")
	fs.String(&cfg.cpuProf, "cpuprofile", "", "", "write a CPU profile of this process (the client; with -l, the server) to `file`")
	fs.Hidden(&cfg.peer, "peer", "serve for a parent goverbs bench: print the address, exit at the end of stdin")
	fs.Hidden(&cfg.goTCP, "gotcp-peer", "serve the Go TCP peer of a parent goverbs bench at the address it gives")
	pos, err := fs.parseInterspersed(args)
	if err != nil {
		return err
	}
	if err := cfg.parseArgs(pos); err != nil {
		return err
	}
	if cfg.goTCP {
		if cfg.addr == "" {
			return usageError("--gotcp-peer needs the tcp:// address of its parent")
		}
		return perftest.ServeGoTCPChild(ctx, cfg.addr)
	}
	if exe, err := os.Executable(); err == nil {
		perftest.GoTCPChild = []string{exe, "bench", "--gotcp-peer"}
	}
	if err := cfg.check(); err != nil {
		return err
	}
	if cfg.cpuProf != "" {
		stop, err := startCPUProfile(cfg.cpuProf)
		if err != nil {
			return err
		}
		defer stop()
	}
	if cfg.listen != "" {
		return benchServe(ctx, e, cfg)
	}
	return benchRun(ctx, e, cfg)
}

// parseArgs takes the address (the argument with "://") and the tests.
func (cfg *benchConfig) parseArgs(args []string) error {
	for _, a := range args {
		if strings.Contains(a, "://") {
			if cfg.addr != "" {
				return usageError("two addresses, %q and %q: give one", cfg.addr, a)
			}
			cfg.addr = a
			continue
		}
		t, err := perftest.ParseTest(a)
		if err != nil {
			return usageError("%v", err)
		}
		cfg.tests = append(cfg.tests, t)
	}
	if len(cfg.tests) == 0 {
		cfg.tests = perftest.Tests
	}
	return nil
}

func (cfg *benchConfig) check() error {
	switch {
	case cfg.json && cfg.csv:
		return usageError("--json and --csv both given: choose one")
	case cfg.size.set && cfg.all:
		return usageError("-s and -a both given: choose one")
	case cfg.listen != "" && cfg.addr != "":
		return usageError("-l serves, an address is a server to run against: give one of them")
	case cfg.listen != "" && (cfg.compare || cfg.json || cfg.csv || cfg.plot != "" || cfg.md != ""):
		return usageError("the server (-l) measures nothing itself: give --compare, --json, --csv, --plot and --markdown to the client")
	case cfg.peer && cfg.listen == "":
		return usageError("--peer needs -l")
	case cfg.repeat < 1:
		return usageError("--repeat %d: give at least 1", cfg.repeat)
	case cfg.repeat > 1 && !cfg.compare:
		return usageError("--repeat repeats --compare's rounds: give --compare too")
	case cfg.timeout <= 0:
		return usageError("--timeout must be positive, got %v", cfg.timeout)
	case cfg.plot != "" && !strings.HasSuffix(strings.ToLower(cfg.plot), ".png"):
		return usageError("--plot %s: the plot is a PNG; name the file FILE.png", cfg.plot)
	case cfg.md != "" && !strings.HasSuffix(strings.ToLower(cfg.md), ".md"):
		return usageError("--markdown %s: the report is Markdown; name the file FILE.md", cfg.md)
	}
	for _, v := range []struct {
		name string
		n    int
		min  int
	}{{"--iters", cfg.o.Iters, 1}, {"--tx-depth", cfg.o.TxDepth, 1}, {"--rx-depth", cfg.o.RxDepth, 1}, {"--cq-mod", cfg.o.CQMod, 1}} {
		if v.n != -1 && v.n < v.min {
			return usageError("%s %d: give at least %d", v.name, v.n, v.min)
		}
	}
	return nil
}

func (cfg *benchConfig) sizes() []int {
	switch {
	case cfg.size.set:
		return []int{cfg.size.n}
	case cfg.all:
		return perftest.AllSizes()
	}
	return perftest.DefaultSizes()
}

func (cfg *benchConfig) suite() perftest.Suite {
	return perftest.Suite{Tests: cfg.tests, Sizes: cfg.sizes(), Overrides: cfg.o}
}

// deviceFor returns the device to use with addr: -d, or the local device
// whose provider serves the address's scheme.
func deviceFor(cfg benchConfig, addr string) (verbs.DeviceInfo, error) {
	if cfg.device != "" {
		return findDevice(cfg.device)
	}
	scheme, _, _ := strings.Cut(addr, "://")
	transport := map[string]string{"loop": "loop", "shm": "shm", "tcp": "iwarp"}[scheme]
	var names []string
	for _, d := range verbs.Devices() {
		if d.Transport == transport {
			return d, nil
		}
		names = append(names, d.Name)
	}
	return verbs.DeviceInfo{}, fmt.Errorf("no local device serves %s:// addresses (devices: %s): give one with -d, or an address such as shm://@name",
		scheme, strings.Join(names, ", "))
}

// benchServe is the bench server: it serves until interrupted or, as a
// parent's peer, until its standard input ends.
func benchServe(ctx context.Context, e *env, cfg benchConfig) error {
	info, err := deviceFor(cfg, cfg.listen)
	if err != nil {
		return err
	}
	dev, err := verbs.Open(info.Name)
	if err != nil {
		return err
	}
	defer dev.Close()
	l, err := cm.Listen(cfg.listen)
	if err != nil {
		return err
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts := perftest.ServeOptions{RunTimeout: cfg.timeout}
	if cfg.size.set {
		opts.MaxSize = cfg.size.n
	}
	if len(cfg.tests) < len(perftest.Tests) {
		opts.Only = cfg.tests
	}
	if cfg.peer {
		// The parent reads the address from this line, and closes our
		// standard input when it is done with us, or dies.
		fmt.Fprintf(e.stdout, "listening %s\n", l.Addr())
		go func() {
			io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	} else {
		fmt.Fprintf(e.stdout, "goverbs bench: serving %s on %s (device %s); stop with Ctrl-C\n", testList(cfg.tests), l.Addr(), info.Name)
		opts.Log = e.stdout
	}
	return perftest.Serve(ctx, dev, l, opts)
}

func testList(ts []perftest.Test) string {
	if len(ts) == len(perftest.Tests) {
		return "every test"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return strings.Join(s, ", ")
}

// benchRun is the client: against the server at cfg.addr, or
// self-contained on every local device.
func benchRun(ctx context.Context, e *env, cfg benchConfig) error {
	start := time.Now()
	suite := cfg.suite()
	var devs []verbs.DeviceInfo
	switch {
	case cfg.addr != "":
		d, err := deviceFor(cfg, cfg.addr)
		if err != nil {
			return err
		}
		devs = []verbs.DeviceInfo{d}
	case cfg.device != "":
		d, err := findDevice(cfg.device)
		if err != nil {
			return err
		}
		devs = []verbs.DeviceInfo{d}
	default:
		devs = verbs.Devices()
	}
	// Check every run before starting any, so that a bad size or test
	// fails at once.
	plans := make([][]perftest.Params, len(devs))
	total := 0
	for i, d := range devs {
		dev, err := verbs.Open(d.Name)
		if err != nil {
			return err
		}
		attr := dev.QueryDevice()
		dev.Close()
		plans[i] = suite.Params(attr)
		for _, p := range plans[i] {
			if err := p.Check(d.Name, attr); err != nil {
				return err
			}
		}
		total += len(plans[i])
	}
	if cfg.compare {
		total *= cfg.repeat
	}
	prog := newProgress(e)
	defer prog.done()
	rep := &perftest.Report{Date: start.Format(time.RFC3339), Host: hostInfo(), Event: cfg.o.Event,
		CacheLine: &perftest.CacheLine{BeforeNs: cacheLineNs()}}
	benches := make([]*deviceBench, 0, len(devs))
	defer func() {
		for _, b := range benches {
			b.close()
		}
	}()
	for i, d := range devs {
		b, err := openDeviceBench(ctx, cfg, d, plans[i])
		if err != nil {
			return err
		}
		benches = append(benches, b)
	}
	n := 0
	run := func(b *deviceBench, plan []perftest.Params) error {
		res, err := b.run(ctx, plan, func(_ int, p perftest.Params) {
			n++
			prog.show("[%d/%d] %s %v %d B", n, total, b.name, p.Test, p.Size)
		})
		rep.Results = append(rep.Results, res...)
		return err
	}
	if !cfg.compare {
		for _, b := range benches {
			if err := run(b, b.plan); err != nil {
				prog.done()
				return err
			}
		}
	} else {
		// Each test and size runs on every device and then, at once, on
		// every peer, so that a ratio compares runs seconds apart, not
		// the two ends of a suite over which the machine's speed drifts.
		peerParams := suite.Params(verbs.DeviceAttr{MaxInlineData: 1 << 16})
		kernel, kernelSkipped := kernelPlans(devs, plans)
		runs, skipped := perftest.PlanPeers(peerParams, kernel...)
		rep.Skipped = append(kernelSkipped, skipped...)
		type placed struct {
			at  int // the run's place in runs
			res *perftest.Result
		}
		var peerResults []placed
		var rounds []perftest.Comparison
		for _, g := range testSizes(append(plans, peerParams)) {
			for round := range cfg.repeat {
				ours := len(rep.Results)
				for _, b := range benches {
					if err := run(b, g.of(b.plan)); err != nil {
						prog.done()
						return err
					}
				}
				var theirs []*perftest.Result
				for i, r := range runs {
					if !g.has(r.Params) || ctx.Err() != nil {
						continue
					}
					if cfg.repeat > 1 {
						prog.show("comparing (round %d/%d): %s", round+1, cfg.repeat, r)
					} else {
						prog.show("comparing: %s", r)
					}
					// A run that fails in one round is tried again in the
					// next: perftest's clock calibration, say, fails now
					// and then on an emulated machine.
					res, skip := r.Run(ctx, cfg.timeout)
					if skip != nil {
						if cfg.repeat > 1 {
							skip.Reason = fmt.Sprintf("round %d of %d: %s", round+1, cfg.repeat, skip.Reason)
						}
						rep.Skipped = append(rep.Skipped, *skip)
						continue
					}
					peerResults = append(peerResults, placed{i, res})
					theirs = append(theirs, res)
				}
				rounds = append(rounds, perftest.Compare(rep.Results[ours:], theirs)...)
			}
		}
		// Report in the plans' order: a device's, and a peer's, tests
		// together.
		slices.SortStableFunc(rep.Results, func(a, b *perftest.Result) int {
			return slices.IndexFunc(benches, func(d *deviceBench) bool { return d.name == a.Device }) -
				slices.IndexFunc(benches, func(d *deviceBench) bool { return d.name == b.Device })
		})
		slices.SortStableFunc(peerResults, func(a, b placed) int { return a.at - b.at })
		for _, p := range peerResults {
			rep.Peers = append(rep.Peers, p.res)
		}
		rep.Comparisons = perftest.Summarize(rounds)
	}
	prog.done()
	rep.CacheLine.AfterNs = cacheLineNs()
	if cfg.plot != "" {
		if err := perftest.Plot(cfg.plot, rep); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	if cfg.md != "" {
		if err := writeMarkdown(cfg, rep); err != nil {
			return fmt.Errorf("markdown: %w", err)
		}
	}
	switch {
	case cfg.json:
		return perftest.WriteJSON(e.stdout, rep)
	case cfg.csv:
		return perftest.WriteCSV(e.stdout, append(rep.Results, rep.Peers...))
	}
	mode := "polling for completions"
	if cfg.o.Event {
		mode = "waiting for completion events"
	}
	writeHeader(e.stdout, "goverbs bench", rep, mode)
	if err := perftest.WriteTable(e.stdout, rep.Results); err != nil {
		return err
	}
	if cfg.compare {
		fmt.Fprintln(e.stdout)
		if err := perftest.WriteTable(e.stdout, rep.Peers); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout)
		if err := perftest.WriteComparison(e.stdout, rep.Comparisons, rep.Skipped); err != nil {
			return err
		}
	}
	if cfg.plot != "" {
		fmt.Fprintf(e.stdout, "\nplot: %s\n", cfg.plot)
	}
	fmt.Fprintf(e.stdout, "\n%d runs in %.1fs\n", len(rep.Results)+len(rep.Peers), time.Since(start).Seconds())
	return nil
}

// runBudget bounds each run's measured iterations when neither -n nor
// --compare is given, so that the default suite stays short on a slow
// device.
const runBudget = 500 * time.Millisecond

// deviceBench is a device opened for bench, with its server: cfg.addr,
// or one of its own.
type deviceBench struct {
	name string
	plan []perftest.Params
	cfg  benchConfig
	dev  *verbs.Context
	addr string
	srv  *benchServer // nil against cfg.addr
}

// openDeviceBench opens device d, whose runs are plan, and starts its
// server unless cfg names one.
func openDeviceBench(ctx context.Context, cfg benchConfig, d verbs.DeviceInfo, plan []perftest.Params) (*deviceBench, error) {
	b := &deviceBench{name: d.Name, plan: plan, cfg: cfg, addr: cfg.addr}
	if b.addr == "" {
		maxSize := 0
		for _, p := range plan {
			maxSize = max(maxSize, p.Size)
		}
		srv, err := startBenchServer(ctx, d, perftest.ServeOptions{RunTimeout: cfg.timeout, MaxSize: maxSize})
		if err != nil {
			return nil, err
		}
		b.srv, b.addr = srv, srv.addr
	}
	dev, err := verbs.Open(d.Name)
	if err != nil {
		b.close()
		return nil, err
	}
	b.dev = dev
	return b, nil
}

// run runs ps (a part of b.plan) on the device.
func (b *deviceBench) run(ctx context.Context, ps []perftest.Params, progress func(int, perftest.Params)) ([]*perftest.Result, error) {
	opts := perftest.RunOptions{Timeout: b.cfg.timeout, Progress: progress}
	if b.cfg.o.Iters < 0 && !b.cfg.compare {
		// Peers run perftest's counts: so do comparisons.
		opts.Budget = runBudget
	}
	res, err := perftest.RunAll(ctx, b.dev, b.addr, ps, opts)
	if err != nil {
		return res, explainRunError(err, b.addr, b.cfg)
	}
	return res, nil
}

// close closes the device and stops its server.
func (b *deviceBench) close() {
	if b.dev != nil {
		b.dev.Close()
		b.dev = nil
	}
	if b.srv != nil {
		b.srv.stop()
		b.srv = nil
	}
}

// testSize is one test at one message size: a group of the runs that
// --compare makes one after another.
type testSize struct {
	test perftest.Test
	size int
}

func (g testSize) has(p perftest.Params) bool { return p.Test == g.test && p.Size == g.size }

// of returns the runs of plan in group g.
func (g testSize) of(plan []perftest.Params) []perftest.Params {
	var out []perftest.Params
	for _, p := range plan {
		if g.has(p) {
			out = append(out, p)
		}
	}
	return out
}

// testSizes returns the groups of the plans' runs, in the order they first
// appear.
func testSizes(plans [][]perftest.Params) []testSize {
	var out []testSize
	for _, plan := range plans {
		for _, p := range plan {
			g := testSize{p.Test, p.Size}
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
	}
	return out
}

// explainRunError turns a failed run into one line that says what to do.
func explainRunError(err error, addr string, cfg benchConfig) error {
	var rej *perftest.RejectedError
	switch {
	case errors.Is(err, cm.ErrRefused):
		if cfg.addr == "" {
			return fmt.Errorf("the bench server at %s went away: %w", addr, err)
		}
		return fmt.Errorf("nothing listens at %s: start the server there first with \"goverbs bench -l %s\"", addr, addr)
	case errors.As(err, &rej):
		return fmt.Errorf("the server at %s refused the run: %s", addr, rej.Reason)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: no result within --timeout %v; is the server at %s alive? raise --timeout for long runs", err, cfg.timeout, addr)
	case errors.Is(err, perftest.ErrPeerGone):
		return fmt.Errorf("%w: is the server at %s still running?", err, addr)
	}
	return err
}

// benchServer is the server side of a self-contained run.
type benchServer struct {
	addr string
	stop func() error
}

// startBenchServer starts a bench server for device d: another goverbs
// process for a device that crosses processes, a goroutine otherwise.
// It serves runs as o allows: as long and as large as the client's own.
func startBenchServer(ctx context.Context, d verbs.DeviceInfo, o perftest.ServeOptions) (*benchServer, error) {
	dev, err := verbs.Open(d.Name)
	if err != nil {
		return nil, err
	}
	cross := dev.QueryDevice().Has(verbs.CapCrossProcess)
	addr, err := benchAddr(d)
	if err != nil {
		dev.Close()
		return nil, err
	}
	if cross {
		dev.Close()
		return startServerProcess(d.Name, addr, o)
	}
	l, err := cm.Listen(addr)
	if err != nil {
		dev.Close()
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var serveErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		serveErr = perftest.Serve(sctx, dev, l, o)
	}()
	return &benchServer{addr: l.Addr(), stop: func() error {
		cancel()
		wg.Wait()
		l.Close()
		dev.Close()
		return serveErr
	}}, nil
}

// startServerProcess re-executes this goverbs as a bench server (the
// hidden --peer flag) and waits until it listens.
func startServerProcess(device, addr string, o perftest.ServeOptions) (*benchServer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("cannot find the goverbs executable to start a bench server: %w", err)
	}
	args := []string{"bench", "--peer", "-d", device, "-l", addr, "--timeout", o.RunTimeout.String()}
	if o.MaxSize > 0 {
		args = append(args, "-s", strconv.Itoa(o.MaxSize))
	}
	cmd := exec.Command(exe, args...)
	perftest.DieWithParent(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a bench server process: %w", err)
	}
	exited := make(chan error, 1)
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
		io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	stop := func() error {
		stdin.Close()
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		select {
		case err := <-exited:
			if err != nil {
				return fmt.Errorf("the bench server process failed: %v: %s", err, oneLine(stderr.String()))
			}
			return nil
		case <-t.C:
			cmd.Process.Kill()
			<-exited
			return errors.New("the bench server process did not stop; killed it")
		}
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case s := <-line:
		got, ok := strings.CutPrefix(strings.TrimSpace(s), "listening ")
		if !ok {
			stop()
			return nil, fmt.Errorf("the bench server process for %s did not start: %s", device, oneLine(stderr.String()))
		}
		return &benchServer{addr: got, stop: stop}, nil
	case <-t.C:
		cmd.Process.Kill()
		stop()
		return nil, fmt.Errorf("the bench server process for %s did not listen within 10s: %s", device, oneLine(stderr.String()))
	}
}

// writeMarkdown writes the report to cfg.md, saying which command made it
// and on what machine; the plot, if any, is linked relative to the file.
func writeMarkdown(cfg benchConfig, rep *perftest.Report) error {
	doc := perftest.MarkdownDoc{Command: commandLine(append([]string{"goverbs", "bench"}, cfg.args...)), Machine: cpuModel()}
	if cfg.plot != "" {
		rel, err := filepath.Rel(filepath.Dir(cfg.md), cfg.plot)
		if err != nil {
			rel = cfg.plot
		}
		doc.Plot = filepath.ToSlash(rel)
	}
	f, err := os.Create(cfg.md)
	if err != nil {
		return err
	}
	if err := perftest.WriteMarkdown(f, rep, doc); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// commandLine joins args as a shell would read them back.
func commandLine(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = a
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~") {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// cpuModel names the machine's processor (/proc/cpuinfo's model name),
// or returns "" where it cannot tell.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return ""
}

// hostInfo describes the machine for the report.
func hostInfo() string {
	s := fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			s += ", load " + f[0]
		}
	}
	return s
}

// cacheLineRounds is how many round trips a cache line makes in one
// measurement of its cost (tens of milliseconds).
const cacheLineRounds = 100_000

// cacheLineNs measures a cache line's round trip between two processors
// (internal/coreprobe), in nanoseconds; 0 when it cannot be measured.
func cacheLineNs() float64 {
	d, err := coreprobe.RoundTrip(cacheLineRounds)
	if err != nil {
		return 0
	}
	return float64(d.Nanoseconds())
}

// writeHeader prints a report's first lines: the command, when and
// where it ran, how (mode, if any), and the cost of a cache line's
// round trip between processors before and after.
func writeHeader(w io.Writer, command string, rep *perftest.Report, mode string) {
	fmt.Fprintf(w, "%s, %s, %s", command, rep.Date, rep.Host)
	if mode != "" {
		fmt.Fprintf(w, "; %s", mode)
	}
	fmt.Fprintln(w)
	if rep.CacheLine != nil {
		fmt.Fprintln(w, rep.CacheLine)
	}
	fmt.Fprintln(w)
}

// progress shows what bench is doing on one line of a terminal's
// standard error, and nothing when it is not a terminal.
type progress struct {
	w     io.Writer
	shown bool
}

func newProgress(e *env) *progress {
	if !e.stderrTTY {
		return &progress{}
	}
	return &progress{w: e.stderr}
}

func (p *progress) show(format string, args ...any) {
	if p.w == nil {
		return
	}
	fmt.Fprintf(p.w, "\r\033[K"+format, args...)
	p.shown = true
}

func (p *progress) done() {
	if p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

// sizeFlag is a message size: a number of bytes, optionally with a K or
// M suffix (KiB, MiB).
type sizeFlag struct {
	n   int
	set bool
}

func (s *sizeFlag) String() string {
	if !s.set {
		return ""
	}
	return strconv.Itoa(s.n)
}

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	s.n, s.set = n, true
	return nil
}

// parseSize reads 4096, 64K, 64KiB, 1M or 1MiB.
func parseSize(v string) (int, error) {
	num, mul := strings.TrimSpace(v), 1
	for _, u := range []struct {
		suffix string
		mul    int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if s, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mul = s, u.mul
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 40)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("size %q: give a number of bytes, such as 4096, 64K or 1M", v)
	}
	return int(n) * mul, nil
}

// optInt is an int flag whose default depends on the test; unset it
// leaves -1 in place.
type optInt struct{ v *int }

func (o optInt) String() string {
	if o.v == nil || *o.v < 0 {
		return ""
	}
	return strconv.Itoa(*o.v)
}

func (o optInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not a count: give a whole number, 0 or more", s)
	}
	*o.v = n
	return nil
}
