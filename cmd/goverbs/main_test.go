package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/listenwait"
)

// goverbsBin is the goverbs command built once by TestMain; the tests run it
// as a user would.
var goverbsBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	dir, err := os.MkdirTemp("", "goverbs-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "make temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	goverbsBin = filepath.Join(dir, "goverbs")
	// go test puts its own go command first on PATH.
	gocmd, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot build goverbs: no go command on PATH:", err)
		return 1
	}
	build := exec.Command(gocmd, "build", "-buildvcs=false", "-o", goverbsBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}
	code := m.Run()
	if code == 0 {
		// The commands run in this process too (demo, bench, ping): they
		// must leave no goroutine behind.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// goverbs runs the built command with args and returns its output and
// exit status.
func goverbs(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goverbsBin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("run goverbs %q: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("goverbs %q did not finish within a minute", args)
	}
	return o.String(), e.String(), code
}

func TestDevices(t *testing.T) {
	out, errOut, code := goverbs(t, "devices")
	if code != 0 || errOut != "" {
		t.Fatalf("goverbs devices: exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "DEVICE") {
		t.Fatalf("goverbs devices printed no table:\n%s", out)
	}
	providers := map[string]string{}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) == 4 {
			providers[f[0]] = f[1]
		}
	}
	for dev, prov := range map[string]string{"loop0": "loop", "shm0": "shm"} {
		if providers[dev] != prov {
			t.Errorf("goverbs devices does not list %s of provider %s:\n%s", dev, prov, out)
		}
	}
	if _, ok := providers[defaultDevice]; !ok {
		t.Errorf("goverbs devices does not list the default device %s:\n%s", defaultDevice, out)
	}
}

func TestDevicesVerbose(t *testing.T) {
	out, errOut, code := goverbs(t, "devices", "-v", "-d", defaultDevice)
	if code != 0 || errOut != "" {
		t.Fatalf("goverbs devices -v: exit %d, stderr %q", code, errOut)
	}
	attrs := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok {
			attrs[k] = strings.TrimSpace(v)
		}
	}
	if attrs["hca_id"] != defaultDevice {
		t.Errorf("hca_id is %q, want %q:\n%s", attrs["hca_id"], defaultDevice, out)
	}
	for _, k := range []string{"max_qp_wr", "max_sge", "max_cqe", "max_qp_rd_atom"} {
		if n, err := strconv.Atoi(attrs[k]); err != nil || n <= 0 {
			t.Errorf("%s is %q, want a positive number", k, attrs[k])
		}
	}
	if attrs["transport"] != "shm" {
		t.Errorf("transport is %q, want shm", attrs["transport"])
	}
}

// stepLine is one timed step of the demo: side, number, what, elapsed.
var stepLine = regexp.MustCompile(`^(server|client) +(\d+)\. (.+) \.\.\. (\d+(\.\d+)?(ns|µs|ms|s))$`)

// checkDemo checks the demo's output: every side's steps are numbered
// from 1 without gaps, the read bytes line carries value, and it ends
// with ok.
func checkDemo(t *testing.T, out, value string) {
	t.Helper()
	next := map[string]int{"server": 1, "client": 1}
	readLine := fmt.Sprintf("client     read bytes: %q", value)
	sawRead, sawOK := false, false
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		switch {
		case l == readLine:
			sawRead = true
		case strings.HasPrefix(l, "ok: "):
			sawOK = true
		case strings.HasPrefix(l, "server") || strings.HasPrefix(l, "client"):
			m := stepLine.FindStringSubmatch(l)
			if m == nil {
				t.Errorf("malformed step line %q", l)
				continue
			}
			n, _ := strconv.Atoi(m[2])
			if n != next[m[1]] {
				t.Errorf("%s step %d, want step %d: %q", m[1], n, next[m[1]], l)
			}
			next[m[1]] = n + 1
		}
	}
	if !sawRead {
		t.Errorf("no line %q in the output:\n%s", readLine, out)
	}
	if !sawOK {
		t.Errorf("no final ok line in the output:\n%s", out)
	}
	if next["server"] < 10 || next["client"] < 12 {
		t.Errorf("too few steps (server %d, client %d):\n%s", next["server"]-1, next["client"]-1, out)
	}
}

