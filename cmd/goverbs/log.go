package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/rlog"
)

const logDoc = `Log runs the goverbs replicated log (package rlog): a primary and replicas,
records pushed by RDMA Write into double-buffered regions on the replicas
with sequence numbers and CRC-32C, control (buffer flips, acknowledgements,
epochs) over send/recv, and an append acknowledged once a majority holds
it durably.

  goverbs log serve   --data DIR --listen ADDR --members A,B,C --secret-file F [--primary]
                      run a member; with --primary, promote it and serve as primary
  goverbs log promote --data DIR --listen ADDR --members A,B,C --secret-file F
                      promote a stopped member (fence a majority, catch up) and exit
  goverbs log append  --addr A,B,C [RECORD...]
                      append records (the arguments, or the lines of stdin)
  goverbs log tail    --data DIR [-n N]
                      print the last records of a member's log
  goverbs log bench   [--sizes 64,4096,65536]
                      throughput of send/recv only against RDMA Write + send/recv

Addresses: shm://@name or shm:///path.sock (same host), tcp://host:port
(iWARP), loop://name (in process).

Members prove to each other that they belong with a shared secret: give
every member the same file (at least 16 bytes; for example
head -c 32 /dev/urandom > secret), readable by its owner only. A peer
without it cannot replicate to a member, fence it or fetch from it.
Clients need no secret: they append through the primary.`

func runLog(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(e.stdout, "Usage: goverbs log serve|promote|append|tail|bench [flags] [args]\n\n%s\n", logDoc)
		if len(args) == 0 {
			return usageError("log needs a subcommand: serve, promote, append, tail or bench")
		}
		return flag.ErrHelp
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "serve":
		return runLogServe(ctx, e, rest, false)
	case "promote":
		return runLogServe(ctx, e, rest, true)
	case "append":
		return runLogAppend(ctx, e, rest)
	case "tail":
		return runLogTail(e, rest)
	case "bench":
		return runLogBench(ctx, e, rest)
	}
	return usageError("unknown log subcommand %q: use serve, promote, append, tail or bench", sub)
}

// logSizeFlag is a byte count that takes K, M and G (binary) suffixes.
type logSizeFlag struct{ p *int }

// String returns the size in bytes.
func (s logSizeFlag) String() string {
	if s.p == nil {
		return "0"
	}
	return strconv.Itoa(*s.p)
}

// Set parses a size such as 4096, 64K or 1M.
func (s logSizeFlag) Set(v string) error {
	n, err := parseLogSize(v)
	if err != nil {
		return err
	}
	*s.p = n
	return nil
}

func parseLogSize(v string) (int, error) {
	mult := 1
	t := strings.TrimSuffix(strings.TrimSuffix(v, "B"), "i")
	switch {
	case strings.HasSuffix(t, "K"), strings.HasSuffix(t, "k"):
		mult, t = 1<<10, t[:len(t)-1]
	case strings.HasSuffix(t, "M"):
		mult, t = 1<<20, t[:len(t)-1]
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<30, t[:len(t)-1]
	}
	n, err := strconv.Atoi(t)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size (write 4096, 64K or 1M)", v)
	}
	return n * mult, nil
}

