package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/goverbs/goverbs/kv"
	"github.com/goverbs/goverbs/kv/kvbench"
)

// defaultKVAddr is where `goverbs kv` serves and dials by default: the
// default local provider, on an abstract Unix socket.
const defaultKVAddr = "shm://@goverbs-kv"

const kvDoc = `Kv runs the goverbs key-value store, whose GET is a one-sided RDMA Read
of the server's hash table and value heap, and whose PUT and DELETE are
send/recv RPCs (package kv).

  goverbs kv serve [-l ADDR] [--token-file F]   serve a table until interrupted
  goverbs kv put   [-a ADDR] KEY VALUE          store a value
  goverbs kv get   [-a ADDR] KEY                print a value
  goverbs kv del   [-a ADDR] KEY                delete a key
  goverbs kv bench [-a ADDR] [flags]            measure GET/PUT, beside memcached

Addresses: shm://@name or shm:///path.sock (same host), tcp://host:port
(iWARP), loop://name (in process).

A server started with --token-file F applies only the PUTs and DELETEs of
clients given the same file (put, del, bench: --token-file F); every
connected client can read every key and value, through read-only memory
windows of its own connection that the server revokes when it goes (the
regions' own keys on a device without memory windows). A client proves it holds the token
by a challenge and response when it connects (HMAC-SHA256 over both ends'
nonces): the token does not cross the network, and a recorded handshake
admits no one. A client given a file the server does not share is refused
when it connects. Keep the file readable by its owner only (chmod 600).`

func runKV(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(e.stdout, "Usage: goverbs kv serve|put|get|del|bench [flags] [args]\n\n%s\n", kvDoc)
		if len(args) == 0 {
			return usageError("kv needs a subcommand: serve, put, get, del or bench")
		}
		return flag.ErrHelp
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "serve":
		return runKVServe(ctx, e, rest)
	case "put", "get", "del":
		return runKVOp(ctx, e, sub, rest)
	case "bench":
		return runKVBench(ctx, e, rest)
	}
	return usageError("unknown kv subcommand %q: use serve, put, get, del or bench", sub)
}

// tokenFlagDoc is the help of --token-file.
const tokenFlagDoc = "shared token `file`: only clients given the same file may PUT and DELETE"

// readToken reads the token in path: the file's bytes, less the line
// ending an editor or echo leaves at its end.
func readToken(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	b = []byte(strings.TrimRight(string(b), "\r\n"))
	if len(b) == 0 {
		return nil, fmt.Errorf("token file %s is empty: put a secret in it, e.g. head -c 32 /dev/urandom | base64 > %s", path, path)
	}
	return b, nil
}

// dialKV connects to addr, with the credential of tokenFile if not "".
func dialKV(ctx context.Context, addr, tokenFile string) (*kv.Client, error) {
	var cfg kv.DialConfig
	if tokenFile != "" {
		token, err := readToken(tokenFile)
		if err != nil {
			return nil, err
		}
		cfg.Credential = kv.TokenCredential(token)
	}
	return cfg.Dial(ctx, addr)
}

