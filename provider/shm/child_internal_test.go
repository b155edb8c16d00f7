package shm

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Child processes for the tests that need more than verbstest's remote
// endpoint: the test binary re-executes itself with envChild naming a
// mode, and TestMain (conformance_test.go) hands control to ChildMain,
// which runs the mode and exits. A child talks to its parent in lines:
// it prints what it has to report on its standard output and reads
// commands from its standard input.

const envChild = "GOVERBS_SHM_CHILD"

// childModes are the roles a child can play, by name.
var childModes = map[string]func() int{}

// ChildMain runs the child mode named in the environment and exits, if
// this process was started as a child; otherwise it returns at once.
func ChildMain() {
	mode, ok := os.LookupEnv(envChild)
	if !ok {
		return
	}
	f := childModes[mode]
	if f == nil {
		fmt.Fprintf(os.Stderr, "shm test child: unknown mode %q\n", mode)
		os.Exit(2)
	}
	os.Exit(f())
}

// say reports a line to the parent.
func say(format string, args ...any) { fmt.Fprintf(os.Stdout, format+"\n", args...) }

// childFail reports a failure to the parent and returns the exit status.
func childFail(format string, args ...any) int {
	say("error "+format, args...)
	return 1
}

// commands returns the lines the parent writes to the child's input.
func commands() <-chan string {
	ch := make(chan string, 4)
	go func() {
		defer close(ch)
		s := bufio.NewScanner(os.Stdin)
		for s.Scan() {
			ch <- s.Text()
		}
	}()
	return ch
}

// child is a child process seen from the parent.
type child struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr bytes.Buffer
	exited chan struct{}
	err    error // the exit status, once exited is closed
}

var childSeq atomic.Int64

// uniqueAddr returns a fresh abstract shm address: nothing is left on any
// file system after any kind of exit.
func uniqueAddr(what string) string {
	return fmt.Sprintf("shm://@goverbs-shmtest-%s-%d-%d", what, os.Getpid(), childSeq.Add(1))
}

// spawn starts a child in mode with the extra environment env. The
// child is killed, if still running, and reaped when the test ends.
func spawn(t testing.TB, mode string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	cmd.Env = append(append(os.Environ(), envChild+"="+mode, "GORACE="+gorace), env...)
	c := &child{t: t, cmd: cmd, lines: make(chan string, 64), exited: make(chan struct{})}
	cmd.Stderr = &syncWriter{w: &c.stderr}
	var err error
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", mode, err)
	}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.stdin.Close()
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			c.kill()
		}
		var rest []string
		for l := range c.lines {
			rest = append(rest, l)
		}
		if t.Failed() {
			t.Logf("child %s: unread output %q; stderr:\n%s", mode, rest, c.stderr.String())
		}
	})
	return c
}

// syncWriter serialises writes to a buffer that is read at the end.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

// pid is the child's process ID.
func (c *child) pid() int { return c.cmd.Process.Pid }

// expect waits up to d for a line starting with prefix and returns the
// rest of it; a line starting with "error" fails the test.
func (c *child) expect(prefix string, d time.Duration) string {
	c.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				<-c.exited
				c.t.Fatalf("child exited (%v) while the test waited for %q; stderr:\n%s", c.err, prefix, c.stderr.String())
			}
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return strings.TrimSpace(rest)
			}
			if strings.HasPrefix(l, "error") {
				c.t.Fatalf("child: %s", l)
			}
		case <-timer.C:
			c.t.Fatalf("no %q from the child within %v", prefix, d)
		}
	}
}

// send writes a command line to the child.
func (c *child) send(cmd string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		c.t.Fatalf("command %q to child: %v", cmd, err)
	}
}

// kill ends the child with SIGKILL and reaps it.
func (c *child) kill() {
	c.cmd.Process.Kill()
	<-c.exited
}

// wait waits up to d for the child to exit and returns its exit error.
func (c *child) wait(d time.Duration) error {
	c.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	lines := c.lines
	for {
		select {
		case l, ok := <-lines:
			if ok && strings.HasPrefix(l, "error") {
				c.t.Errorf("child: %s", l)
			}
			if !ok {
				lines = nil
			}
		case <-c.exited:
			return c.err
		case <-timer.C:
			c.t.Fatalf("child did not exit within %v", d)
		}
	}
}
