package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/goverbs/goverbs/internal/grpcecho"
	"github.com/goverbs/goverbs/internal/perftest"
	"github.com/goverbs/goverbs/rsock"
	"github.com/goverbs/goverbs/verbs"
)

const sockDoc = `Sock bench measures rsock, the net.Conn over RDMA, with the programs
goverbs bench runs over Go TCP, on each device given (both ends in this
process):

  req_resp    a request of --req-size bytes and its response of the same
              size, one at a time (send_lat: half the round trip, µs)
  stream      --stream-size writes to a reader that drains them
              (send_bw: MiB/s)
  grpc_unary  a gRPC unary call of --req-size bytes each way through a
              context dialer and a net.Listener (send_lat: half the
              call, µs)
  idle        --idle connections that each sent one byte each way and
              then stay open and unused: the CPU the process uses over
              --idle-time, in all and per connection (% of a core);
              over rsock only, with or without --compare

With --compare each runs right after over Go's TCP loopback, the same
program on net.Conn, and the ratios are printed with the goals rsock
has: on shm0, req_resp ≤ 0.25× TCP's latency, stream ≥ 2× its
throughput, grpc_unary ≤ 0.7× its latency; on tcp0, req_resp ≤ 1.2× and
stream ≥ 0.9×. The goal of idle is under 1% of a core per connection.`

type sockConfig struct {
	devices     string
	iters       int
	streamIters int
	reqSize     sizeFlag
	streamSize  sizeFlag
	compare     bool
	repeat      int
	json        bool
	plot        string
	timeout     time.Duration
	ring        int
	spin        time.Duration
	zeroCopyMin int
	idle        int
	idleTime    time.Duration
}

// sockRun is one benchmark of sock bench.
type sockRun struct {
	name string
	test perftest.Test
}

var sockRuns = []sockRun{{"req_resp", perftest.SendLat}, {"stream", perftest.SendBW}, {"grpc_unary", perftest.SendLat}}

