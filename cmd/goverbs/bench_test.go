package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/perftest"
)

// The bench tests run goverbs bench as a user would, with few iterations
// and sizes so that they stay fast; they check the structure of what it
// prints and never its timings.

// benchRow is one row of a bench table: the source ("goverbs shm0"), the
// test, and the columns.
type benchRow struct {
	source, test string
	cols         []string
}

var (
	tableHead = regexp.MustCompile(`^(goverbs \S+): (\w+) \(`)
	colSep    = regexp.MustCompile(`\s{2,}`)
)

// parseBenchTables reads goverbs' tables from bench's text output.
func parseBenchTables(t *testing.T, out string) []benchRow {
	t.Helper()
	var rows []benchRow
	var source, test string
	for _, l := range strings.Split(out, "\n") {
		if m := tableHead.FindStringSubmatch(l); m != nil {
			source, test = m[1], m[2]
			continue
		}
		if source == "" || !strings.HasPrefix(l, " ") || strings.HasPrefix(l, " #bytes") {
			if strings.TrimSpace(l) == "" || !strings.HasPrefix(l, " ") {
				source = ""
			}
			continue
		}
		rows = append(rows, benchRow{source: source, test: test, cols: colSep.Split(strings.TrimSpace(l), -1)})
	}
	return rows
}

func num(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Errorf("%q is not a number", s)
	}
	return v
}

// checkRow checks a row of a latency or bandwidth table: bytes,
// iterations, then the figures in order, then the two CPU columns.
func checkRow(t *testing.T, r benchRow, size, iters int) {
	t.Helper()
	test, err := perftest.ParseTest(r.test)
	if err != nil {
		t.Fatal(err)
	}
	want := 9
	if !test.Latency() {
		want = 8
	}
	if len(r.cols) != want {
		t.Fatalf("%s %s: %d columns %q, want %d", r.source, r.test, len(r.cols), r.cols, want)
	}
	if test.Atomic() {
		size = perftest.AtomicSize
	}
	if r.cols[0] != strconv.Itoa(size) || r.cols[1] != strconv.Itoa(iters) {
		t.Errorf("%s %s: row %q, want %d bytes, %d iterations", r.source, r.test, r.cols, size, iters)
	}
	if test.Latency() {
		min, typ, max := num(t, r.cols[2]), num(t, r.cols[3]), num(t, r.cols[6])
		num(t, r.cols[4])
		num(t, r.cols[5])
		if !(min > 0 && min <= typ && typ <= max) {
			t.Errorf("%s %s: t_min %v, t_typical %v, t_max %v are out of order", r.source, r.test, min, typ, max)
		}
	} else {
		num(t, r.cols[2]) // window
		peak, avg := num(t, r.cols[3]), num(t, r.cols[4])
		if !(avg > 0 && peak >= avg) || num(t, r.cols[5]) <= 0 {
			t.Errorf("%s %s: peak %v, average %v, rate %s", r.source, r.test, peak, avg, r.cols[5])
		}
	}
	cpu := r.cols[len(r.cols)-2:]
	num(t, cpu[0])
	if r.source == "goverbs loop0" {
		if cpu[1] != "(in client)" {
			t.Errorf("loop0's server runs in the client, not %q", cpu[1])
		}
	} else {
		num(t, cpu[1])
	}
}