func TestDemo(t *testing.T) {
	out, errOut, code := goverbs(t, "demo")
	if code != 0 || errOut != "" {
		t.Fatalf("goverbs demo: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	checkDemo(t, out, defaultValue)
}

func TestDemoFlags(t *testing.T) {
	value := "a value of one's own"
	for _, tt := range []struct{ device, addr string }{
		{defaultDevice, fmt.Sprintf("shm://@goverbs-demo-flags-%d", os.Getpid())},
		{"loop0", "loop://demo-flags"},
	} {
		out, errOut, code := goverbs(t, "demo", "--device", tt.device, "--addr", tt.addr, "--value", value)
		if code != 0 || errOut != "" {
			t.Fatalf("goverbs demo -d %s: exit %d, stderr %q, stdout:\n%s", tt.device, code, errOut, out)
		}
		checkDemo(t, out, value)
		if !strings.Contains(out, "listening at "+tt.addr) {
			t.Errorf("the server did not listen on the --addr given:\n%s", out)
		}
		if !strings.Contains(out, "open device "+tt.device) {
			t.Errorf("the demo did not open %s:\n%s", tt.device, out)
		}
	}
}

// TestDemoInProcess runs the demo in the test's process, so that the race
// detector watches its two goroutines.
func TestDemoInProcess(t *testing.T) {
	var o, e bytes.Buffer
	addr := fmt.Sprintf("shm://@goverbs-demo-in-process-%d", os.Getpid())
	if code := run(context.Background(), []string{"demo", "--addr", addr}, &o, &e); code != 0 {
		t.Fatalf("demo: exit %d, stderr %q, stdout:\n%s", code, e.String(), o.String())
	}
	checkDemo(t, o.String(), defaultValue)
}

// oneLineError checks that a failure was reported as one line on stderr
// mentioning every word in want, with nothing on stdout.
func oneLineError(t *testing.T, stdout, stderr string, want ...string) {
	t.Helper()
	if stdout != "" {
		t.Errorf("stdout is %q, want nothing", stdout)
	}
	if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Errorf("stderr is %q, want exactly one line", stderr)
	}
	for _, w := range want {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr %q does not mention %q", stderr, w)
		}
	}
}

func TestBadDevice(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "-d", "nosuchdev0"},
		{"demo", "--device=nosuchdev0"},
		{"devices", "-v", "-d", "nosuchdev0"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, errOut, code := goverbs(t, args...)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			oneLineError(t, out, errOut, "nosuchdev0", defaultDevice, "goverbs devices")
		})
	}
}

func TestBadAddress(t *testing.T) {
	out, errOut, code := goverbs(t, "demo", "--addr", "nosuchscheme://x")
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if !strings.Contains(out, "goverbs demo:") {
		t.Errorf("the demo did not start:\n%s", out)
	}
	if strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "nosuchscheme") {
		t.Errorf("stderr is %q, want one line about the address", errOut)
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		stdout   string // a substring of stdout
		stderr   string // a substring of stderr
		noStderr bool
	}{
		{args: nil, code: 2, stderr: "Usage:"},
		{args: []string{"--help"}, code: 0, stdout: "devices", noStderr: true},
		{args: []string{"-h"}, code: 0, stdout: "demo", noStderr: true},
		{args: []string{"help"}, code: 0, stdout: "The commands are", noStderr: true},
		{args: []string{"help", "demo"}, code: 0, stdout: "-d, --device", noStderr: true},
		{args: []string{"demo", "-h"}, code: 0, stdout: "--addr", noStderr: true},
		{args: []string{"demo", "--help"}, code: 0, stdout: "--timeout", noStderr: true},
		{args: []string{"devices", "-h"}, code: 0, stdout: "-v, --verbose", noStderr: true},
		{args: []string{"help", "nosuchcmd"}, code: 2, stderr: "unknown command"},
		{args: []string{"nosuchcmd"}, code: 2, stderr: "unknown command \"nosuchcmd\""},
		{args: []string{"demo", "--nosuchflag"}, code: 2, stderr: "flag provided but not defined"},
		{args: []string{"demo", "extra"}, code: 2, stderr: "unexpected arguments"},
		{args: []string{"demo", "--value", ""}, code: 2, stderr: "--value"},
		{args: []string{"devices", "extra"}, code: 2, stderr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, errOut, code := goverbs(t, tt.args...)
			if code != tt.code {
				t.Errorf("exit status %d, want %d (stderr %q)", code, tt.code, errOut)
			}
			if !strings.Contains(out, tt.stdout) {
				t.Errorf("stdout does not contain %q:\n%s", tt.stdout, out)
			}
			if !strings.Contains(errOut, tt.stderr) {
				t.Errorf("stderr does not contain %q:\n%s", tt.stderr, errOut)
			}
			if tt.noStderr && errOut != "" {
				t.Errorf("stderr is %q, want nothing", errOut)
			}
		})
	}
}

func TestValueMsg(t *testing.T) {
	m := valueMsg{RKey: 0x1234, Addr: 0xdeadbeef00, Len: 73, CRC: 0xcafef00d}
	b := make([]byte, msgLen)
	m.encode(b)
	got, err := decodeValueMsg(b)
	if err != nil || got != m {
		t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
	}
	if _, err := decodeValueMsg(b[:msgLen-1]); err == nil {
		t.Error("a short message decoded without error")
	}
	b[0] ^= 0xff
	if _, err := decodeValueMsg(b); err == nil {
		t.Error("a message with a bad magic decoded without error")
	}
}