func runSock(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "bench" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprintf(e.stdout, "usage: goverbs sock bench [flags]\n\n%s\n", sockDoc)
			return flag.ErrHelp
		}
		return usageError("sock has one subcommand, bench: goverbs sock bench [flags]")
	}
	cfg := sockConfig{reqSize: sizeFlag{n: 64, set: true}, streamSize: sizeFlag{n: 1 << 20, set: true}}
	fs := newFlagSet("sock bench", "", sockDoc, e)
	fs.String(&cfg.devices, "device", "d", "shm0,tcp0", "the `devices` to run rsock on, comma-separated")
	fs.Int(&cfg.iters, "iters", "n", 5000, "`n` measured round trips of req_resp and grpc_unary (a tenth more warm up first)")
	fs.Int(&cfg.streamIters, "stream-iters", "", 300, "`n` measured writes of stream")
	fs.Value(&cfg.reqSize, "req-size", "", "request and response size in `bytes` (default 64)")
	fs.Value(&cfg.streamSize, "stream-size", "", "stream write size in `bytes` (default 1M)")
	fs.Int(&cfg.ring, "ring", "", 0, "rsock's receive ring in `bytes` (default rsock.DefaultRingSize, rsock.DefaultRingSizeIWARP on tcp0)")
	fs.Duration(&cfg.spin, "spin", "", 0, "how long rsock's waiting Read or Write polls before it parks (default rsock.DefaultSpin;\nnegative: never)")
	fs.Int(&cfg.zeroCopyMin, "zero-copy-min", "", 0, "rsock's least Write sent without a copy, in `bytes` (default rsock.DefaultZeroCopyMin,\nrsock.DefaultZeroCopyMinIWARP on tcp0; negative: every Write is copied)")
	fs.Int(&cfg.idle, "idle", "", 100, "`n` connections for idle (0: do not measure idle)")
	fs.Duration(&cfg.idleTime, "idle-time", "", time.Second, "measure idle over this long")
	fs.Bool(&cfg.compare, "compare", "", "also run each benchmark over Go TCP loopback and print the ratios")
	fs.Int(&cfg.repeat, "repeat", "", 1, "with --compare, run each benchmark `n` times, rsock and TCP in turn, and give the\nmedian and range of each ratio")
	fs.Bool(&cfg.json, "json", "", "print the results as JSON")
	fs.String(&cfg.plot, "plot", "", "", "draw the results as bars into this PNG `file`")
	fs.Duration(&cfg.timeout, "timeout", "", time.Minute, "give up on a run that takes longer than this")
	if err := fs.parse(args[1:]); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return usageError("unexpected arguments %q", fs.Args())
	case cfg.iters < 10 || cfg.streamIters < 1:
		return usageError("--iters must be at least 10 and --stream-iters at least 1")
	case cfg.plot != "" && !strings.HasSuffix(strings.ToLower(cfg.plot), ".png"):
		return usageError("--plot %s: the plot is a PNG; name the file FILE.png", cfg.plot)
	case cfg.timeout <= 0:
		return usageError("--timeout must be positive")
	case cfg.idle < 0 || cfg.idleTime <= 0:
		return usageError("--idle must not be negative and --idle-time must be positive")
	case cfg.repeat < 1:
		return usageError("--repeat %d: give at least 1", cfg.repeat)
	case cfg.repeat > 1 && !cfg.compare:
		return usageError("--repeat repeats --compare's rounds: give --compare too")
	}
	rcfg := &rsock.Config{RingSize: cfg.ring, Spin: cfg.spin, ZeroCopyMin: cfg.zeroCopyMin}
	start := time.Now()
	rep := &perftest.Report{Date: start.Format(time.RFC3339), Host: hostInfo(),
		CacheLine: &perftest.CacheLine{BeforeNs: cacheLineNs()}}
	var devs []verbs.DeviceInfo
	for _, name := range strings.Split(cfg.devices, ",") {
		d, err := findDevice(strings.TrimSpace(name))
		if err != nil {
			return err
		}
		devs = append(devs, d)
	}
	prog := newProgress(e)
	defer prog.done()
	var rounds []perftest.Comparison
	for _, run := range sockRuns {
		p := perftest.Params{Test: run.test, Size: cfg.reqSize.n, Iters: cfg.iters, Warmup: cfg.iters / 10}
		if run.name == "stream" {
			p.Size, p.Iters, p.Warmup = cfg.streamSize.n, cfg.streamIters, max(cfg.streamIters/10, 1)
		}
		for round := range cfg.repeat {
			var ours []*perftest.Result
			for _, d := range devs {
				prog.show("%s over rsock %s (round %d/%d)", run.name, d.Name, round+1, cfg.repeat)
				r, err := sockMeasure(ctx, cfg, run, p, func(ctx context.Context) (net.Listener, func(context.Context, string) (net.Conn, error), error) {
					l, err := rcfg.Listen(sockAddr(d))
					return l, rcfg.Dial, err
				})
				if err != nil {
					return fmt.Errorf("%s over rsock on %s: %w", run.name, d.Name, err)
				}
				r.Stack, r.Device, r.Transport, r.PeerTest = "rsock", d.Name, d.Transport, run.name
				ours = append(ours, r)
			}
			rep.Results = append(rep.Results, ours...)
			if !cfg.compare {
				continue
			}
			prog.show("%s over Go TCP (round %d/%d)", run.name, round+1, cfg.repeat)
			r, err := sockMeasure(ctx, cfg, run, p, func(ctx context.Context) (net.Listener, func(context.Context, string) (net.Conn, error), error) {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				var d net.Dialer
				return l, func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }, err
			})
			if err != nil {
				return fmt.Errorf("%s over Go TCP: %w", run.name, err)
			}
			r.Stack, r.Transport, r.PeerTest = "go", "tcp", run.name
			rep.Peers = append(rep.Peers, r)
			for _, o := range ours {
				cs := perftest.Compare([]*perftest.Result{o}, []*perftest.Result{r})
				for i := range cs {
					// Summarize tells the runs apart by test, size and
					// names: the benchmark goes into the names.
					cs[i].Ours += " " + run.name
					cs[i].PeerTest = run.name
				}
				rounds = append(rounds, cs...)
			}
		}
	}
	rep.Comparisons = perftest.Summarize(rounds)
	for _, d := range devs {
		if cfg.idle == 0 {
			break
		}
		prog.show("idle: %d connections over rsock %s for %v", cfg.idle, d.Name, cfg.idleTime)
		idle, err := sockIdle(ctx, cfg, rcfg, d)
		if err != nil {
			return fmt.Errorf("idle over rsock on %s: %w", d.Name, err)
		}
		rep.Idle = append(rep.Idle, idle)
	}
	prog.done()
	rep.CacheLine.AfterNs = cacheLineNs()
	if cfg.plot != "" {
		if err := sockPlot(cfg.plot, rep); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	if cfg.json {
		return perftest.WriteJSON(e.stdout, rep)
	}
	writeHeader(e.stdout, "goverbs sock bench", rep, "")
	if err := perftest.WriteTable(e.stdout, rep.Results); err != nil {
		return err
	}
	if cfg.compare {
		fmt.Fprintln(e.stdout)
		if err := perftest.WriteTable(e.stdout, rep.Peers); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout)
		if err := writeSockGoals(e, rep); err != nil {
			return err
		}
	}
	if len(rep.Idle) > 0 {
		fmt.Fprintln(e.stdout)
		writeSockIdle(e, rep.Idle)
	}
	if cfg.plot != "" {
		fmt.Fprintf(e.stdout, "\nplot: %s\n", cfg.plot)
	}
	fmt.Fprintf(e.stdout, "\n%d runs in %.1fs\n", len(rep.Results)+len(rep.Peers), time.Since(start).Seconds())
	return nil
}