// TestBenchSelfContained is the README's first command, made small: every
// test on every local device, each against a server of its own.
func TestBenchSelfContained(t *testing.T) {
	out, errOut, code := goverbs(t, "bench", "-n", "20", "-s", "64")
	if code != 0 || errOut != "" {
		t.Fatalf("goverbs bench: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	rows := parseBenchTables(t, out)
	seen := map[string]bool{}
	for _, r := range rows {
		checkRow(t, r, 64, 20)
		seen[r.source+" "+r.test] = true
	}
	for _, dev := range []string{"loop0", "shm0"} {
		for _, tt := range perftest.Tests {
			if !seen["goverbs "+dev+" "+tt.String()] {
				t.Errorf("no %s row for %s:\n%s", tt, dev, out)
			}
		}
	}
	if !regexp.MustCompile(`(?m)^\d+ runs in \d+\.\ds$`).MatchString(out) {
		t.Errorf("no closing line with the number of runs:\n%s", out)
	}
}

// TestBenchInProcess runs bench in the test's process on loop0, so that
// the race detector watches client and server.
func TestBenchInProcess(t *testing.T) {
	var o, e bytes.Buffer
	if code := run(context.Background(), []string{"bench", "-d", "loop0", "-n", "20", "-s", "8"}, &o, &e); code != 0 {
		t.Fatalf("bench: exit %d, stderr %q, stdout:\n%s", code, e.String(), o.String())
	}
	if n := len(parseBenchTables(t, o.String())); n != len(perftest.Tests) {
		t.Errorf("%d rows, want %d:\n%s", n, len(perftest.Tests), o.String())
	}
}

func TestBenchJSON(t *testing.T) {
	out, errOut, code := goverbs(t, "bench", "--json", "-d", "shm0", "-n", "20", "-s", "8", "write_lat", "read_bw", "atomic_lat")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var rep perftest.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("the output is not JSON: %v\n%s", err, out)
	}
	if _, err := time.Parse(time.RFC3339, rep.Date); err != nil {
		t.Errorf("date %q: %v", rep.Date, err)
	}
	if len(rep.Results) != 3 {
		t.Fatalf("%d results, want 3:\n%s", len(rep.Results), out)
	}
	for i, want := range []perftest.Test{perftest.WriteLat, perftest.ReadBW, perftest.AtomicLat} {
		r := rep.Results[i]
		if r.Test != want || r.Device != "shm0" || r.Transport != "shm" || r.Size != 8 || r.Iters != 20 {
			t.Errorf("result %d: %+v, want %v on shm0", i, r, want)
		}
		if (r.Lat != nil) != want.Latency() || (r.BW != nil) == want.Latency() {
			t.Errorf("%v: latency %v, bandwidth %v", want, r.Lat, r.BW)
		}
		// The server is another process, and says what it used.
		if r.CPU == nil || r.CPU.SameProcess || r.CPU.ServerUnknown {
			t.Errorf("%v: CPU %+v, want both processes' time", want, r.CPU)
		}
	}
}

func TestBenchCSV(t *testing.T) {
	out, errOut, code := goverbs(t, "bench", "--csv", "-d", "loop0", "-n", "20", "-s", "4K", "send_lat", "send_bw")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatalf("the output is not CSV: %v\n%s", err, out)
	}
	if len(rows) != 3 || rows[0][0] != "stack" || rows[1][3] != "send_lat" || rows[2][3] != "send_bw" || rows[1][5] != "4096" {
		t.Errorf("CSV:\n%s", out)
	}
}

func TestBenchPlot(t *testing.T) {
	file := filepath.Join(t.TempDir(), "bench.png")
	out, errOut, code := goverbs(t, "bench", "-d", "loop0", "-n", "20", "-s", "8", "--plot", file, "read_lat", "write_bw")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	b, err := os.ReadFile(file)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("no PNG at %s (%v)", file, err)
	}
	if !strings.Contains(out, "plot: "+file) {
		t.Errorf("the output does not name the plot:\n%s", out)
	}
}