// memberFlags defines the flags that configure a member.
// It returns where the segment size lands.
func memberFlags(fs *flagSet, cfg *rlog.Config, members, mode, secretFile *string, verbose *bool) *int {
	fs.String(&cfg.Dir, "data", "D", "", "the member's data directory (segment files and state)")
	fs.String(&cfg.Listen, "listen", "l", "", "the member's address, one of --members")
	fs.String(members, "members", "m", "", "every member's address, comma-separated, this one included")
	fs.String(secretFile, "secret-file", "", "", "file holding the cluster's secret, the same on every member (at least 16 bytes; readable by its owner only)")
	fs.String(mode, "mode", "", "write", "how the primary moves records to replicas: write (RDMA Write, control by send/recv) or send (send/recv only)")
	fs.IntVar(&cfg.Quorum, "quorum", 0, "members that must hold a record durably before it is acknowledged (default: a majority)")
	fs.alias("quorum", "")
	fs.IntVar(&cfg.Buffers, "buffers", 2, "buffers per replica (2: double buffering)")
	fs.alias("buffers", "")
	cfg.BufferSize, cfg.MaxRecord = 1<<20, 256<<10
	fs.Var(logSizeFlag{&cfg.BufferSize}, "buffer-size", "size of each replica buffer; a batch of records fills at most one")
	fs.alias("buffer-size", "")
	fs.Var(logSizeFlag{&cfg.MaxRecord}, "max-record", "largest record")
	fs.alias("max-record", "")
	fs.IntVar(&cfg.MaxBatch, "max-batch", 0, "most records per batch (0: as many as fit in a buffer)")
	fs.alias("max-batch", "")
	seg := 64 << 20
	fs.Var(logSizeFlag{&seg}, "segment-size", "size at which a segment file is closed and a new one started")
	fs.alias("segment-size", "")
	fs.IntVar(&cfg.RetainSegments, "retain", 0, "segment files kept (0: all); a replica further behind must be re-seeded")
	fs.alias("retain", "")
	fs.Bool(&cfg.NoSync, "no-sync", "", "do not fsync (for measurements: acknowledged then means written, not durable)")
	fs.Bool(verbose, "verbose", "v", "report connections, promotions and errors on stderr")
	return &seg
}

// finishMember completes a Config from the parsed flags.
func finishMember(fs *flagSet, e *env, cfg *rlog.Config, seg *int, members, mode, secretFile string, verbose bool) error {
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	if cfg.Dir == "" || cfg.Listen == "" || members == "" || secretFile == "" {
		return usageError("--data, --listen, --members and --secret-file are required")
	}
	secret, err := readSecret(secretFile)
	if err != nil {
		return err
	}
	cfg.Secret = secret
	for _, a := range strings.Split(members, ",") {
		if a = strings.TrimSpace(a); a != "" {
			cfg.Members = append(cfg.Members, a)
		}
	}
	if cfg.Mode, err = rlog.ParseMode(mode); err != nil {
		return usageError("%v", err)
	}
	cfg.SegmentBytes = int64(*seg)
	if verbose {
		var mu sync.Mutex
		cfg.Logf = func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(e.stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
		}
	}
	return nil
}

// readSecret reads a cluster secret from path: the file's bytes, without
// a trailing newline. A file that others than its owner may read or
// write is refused, as is one shorter than rlog.MinSecret.
func readSecret(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--secret-file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("--secret-file %s is accessible to others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--secret-file: %w", err)
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) < rlog.MinSecret {
		return nil, fmt.Errorf("--secret-file %s holds %d bytes: a secret has at least %d (head -c 32 /dev/urandom > %s)", path, len(b), rlog.MinSecret, path)
	}
	return b, nil
}

// writeSecret writes a fresh random secret to path, readable by its
// owner only.
func writeSecret(path string) error {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	return os.WriteFile(path, secret, 0o600)
}