func runKVServe(ctx context.Context, e *env, args []string) error {
	var addr, tokenFile string
	var cfg kv.Config
	fs := newFlagSet("kv serve", "", "Serve serves a key-value table at the address until interrupted.", e)
	fs.String(&addr, "listen", "l", defaultKVAddr, "address to serve at")
	fs.IntVar(&cfg.Buckets, "buckets", 1<<16, "index buckets (4 keys each)")
	fs.alias("buckets", "")
	fs.IntVar(&cfg.MaxValue, "max-value", 64<<10, "largest value in bytes")
	fs.alias("max-value", "")
	fs.IntVar(&cfg.HeapBytes, "heap", 64<<20, "value heap in bytes")
	fs.alias("heap", "")
	fs.String(&tokenFile, "token-file", "", "", tokenFlagDoc)
	fs.IntVar(&cfg.MaxClientsPerPeer, "max-clients-per-peer", 16, "clients one host (tcp://) or process (shm://) may hold at once, of the 64 a server takes")
	fs.alias("max-clients-per-peer", "")
	if err := fs.parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError("unexpected arguments %q", fs.Args())
	}
	if tokenFile != "" {
		token, err := readToken(tokenFile)
		if err != nil {
			return err
		}
		cfg.Authorizer = kv.TokenAuthorizer(token)
	}
	s, err := kv.Listen(addr, cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(e.stdout, "serving %s\n", s.Addr())
	if !s.Windows() {
		fmt.Fprintf(e.stderr, "kv: the device has no memory windows: clients read with the index's and heap's own keys, which stay good after a client goes, until the server stops\n")
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if os.Getenv(envKVChild) != "" {
		// Started by kv bench: serve until our input closes.
		go func() {
			bufio.NewReader(os.Stdin).ReadString('\n')
			stop()
		}()
	}
	<-ctx.Done()
	return nil
}

func runKVOp(ctx context.Context, e *env, op string, args []string) error {
	var addr, tokenFile string
	var timeout time.Duration
	synopsis, doc := "KEY", "Get prints the value of KEY, read with one-sided RDMA Reads of the server's table."
	switch op {
	case "put":
		synopsis, doc = "KEY VALUE", "Put stores VALUE under KEY (an RPC over send/recv)."
	case "del":
		doc = "Del deletes KEY (an RPC over send/recv)."
	}
	doc += "\nFlags may follow the arguments; put \"--\" before an argument that begins with \"-\"."
	fs := newFlagSet("kv "+op, synopsis, doc, e)
	fs.String(&addr, "addr", "a", defaultKVAddr, "server address: shm://@name, shm:///path.sock or tcp://host:port")
	fs.Duration(&timeout, "timeout", "t", 5*time.Second, "connection timeout")
	fs.String(&tokenFile, "token-file", "", "", tokenFlagDoc)
	if err := fs.parse(args); err != nil {
		return err
	}
	if want := strings.Fields(synopsis); fs.NArg() != len(want) {
		return usageError("kv %s takes %d argument(s), %s; got %d: %q", op, len(want), synopsis, fs.NArg(), fs.Args())
	}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := dialKV(dctx, addr, tokenFile)
	if err != nil {
		return fmt.Errorf("connect to %s: %w (is `goverbs kv serve -l %s` running?)", addr, err, addr)
	}
	defer c.Close()
	key := []byte(fs.Arg(0))
	switch op {
	case "put":
		return c.Put(key, []byte(fs.Arg(1)))
	case "del":
		return c.Delete(key)
	}
	v, err := c.Get(key)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s\n", v)
	return nil
}

// envKVChild marks a kv server started by kv bench.
const envKVChild = "GOVERBS_KV_BENCH_CHILD"

func runKVBench(ctx context.Context, e *env, args []string) error {
	var (
		addr, serve, values, plotFile string
		tokenFile                     string
		ops, keys                     int
		noMemcached                   bool
	)
	fs := newFlagSet("kv bench", "", `Bench measures the store on 16-byte keys, 95% GET and 5% PUT, with uniform
and Zipf 0.99 key choice, for each value size, with one client; and
memcached (started on loopback, if installed) on the same workload. It
reports GET median and p99 latency, PUT median latency, operations per second, and the
server's CPU seconds per million GETs. Without -a it starts its own server
process on the default local provider.`, e)
	fs.String(&addr, "addr", "a", "", "server to measure (default: start one, see --serve)")
	fs.String(&serve, "serve", "", "", "address of the server bench starts (default shm://@goverbs-kvbench-PID; tcp://127.0.0.1:PORT for iWARP)")
	fs.String(&values, "values", "", "64,512,4096", "value sizes in bytes")
	fs.IntVar(&ops, "ops", 200000, "operations measured per run")
	fs.alias("ops", "n")
	fs.IntVar(&keys, "keys", 10000, "key space (preloaded)")
	fs.alias("keys", "")
	fs.Bool(&noMemcached, "no-memcached", "", "do not run memcached beside")
	fs.String(&plotFile, "plot", "", "", "draw GET latency, throughput and server CPU against value size into this PNG `file`")
	fs.String(&tokenFile, "token-file", "", "", "shared token `file` of the server given with -a (see kv serve --token-file)")
	if err := fs.parse(args); err != nil {
		return err
	}
	if plotFile != "" && !strings.HasSuffix(strings.ToLower(plotFile), ".png") {
		return usageError("--plot %s: the plot is a PNG; name the file FILE.png", plotFile)
	}
	var sizes []int
	for _, f := range strings.Split(values, ",") {
		var n int
		if _, err := fmt.Sscanf(f, "%d", &n); err != nil || n <= 0 {
			return usageError("bad value size %q in --values", f)
		}
		sizes = append(sizes, n)
	}
	serverPID := 0
	if addr == "" {
		addr = serve
		if addr == "" {
			addr = fmt.Sprintf("shm://@goverbs-kvbench-%d", os.Getpid())
		}
		cmd, err := startKVServer(addr)
		if err != nil {
			return err
		}
		defer cmd.Wait()
		defer cmd.Process.Signal(os.Interrupt)
		serverPID = cmd.Process.Pid
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ours, err := dialKV(dctx, addr, tokenFile)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", addr, err)
	}
	defer ours.Close()

	var mc *kvbench.Memcached
	mcPID := 0
	skip := ""
	if noMemcached {
		skip = "--no-memcached"
	} else if mcAddr, cmd, err := kvbench.StartMemcached(); err != nil {
		skip = err.Error()
	} else {
		defer cmd.Wait()
		defer cmd.Process.Kill()
		if mc, err = kvbench.DialMemcached(mcAddr); err != nil {
			return err
		}
		defer mc.Close()
		mcPID = cmd.Process.Pid
	}

	tw := tabwriter.NewWriter(e.stdout, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "system\tvalue\tworkload\tGET p50 µs\tGET p99 µs\tPUT p50 µs\tkops/s\tserver CPU s/M GET\tp50 ratio\tthroughput ratio\t\n")
	type mix struct {
		gets, theta float64
	}
	var all []kvbench.Result
	for _, size := range sizes {
		// 95/5 uniform and Zipf, then GETs alone: the server's CPU per
		// GET, with no PUT to serve.
		for _, m := range []mix{{0.95, 0}, {0.95, 0.99}, {1, 0}} {
			w := kvbench.Workload{Keys: keys, ValueSize: size, GetRatio: m.gets, Zipf: m.theta, Ops: ops, Seed: uint64(size)}
			r, err := kvbench.Run("goverbs-kv", ours, w, serverPID)
			if err != nil {
				return err
			}
			row(tw, r)
			all = append(all, r)
			if mc != nil {
				m, err := kvbench.Run("memcached", mc, w, mcPID)
				if err != nil {
					return err
				}
				row(tw, m)
				all = append(all, m)
				fmt.Fprintf(tw, "goverbs/memcached\t%d\t%s\t\t\t\t\t\t%.3f\t%.2f\t\n", size, w.Name(),
					float64(r.GetP50)/float64(m.GetP50), r.OpsPerSec()/m.OpsPerSec())
			}
		}
	}
	tw.Flush()
	if skip != "" {
		fmt.Fprintf(e.stdout, "memcached skipped: %s\n", skip)
	}
	if plotFile != "" {
		host, _ := os.Hostname()
		title := fmt.Sprintf("goverbs kv bench, %s, %s (%s, %d CPUs): goverbs kv at %s beside memcached on loopback",
			time.Now().UTC().Format("2006-01-02"), host, runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), addr)
		if err := kvbench.Plot(plotFile, title, all); err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
	}
	return nil
}

