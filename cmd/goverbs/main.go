// Command goverbs is the goverbs tool: it lists RDMA devices, measures
// them and shows the verbs at work.
//
// Usage:
//
//	goverbs <command> [arguments and flags]
//
// The commands are:
//
//	devices   list RDMA devices and their attributes (like ibv_devices and ibv_devinfo)
//	bench     measure latency and bandwidth with perftest's tests, and compare with UCX, libfabric and TCP
//	demo      walk through one RDMA Read, step by step, with timings
//	ping      rping's ping-pong, either end of which may be librdmacm's rping
//	kv        key-value store with one-sided GET: serve, put, get, del, bench
//	log       replicated log: serve, promote, append, tail, bench
//	help      show help for a command
//
// Every command names a peer or a listening point by its cm address:
// tcp://host:port (iWARP, device tcp0), shm://@name or shm:///path.sock
// (shared memory on one host, device shm0). Flags may come before or after
// a command's arguments; "--" ends the flags. A connection nothing listens
// for fails at once.
//
// Run "goverbs help <command>" or "goverbs <command> -h" for a command's flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

// defaultDevice is the device the commands use when -d is not given: the
// default local provider, shm0 (two processes on one host, kernel bypass).
const defaultDevice = "shm0"

// command is one subcommand of goverbs. Adding a command (ping, bench, kv,
// log, ...) means writing a file with its run function and adding a row to
// commands.
type command struct {
	name    string // as typed on the command line
	summary string // one line for the command list
	// run parses args (everything after the command name) with its own
	// FlagSet and does the work. It returns errUsage (wrapped) for bad
	// flags or arguments, flag.ErrHelp when help was asked for, and any
	// other error for a failure.
	run func(ctx context.Context, env *env, args []string) error
}

// env is what a command may touch: its output streams.
type env struct {
	stdout io.Writer
	stderr io.Writer
	// stderrTTY says that stderr is a terminal, where progress may be shown.
	stderrTTY bool
}

// commands is the table of subcommands, in the order help lists them.
var commands []*command

func init() {
	commands = []*command{
		{name: "devices", summary: "list RDMA devices and their attributes (like ibv_devices and ibv_devinfo)", run: runDevices},
		{name: "bench", summary: "measure latency and bandwidth with perftest's tests; --compare with UCX, libfabric and TCP", run: runBench},
		{name: "scale", summary: "measure many connections: one QP's rate beside idle ones, round-robin, goroutines, and each connection's cost", run: runScale},
		{name: "demo", summary: "walk through one RDMA Read, step by step, with timings (seed document, section 4.4)", run: runDemo},
		{name: "ping", summary: "rping's ping-pong over iWARP (tcp0): client (-c) or server (-s), either end may be librdmacm's rping", run: runPing},
		{name: "kv", summary: "key-value store with one-sided GET: serve, put, get, del, bench", run: runKV},
		{name: "log", summary: "replicated log over RDMA Write + send/recv: serve, promote, append, tail, bench", run: runLog},
		{name: "sock", summary: "rsock (net.Conn over RDMA): bench req/resp, stream and gRPC against Go TCP", run: runSock},
		{name: "help", summary: "show help for a command", run: runHelp},
	}
}

// errUsage marks errors in how the command was invoked; they exit with
// status 2, as flag parsing errors do.
var errUsage = errors.New("usage error")

// usageError returns an error that says what was wrong with the invocation.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

func lookup(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func printUsage(w io.Writer) {
	fmt.Fprintf(w, "goverbs is RDMA verbs for Go: it lists devices, measures them and shows the verbs at work.\n\n")
	fmt.Fprintf(w, "Usage:\n\n\tgoverbs <command> [arguments and flags]\n\nThe commands are:\n\n")
	for _, c := range commands {
		fmt.Fprintf(w, "\t%-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nAddresses are cm addresses: tcp://host:port (iWARP), shm://@name or shm:///path.sock\n(shared memory, one host). Flags may follow a command's arguments; \"--\" ends them.\n")
	fmt.Fprintf(w, "\nRun \"goverbs help <command>\" or \"goverbs <command> -h\" for a command's flags.\n")
}

// run runs goverbs with args (without the program name) and returns the
// exit status: 0 on success, 1 on failure, 2 on a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr, stderrTTY: isTerminal(stderr)}
	if len(args) == 0 {
		printUsage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		printUsage(stdout)
		return 0
	}
	c := lookup(name)
	if c == nil {
		fmt.Fprintf(stderr, "goverbs: unknown command %q; run \"goverbs help\" to list the commands\n", name)
		return 2
	}
	err := c.run(ctx, e, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		msg := strings.TrimPrefix(err.Error(), errUsage.Error()+": ")
		fmt.Fprintf(stderr, "goverbs %s: %s\nrun \"goverbs %s -h\" for usage\n", c.name, msg, c.name)
		return 2
	default:
		fmt.Fprintf(stderr, "goverbs %s: %s\n", c.name, oneLine(err.Error()))
		return 1
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// oneLine keeps an error message on one line, so that a failure is
// reported as exactly one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func runHelp(_ context.Context, e *env, args []string) error {
	fs := newFlagSet("help", "[command]", "Help shows the flags of a command, or lists the commands.", e)
	if err := fs.parse(args); err != nil {
		return err
	}
	switch fs.NArg() {
	case 0:
		printUsage(e.stdout)
		return nil
	case 1:
		c := lookup(fs.Arg(0))
		if c == nil {
			return usageError("unknown command %q", fs.Arg(0))
		}
		if c.name == "help" {
			fs.printUsage(e.stdout)
			return nil
		}
		// Every command prints its usage for -h and returns flag.ErrHelp.
		ce := &env{stdout: e.stdout, stderr: e.stdout}
		return c.run(context.Background(), ce, []string{"-h"})
	default:
		return usageError("help takes at most one command, got %d arguments", fs.NArg())
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