func runLogServe(ctx context.Context, e *env, args []string, promoteOnly bool) error {
	name, synopsis, doc := "log serve", "", `Serve runs a member of a log until interrupted: a replica, or with
--primary the primary. Starting as primary is a promotion: the member takes
a new epoch, has a majority of the members promise it (which fences the
old primary), and fetches records from any of them whose log is ahead
before it serves. Nothing is acknowledged that a majority does not hold.`
	if promoteOnly {
		name, doc = "log promote", `Promote promotes a stopped member and exits: it takes a new epoch, has a
majority of the members promise it (fencing the old primary), fetches the
records of any of them whose log is ahead, and reports the log it holds.
Then run "goverbs log serve --primary" on the same data directory (which
promotes again, quickly, and serves).`
	}
	var cfg rlog.Config
	var members, mode, secretFile string
	var verbose bool
	fs := newFlagSet(name, synopsis, doc, e)
	seg := memberFlags(fs, &cfg, &members, &mode, &secretFile, &verbose)
	if !promoteOnly {
		fs.Bool(&cfg.Primary, "primary", "p", "serve as the primary (promote this member first)")
	}
	if err := fs.parse(args); err != nil {
		return err
	}
	if err := finishMember(fs, e, &cfg, seg, members, mode, secretFile, verbose); err != nil {
		return err
	}
	if promoteOnly {
		cfg.Primary = true
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	m, err := rlog.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	st := m.Status()
	role := "replica"
	if st.Primary {
		role = "primary"
	}
	if promoteOnly {
		fmt.Fprintf(e.stdout, "promoted %s to epoch %d: its log holds records %d to %d, every acknowledged record among them\n", cfg.Listen, st.Epoch, st.First, st.Last)
		return nil
	}
	fmt.Fprintf(e.stdout, "serving %s as %s (epoch %d, log ends at record %d)\n", cfg.Listen, role, st.Epoch, st.Last)
	<-ctx.Done()
	return nil
}

func runLogAppend(ctx context.Context, e *env, args []string) error {
	var addrs string
	var timeout time.Duration
	fs := newFlagSet("log append", "[RECORD...]", "Append appends each argument as a record, or each line of stdin if there are none, and prints its sequence number once a majority holds it.\nFlags may follow the records; put \"--\" before records that begin with \"-\".", e)
	fs.String(&addrs, "addr", "a", "", "the members' addresses, comma-separated (the primary is found among them)")
	fs.Duration(&timeout, "timeout", "t", 10*time.Second, "time allowed for each append")
	if err := fs.parse(args); err != nil {
		return err
	}
	if addrs == "" {
		return usageError("--addr is required")
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	c, err := rlog.Dial(dctx, strings.Split(addrs, ",")...)
	cancel()
	if errors.Is(err, cm.ErrRefused) {
		return fmt.Errorf("%w (are the members running? start each with `goverbs log serve`)", err)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	one := func(rec []byte) error {
		actx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		seq, err := c.Append(actx, rec)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "%d\n", seq)
		return nil
	}
	if fs.NArg() > 0 {
		for _, a := range fs.Args() {
			if err := one([]byte(a)); err != nil {
				return err
			}
		}
		return nil
	}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), rlog.MaxRecordLimit)
	for sc.Scan() {
		if err := one(sc.Bytes()); err != nil {
			return err
		}
	}
	return sc.Err()
}