func row(tw *tabwriter.Writer, r kvbench.Result) {
	cpu := "n/a"
	if c := r.CPUPerMillionGets(); c >= 0 {
		cpu = fmt.Sprintf("%.2f", c)
	}
	put := "-"
	if r.Puts > 0 {
		put = fmt.Sprintf("%.2f", float64(r.PutP50.Nanoseconds())/1e3)
	}
	fmt.Fprintf(tw, "%s\t%d\t%s\t%.2f\t%.2f\t%s\t%.1f\t%s\t\t\t\n", r.System, r.ValueSize, r.Workload,
		float64(r.GetP50.Nanoseconds())/1e3, float64(r.GetP99.Nanoseconds())/1e3, put, r.OpsPerSec()/1e3, cpu)
}

// startKVServer starts `goverbs kv serve` as a child process and waits
// until it serves.
func startKVServer(addr string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	// A heap large enough for every class to hold the whole key space:
	// memfd memory is only committed where it is written.
	cmd := exec.Command(exe, "kv", "serve", "-l", addr, "--heap", fmt.Sprint(4<<30))
	cmd.Env = append(os.Environ(), envKVChild+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if _, err := cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "serving ") {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, errors.Join(fmt.Errorf("the kv server did not start: %q", line), err)
	}
	return cmd, nil
}