// sockIdle measures cfg.idle idle connections over rsock on d (both
// ends in this process) once they have had time to stop polling.
func sockIdle(ctx context.Context, cfg sockConfig, rcfg *rsock.Config, d verbs.DeviceInfo) (*perftest.Idle, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	l, err := rcfg.Listen(sockAddr(d))
	if err != nil {
		return nil, err
	}
	defer l.Close()
	// A connection polls for a while after its last message (Spin), and
	// a provider's receive goroutines for a while after their last
	// arrival: a tenth of a second is many times either.
	idle, err := perftest.MeasureIdle(ctx, l, rcfg.Dial, cfg.idle, 100*time.Millisecond, cfg.idleTime)
	if err != nil {
		return nil, err
	}
	idle.Stack, idle.Device, idle.Transport = "rsock", d.Name, d.Transport
	return idle, nil
}

// writeSockIdle prints the idle measurements beside the goal.
func writeSockIdle(e *env, idle []*perftest.Idle) {
	tw := tabwriter.NewWriter(e.stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "idle connections, both ends in this process: CPU used while they stay open and unused\n")
	fmt.Fprintf(tw, " device\tconnections\tseconds\tall, %% of a core\tper connection\tgoal\t\n")
	for _, i := range idle {
		verdict := "met"
		if i.PerConn >= 0.01 {
			verdict = "NOT met"
		}
		fmt.Fprintf(tw, " %s\t%d\t%.1f\t%.2f%%\t%.4f%%\t< 1%% (%s)\t\n", i.Device, i.Conns, i.Seconds, 100*i.Cores, 100*i.PerConn, verdict)
	}
	tw.Flush()
}

// sockAddr is a fresh address for device d's scheme.
func sockAddr(d verbs.DeviceInfo) string {
	switch d.Transport {
	case "shm":
		return fmt.Sprintf("shm://@goverbs-sock-bench-%d", os.Getpid())
	case "iwarp":
		return "tcp://127.0.0.1:0"
	}
	return fmt.Sprintf("loop://goverbs-sock-bench-%d", os.Getpid())
}

// sockMeasure runs one benchmark on a listener and dialer that open
// returns: a connected pair for req_resp and stream, a gRPC server and
// client for grpc_unary.
func sockMeasure(ctx context.Context, cfg sockConfig, run sockRun, p perftest.Params,
	open func(context.Context) (net.Listener, func(context.Context, string) (net.Conn, error), error)) (*perftest.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	l, dial, err := open(ctx)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if run.name == "grpc_unary" {
		return sockGRPC(ctx, l, dial, p)
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := l.Accept()
		ch <- accepted{c, err}
	}()
	client, err := dial(ctx, l.Addr().String())
	if err != nil {
		l.Close()
		<-ch
		return nil, err
	}
	defer client.Close()
	a := <-ch
	if a.err != nil {
		return nil, a.err
	}
	defer a.c.Close()
	return perftest.RunConn(ctx, client, a.c, p)
}

