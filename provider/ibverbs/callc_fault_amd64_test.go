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
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestFaultInCIsFatal$", "-test.count=1")
	cmd.Env = append(os.Environ(), "GOVERBS_FAULT_IN_C=1", "GOTRACEBACK=single")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the child faulting in C hung:\n%s", out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Success() {
		t.Fatalf("the child faulting in C exited with %v, want a crash:\n%s", err, out)
	}
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