// TestBenchMarkdown: --markdown writes the report as Markdown, naming the
// command that made it, with a table per test and the plot linked
// relative to the document; a file not named .md is refused.
func TestBenchMarkdown(t *testing.T) {
	dir := t.TempDir()
	md, plot := filepath.Join(dir, "perf.md"), filepath.Join(dir, "img", "bench.png")
	if err := os.Mkdir(filepath.Dir(plot), 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"bench", "-d", "loop0", "-n", "20", "-s", "64", "--markdown", md, "--plot", plot, "send_lat", "read_bw"}
	var o, e bytes.Buffer
	if code := run(context.Background(), args, &o, &e); code != 0 {
		t.Fatalf("bench: exit %d, stderr %q, stdout:\n%s", code, e.String(), o.String())
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{
		"`goverbs " + strings.Join(args, " ") + "`",
		"## How goverbs bench measures",
		"### goverbs loop0: send_lat", "### goverbs loop0: read_bw",
		"](img/bench.png)",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("the document lacks %q:\n%s", want, doc)
		}
	}
	if n := regexp.MustCompile(`(?m)^\| 64 \| 20 \| `).FindAllStringIndex(doc, -1); len(n) != 2 {
		t.Errorf("%d rows of 64 bytes and 20 iterations, want 2:\n%s", len(n), doc)
	}

	_, errOut, code := goverbs(t, "bench", "-d", "loop0", "--markdown", filepath.Join(dir, "perf.txt"))
	if code != 2 || !strings.Contains(errOut, "FILE.md") {
		t.Errorf("--markdown perf.txt: exit %d, %q; want a usage error that asks for FILE.md", code, errOut)
	}
}

// TestBenchCompare: every peer is either measured and compared, or named
// as skipped with a reason.
func TestBenchCompare(t *testing.T) {
	out, errOut, code := goverbs(t, "bench", "--compare", "--json", "-d", "shm0", "-n", "50", "-s", "64", "send_lat", "write_bw")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var rep perftest.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("the output is not JSON: %v\n%s", err, out)
	}
	compared, skipped := map[string]bool{}, map[string]bool{}
	for _, c := range rep.Comparisons {
		if c.Ours != "goverbs shm0" || c.Speedup <= 0 || c.Value <= 0 {
			t.Errorf("comparison %+v", c)
		}
		compared[c.Peer] = true
	}
	for _, s := range rep.Skipped {
		if s.Reason == "" {
			t.Errorf("skipped %s without a reason", s.Peer)
		}
		skipped[s.Peer] = true
	}
	for _, p := range []string{"ucx sm", "ucx tcp", "libfabric shm", "libfabric tcp", "go tcp", "go tcp-2proc"} {
		if !compared[p] && !skipped[p] {
			t.Errorf("peer %s is neither compared nor skipped:\n%s", p, out)
		}
	}
	if !compared["go tcp"] || !compared["go tcp-2proc"] {
		t.Errorf("plain Go TCP, in one process and across two, is always there to compare with:\n%s", out)
	}
	for _, r := range rep.Peers {
		if r.Stack == "goverbs" || r.PeerTest == "" || r.Size != 64 {
			t.Errorf("peer result %+v", r)
		}
	}
}

// startServerCmd starts "goverbs bench -l addr tests..." and returns it
// once it says it is serving.
func startServerCmd(t *testing.T, addr string, tests ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(goverbsBin, append([]string{"bench", "-l", addr}, tests...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	line, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "goverbs bench: serving") || !strings.Contains(line, addr) {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the server said %q (%v), stderr %q", line, err, errOut.String())
	}
	var rest bytes.Buffer
	done := make(chan struct{})
	go func() {
		rest.ReadFrom(r)
		close(done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		cmd.Wait()
	})
	return cmd, &rest
}

// stopBenchServer interrupts the server as Ctrl-C would and checks that
// it exits cleanly.
func stopBenchServer(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Errorf("the server exited with %v on an interrupt, want status 0", err)
	}
}