func runLogTail(e *env, args []string) error {
	var dir string
	var n int
	fs := newFlagSet("log tail", "", "Tail prints the last records of a member's log, read from its data directory (the member may be running): sequence number, epoch, length and the data (quoted text, or hex).", e)
	fs.String(&dir, "data", "D", "", "the member's data directory")
	fs.IntVar(&n, "n", 10, "how many records")
	fs.alias("n", "")
	if err := fs.parse(args); err != nil {
		return err
	}
	if dir == "" || fs.NArg() > 0 {
		return usageError("--data is required, and nothing else")
	}
	if n < 0 {
		return usageError("-n takes how many records: 0 or more")
	}
	ring := make([]rlog.Record, 0, n)
	res, err := rlog.ScanDir(dir, 1, func(r rlog.Record) error {
		if n == 0 {
			return nil
		}
		r.Data = append([]byte(nil), r.Data...)
		if len(ring) == n {
			ring = append(ring[1:], r)
		} else {
			ring = append(ring, r)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range ring {
		fmt.Fprintf(e.stdout, "%d\tepoch %d\t%d bytes\t%s\n", r.Seq, r.Epoch, len(r.Data), show(r.Data))
	}
	fmt.Fprintf(e.stdout, "records %d to %d in %d segment files", res.First, res.Last, res.Segments)
	if res.Torn > 0 {
		fmt.Fprintf(e.stdout, "; %d bytes after the last good record (a torn tail, or a record being written)", res.Torn)
	}
	fmt.Fprintln(e.stdout)
	return nil
}

// show renders record data: quoted if it is short text, else hex.
func show(b []byte) string {
	const max = 64
	cut := ""
	if len(b) > max {
		b, cut = b[:max], "..."
	}
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool { return r < ' ' && r != '\t' }) {
		return strconv.Quote(string(b)) + cut
	}
	return fmt.Sprintf("%x%s", b, cut)
}

// envLogChild marks a member started by log bench.
const envLogChild = "GOVERBS_LOG_BENCH_CHILD"

func runLogBench(ctx context.Context, e *env, args []string) error {
	var sizes, modes, transport, dir string
	var duration time.Duration
	var window, repeat int
	var noSync, verbose bool
	fs := newFlagSet("log bench", "", `Bench measures the log's append throughput with the records carried in
the Sends themselves (send/recv only: "send"; "send1" sends one record per
message) against RDMA Write of batches with control over send/recv
("write"), for each record size. Each run starts a fresh log of three
members (this program, as child processes) and appends from one client
with --window appends in flight, for --duration. It reports records/s,
MB/s, and the ratio of each mode to the first ("send" by default). The
machine's load sways single runs: use --repeat to interleave rounds and
take medians.`, e)
	fs.String(&sizes, "sizes", "", "64,4096,65536", "record sizes in bytes")
	fs.String(&modes, "modes", "", "send,send1,write", "modes to compare: send, send1, write")
	fs.String(&transport, "transport", "", "shm", "shm, or tcp (iWARP, if the provider is built in)")
	fs.Duration(&duration, "duration", "", 3*time.Second, "measured time per run")
	fs.IntVar(&window, "window", 256, "appends in flight")
	fs.alias("window", "")
	fs.IntVar(&repeat, "repeat", 1, "rounds (each runs every mode); the table gives medians")
	fs.alias("repeat", "")
	fs.String(&dir, "dir", "", "", "where the members' data directories go (default: a temporary directory)")
	fs.Bool(&noSync, "no-sync", "", "members do not fsync (measures the transfer, not the disk)")
	fs.Bool(&verbose, "verbose", "v", "members report connections and errors on stderr")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	if repeat < 1 {
		return usageError("--repeat must be at least 1")
	}
	var sz []int
	for _, f := range strings.Split(sizes, ",") {
		n, err := parseLogSize(strings.TrimSpace(f))
		if err != nil || n < 1 || n > rlog.MaxRecordLimit {
			return usageError("bad record size %q in --sizes", f)
		}
		sz = append(sz, n)
	}
	ms := strings.Split(modes, ",")
	for _, m := range ms {
		if m != "send" && m != "send1" && m != "write" {
			return usageError("bad mode %q in --modes: use send, send1 or write", m)
		}
	}
	if _, err := cm.Device(transport + "://x"); err != nil {
		return fmt.Errorf("transport %s: %w", transport, err)
	}
	base := dir
	if base == "" {
		var err error
		if base, err = os.MkdirTemp("", "goverbs-logbench-"); err != nil {
			return err
		}
		defer os.RemoveAll(base)
	}
	// Each round runs every mode once, size by size; with --repeat the
	// rounds interleave the modes, so that a machine whose load drifts
	// weighs on all of them, and the table gives medians.
	rates := map[string][]float64{}
	ratios := map[string][]float64{}
	run := 0
	for round := range repeat {
		for _, size := range sz {
			var ref float64
			for _, mode := range ms {
				run++
				r, err := runLogBenchOnce(ctx, e, logBenchRun{size: size, mode: mode, transport: transport, dir: filepath.Join(base, fmt.Sprint(run)),
					duration: duration, window: window, noSync: noSync, verbose: verbose, id: run})
				if err != nil {
					return fmt.Errorf("%d-byte records, %s: %w", size, mode, err)
				}
				key := fmt.Sprint(size, mode)
				rates[key] = append(rates[key], r)
				if mode == ms[0] {
					ref = r
				}
				ratios[key] = append(ratios[key], r/ref)
				if repeat > 1 {
					fmt.Fprintf(e.stderr, "round %d: %d-byte records, %s: %.0f records/s\n", round+1, size, mode, r)
				}
			}
		}
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "record bytes\tmode\trecords/s\tMB/s\tratio to %s\t\n", ms[0])
	for _, size := range sz {
		for _, mode := range ms {
			key := fmt.Sprint(size, mode)
			r := median(rates[key])
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.1f\t%.2f\t\n", size, mode, r, r*float64(size)/1e6, median(ratios[key]))
		}
	}
	tw.Flush()
	fsync := "each member fsyncs (in groups) before acknowledging"
	if noSync {
		fsync = "no fsync (--no-sync)"
	}
	fmt.Fprintf(e.stdout, "3 members on %s, %s; %d appends in flight; %v per run", transport, fsync, window, duration)
	if repeat > 1 {
		fmt.Fprintf(e.stdout, "; medians of %d interleaved rounds (ratios within each round)", repeat)
	}
	fmt.Fprintln(e.stdout)
	return nil
}

// median returns the median of v.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

type logBenchRun struct {
	size      int
	mode      string
	transport string
	dir       string
	duration  time.Duration
	window    int
	noSync    bool
	verbose   bool
	id        int
}

// runLogBenchOnce starts a three-member log and returns the records per second
// one client appends to it.
func runLogBenchOnce(ctx context.Context, e *env, b logBenchRun) (float64, error) {
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	var addrs []string
	for i := range 3 {
		switch b.transport {
		case "tcp":
			addrs = append(addrs, fmt.Sprintf("tcp://127.0.0.1:%d", 17400+10*(b.id%100)+i))
		default:
			addrs = append(addrs, fmt.Sprintf("shm://@goverbs-logbench-%d-%d-%d", os.Getpid(), b.id, i))
		}
	}
	mode, batch := b.mode, "0"
	if mode == "send1" {
		mode, batch = "send", "1"
	}
	maxRecord := max(b.size, 4096)
	bufSize := max(1<<20, 2*(maxRecord+64))
	secretFile := filepath.Join(b.dir, "secret")
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return 0, err
	}
	if err := writeSecret(secretFile); err != nil {
		return 0, err
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			p.Process.Signal(syscall.SIGTERM)
			p.Wait()
		}
	}()
	for _, i := range []int{1, 2, 0} {
		a := []string{"log", "serve", "--data", filepath.Join(b.dir, fmt.Sprint(i)), "--listen", addrs[i],
			"--members", strings.Join(addrs, ","), "--secret-file", secretFile, "--mode", mode, "--max-batch", batch,
			"--max-record", fmt.Sprint(maxRecord), "--buffer-size", fmt.Sprint(bufSize)}
		if b.noSync {
			a = append(a, "--no-sync")
		}
		if b.verbose {
			a = append(a, "-v")
		}
		if i == 0 {
			a = append(a, "--primary")
		}
		cmd := exec.Command(exe, a...)
		cmd.Env = append(os.Environ(), envLogChild+"=1")
		cmd.Stderr = e.stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		procs = append(procs, cmd)
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "serving ") {
			return 0, errors.Join(fmt.Errorf("member %s did not start: %q", addrs[i], line), err)
		}
		go io.Copy(io.Discard, out)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := rlog.Dial(dctx, addrs...)
	cancel()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	rec := make([]byte, b.size)
	for i := range rec {
		rec[i] = byte(i)
	}
	var (
		counting atomic.Bool
		count    atomic.Int64
		failed   atomic.Pointer[error]
		wg       sync.WaitGroup
	)
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	for range b.window {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for bctx.Err() == nil {
				actx, cancel := context.WithTimeout(bctx, 30*time.Second)
				_, err := c.Append(actx, rec)
				cancel()
				if err != nil {
					if bctx.Err() == nil {
						failed.CompareAndSwap(nil, &err)
						stop()
					}
					return
				}
				if counting.Load() {
					count.Add(1)
				}
			}
		}()
	}
	warm := time.NewTimer(b.duration / 4)
	select {
	case <-warm.C:
	case <-bctx.Done():
	}
	counting.Store(true)
	start := time.Now()
	measure := time.NewTimer(b.duration)
	select {
	case <-measure.C:
	case <-bctx.Done():
	}
	n, elapsed := count.Load(), time.Since(start)
	stop()
	wg.Wait()
	if p := failed.Load(); p != nil {
		return 0, *p
	}
	return float64(n) / elapsed.Seconds(), nil
}