// sockGRPC measures unary echo calls of p.Size bytes.
func sockGRPC(ctx context.Context, l net.Listener, dial func(context.Context, string) (net.Conn, error), p perftest.Params) (*perftest.Result, error) {
	s := grpcecho.NewServer()
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	defer func() {
		s.Stop()
		<-served
	}()
	cc, err := grpc.NewClient("passthrough:///"+l.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dial))
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	req, resp := &grpcecho.Frame{B: make([]byte, p.Size)}, &grpcecho.Frame{}
	r, err := perftest.PingPong(p.Iters, p.Warmup, func() error {
		if err := grpcecho.Call(ctx, cc, req, resp); err != nil {
			return err
		}
		if len(resp.B) != p.Size {
			return fmt.Errorf("echo of %d bytes came back with %d", p.Size, len(resp.B))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.Test, r.Size = p.Test, p.Size
	return r, nil
}

// sockGoal is a target ratio of rsock to Go TCP on a transport.
type sockGoal struct {
	transport, run string
	ratio          float64 // latency: at most; throughput: at least
}

var sockGoals = []sockGoal{
	{"shm", "req_resp", 0.25}, {"shm", "stream", 2}, {"shm", "grpc_unary", 0.7},
	{"iwarp", "req_resp", 1.2}, {"iwarp", "stream", 0.9},
}

// writeSockGoals prints each comparison as the ratio rsock/TCP (the
// median of the rounds, with their range) and its goal.
func writeSockGoals(e *env, rep *perftest.Report) error {
	tw := tabwriter.NewWriter(e.stdout, 0, 8, 2, ' ', 0)
	rounds := 1
	for _, c := range rep.Comparisons {
		rounds = max(rounds, c.Rounds)
	}
	fmt.Fprintf(tw, "rsock against Go TCP loopback, measured in this run (latency: median; throughput: average); ratio rsock/TCP")
	if rounds > 1 {
		fmt.Fprintf(tw, ", median (range) of %d rounds", rounds)
	}
	fmt.Fprintf(tw, "\n benchmark\t#bytes\trsock\t\tgo tcp\tratio\tgoal\t\n")
	for _, c := range rep.Comparisons {
		device, _, _ := strings.Cut(strings.TrimPrefix(c.Ours, "rsock "), " ")
		transport := ""
		for _, r := range rep.Results {
			if r.Device == device {
				transport = r.Transport
			}
		}
		if c.Speedup <= 0 {
			continue
		}
		// Speedup is how many times faster rsock is: TCP's latency over
		// rsock's, or rsock's throughput over TCP's.
		latency := c.Unit != "MiB/s"
		ratio, lo, hi := c.Speedup, c.SpeedupMin, c.SpeedupMax
		if latency {
			ratio, lo, hi = 1/c.Speedup, 1/c.SpeedupMax, 1/c.SpeedupMin
		}
		spread := ""
		if c.Rounds > 1 {
			spread = fmt.Sprintf(" (%.2f–%.2f)", lo, hi)
		}
		goal := "-\t"
		for _, g := range sockGoals {
			if g.transport == transport && g.run == c.PeerTest {
				met, op := ratio <= g.ratio, "≤"
				if !latency {
					met, op = ratio >= g.ratio, "≥"
				}
				verdict := "met"
				if !met {
					verdict = "NOT met"
				}
				goal = fmt.Sprintf("%s %.2f×\t%s", op, g.ratio, verdict)
			}
		}
		fmt.Fprintf(tw, " %s\t%d\trsock %s\t%s %s\t%s %s\t%.2f×%s\t%s\n", c.PeerTest, c.Size, device, fmtNum(c.OurValue), c.Unit, fmtNum(c.Value), c.Unit, ratio, spread, goal)
	}
	return tw.Flush()
}

func fmtNum(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// sockPlot draws one panel of bars per benchmark, a bar per source (the
// median of its rounds).
func sockPlot(file string, rep *perftest.Report) error {
	all := append(append([]*perftest.Result(nil), rep.Results...), rep.Peers...)
	var row []*plot.Plot
	for _, run := range sockRuns {
		var names []string
		byName := map[string][]float64{}
		unit := ""
		for _, r := range all {
			if r.PeerTest != run.name {
				continue
			}
			v, u, _ := r.Figure()
			if _, ok := byName[r.Name()]; !ok {
				names = append(names, r.Name())
			}
			byName[r.Name()] = append(byName[r.Name()], v)
			unit = u
		}
		if len(names) == 0 {
			continue
		}
		vals := make(plotter.Values, len(names))
		for i, n := range names {
			vs := byName[n]
			slices.Sort(vs)
			vals[i] = vs[len(vs)/2]
		}
		p := plot.New()
		p.Title.Text = run.name
		p.Y.Label.Text = unit
		bars, err := plotter.NewBarChart(vals, vg.Points(40))
		if err != nil {
			return err
		}
		p.Add(bars)
		p.NominalX(names...)
		row = append(row, p)
	}
	if len(row) == 0 {
		return errors.New("nothing to plot")
	}
	return perftest.WriteFigure(file, fmt.Sprintf("goverbs sock bench, %s (%s): lower latency and higher throughput are better", rep.Date, rep.Host),
		vg.Length(len(row))*5*vg.Inch, 5*vg.Inch, [][]*plot.Plot{row})
}
