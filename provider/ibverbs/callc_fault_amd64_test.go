package ibverbs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestFaultInCIsFatal: a memory fault in C code called by the data path
// kills the process, as it does in cgo, with a fatal error on stderr that
// names the call, printed without a second fault: it is never a panic
// the program could recover from and carry on with C state half updated,
// and it never hangs. The fault is made in a child
// process (this test binary run again).
func TestFaultInCIsFatal(t *testing.T) {
	if os.Getenv("GOVERBS_FAULT_IN_C") != "" {
		faultInC()
		return
	}
	if err := load(); err != nil {
		t.Skip(err)
	}
	out := crashChild(t, "TestFaultInCIsFatal", "GOVERBS_FAULT_IN_C", "faulting in C")
	if strings.Contains(string(out), "recovered") {
		t.Fatalf("the fault in C became a panic the child recovered from:\n%s", out)
	}
	if !strings.Contains(string(out), "fatal error") || !strings.Contains(string(out), "ccallOn") {
		t.Fatalf("the child faulting in C died without saying where:\n%s", out)
	}
	if strings.Contains(string(out), "panic during panic") {
		t.Fatalf("printing the fault in C faulted again:\n%s", out)
	}
}

// crashChild runs test alone in a child process (this test binary again)
// with env set to 1, and returns its output once it has crashed; it fails
// t if the child hangs or exits without crashing. what says what the
// child does, for the failure messages.
func crashChild(t *testing.T, test, env, what string) []byte {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"=1", "GOTRACEBACK=single")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the child %s hung:\n%s", what, out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Success() {
		t.Fatalf("the child %s exited with %v, want a crash:\n%s", what, err, out)
	}
	return out
}

// faultInC makes C read address 8 (strlen of it) through call3, under a
// recover that reports anything it catches.
func faultInC() {
	strlen := libcAddr("strlen")
	defer func() {
		if r := recover(); r != nil {
			fmt.Println("recovered:", r)
			os.Exit(0)
		}
	}()
	call3(strlen, 8, 0, 0)
	fmt.Println("recovered: strlen(8) returned")
	os.Exit(0)
}