func TestBenchClientServer(t *testing.T) {
	addr := fmt.Sprintf("shm://@goverbs-test-bench-%d", os.Getpid())
	srv, _ := startServerCmd(t, addr)
	out, errOut, code := goverbs(t, "bench", addr, "-n", "20", "-s", "4K", "send_lat", "write_bw")
	if code != 0 || errOut != "" {
		t.Fatalf("client: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	rows := parseBenchTables(t, out)
	if len(rows) != 2 || rows[0].test != "send_lat" || rows[1].test != "write_bw" {
		t.Fatalf("rows %v:\n%s", rows, out)
	}
	for _, r := range rows {
		if r.source != "goverbs shm0" {
			t.Errorf("the client ran on %s, want shm0 (the device of shm:// addresses)", r.source)
		}
		checkRow(t, r, 4096, 20)
	}
	stopBenchServer(t, srv)
}

func TestBenchServerRefuses(t *testing.T) {
	addr := fmt.Sprintf("shm://@goverbs-test-bench-only-%d", os.Getpid())
	srv, _ := startServerCmd(t, addr, "write_bw")
	out, errOut, code := goverbs(t, "bench", addr, "-n", "20", "read_lat")
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	oneLineError(t, out, errOut, "refused", "runs only write_bw")
	stopBenchServer(t, srv)
}

// TestBenchErrors: each failure is one line that says what to do, and a
// non-zero exit status.
func TestBenchErrors(t *testing.T) {
	nobody := fmt.Sprintf("shm://@goverbs-test-nobody-%d", os.Getpid())
	tests := []struct {
		args []string
		want []string
	}{
		// An unreachable server.
		{[]string{"bench", nobody, "write_bw"}, []string{"nothing listens at " + nobody, "goverbs bench -l " + nobody}},
		// A size beyond the device's limits.
		{[]string{"bench", "-d", "shm0", "-s", "4G", "write_bw"}, []string{"4294967296", "max_msg_sz", "smaller -s"}},
		// Something the test cannot do.
		{[]string{"bench", "-d", "loop0", "--event", "write_lat"}, []string{"write_lat", "without --event"}},
		{[]string{"bench", "-d", "shm0", "-I", "100000", "send_lat"}, []string{"inline", "1024"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[1:], " "), func(t *testing.T) {
			out, errOut, code := goverbs(t, tt.args...)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			oneLineError(t, out, errOut, tt.want...)
		})
	}
}

func TestBenchUsage(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{args: []string{"bench", "-h"}, stdout: "--compare"},
		{args: []string{"help", "bench"}, stdout: "-s, --size bytes"},
		{args: []string{"bench", "--json", "--csv"}, code: 2, stderr: "choose one"},
		{args: []string{"bench", "-s", "8", "-a"}, code: 2, stderr: "choose one"},
		{args: []string{"bench", "nosuchtest"}, code: 2, stderr: `no test "nosuchtest"`},
		{args: []string{"bench", "-s", "0"}, code: 2, stderr: "number of bytes"},
		{args: []string{"bench", "-n", "0"}, code: 2, stderr: "--iters 0"},
		{args: []string{"bench", "--plot", "b.jpg"}, code: 2, stderr: "FILE.png"},
		{args: []string{"bench", "-l", "shm://@x", "--compare"}, code: 2, stderr: "to the client"},
		{args: []string{"bench", "--repeat", "3"}, code: 2, stderr: "give --compare too"},
		{args: []string{"bench", "--compare", "--repeat", "0"}, code: 2, stderr: "--repeat 0"},
		{args: []string{"bench", "shm://@x", "shm://@y"}, code: 2, stderr: "two addresses"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, errOut, code := goverbs(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit status %d, want %d (stderr %q)", code, tt.code, errOut)
			}
			if !strings.Contains(out, tt.stdout) || !strings.Contains(errOut, tt.stderr) {
				t.Errorf("stdout %q, stderr %q; want %q and %q in them", out, errOut, tt.stdout, tt.stderr)
			}
			if tt.code == 0 && errOut != "" {
				t.Errorf("stderr %q, want nothing", errOut)
			}
			if strings.Contains(out, "--peer") {
				t.Errorf("the usage shows the hidden --peer flag:\n%s", out)
			}
		})
	}
}
