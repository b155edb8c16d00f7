package shm

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The child of TestReadOnlySegmentStaysReadOnlyForOtherUsers: it drops
// to uid and gid 65534 and tries to reopen its descriptor 3 (a read-only segment
// descriptor) read-write through /proc, and reports the outcome.
func init() { childModes["reopenrw"] = asNobody(reopenRWChild) }

func reopenRWChild() int {
	fd, err := unix.Open("/proc/self/fd/3", unix.O_RDWR, 0)
	if err != nil {
		say("refused %v", err)
		return 0
	}
	unix.Close(fd)
	say("reopened")
	return 0
}

// TestReadOnlySegmentStaysReadOnlyForOtherUsers: a process of another
// user handed a segment's read-only descriptor cannot reopen it writable.
func TestReadOnlySegmentStaysReadOnlyForOtherUsers(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child of another user")
	}
	seg, err := newSegment("ro-test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.close()
	ro, err := seg.readOnlyFD()
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(ro), "segment")
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=reopenrw")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "refused") {
		t.Fatalf("another user reopened a read-only segment descriptor writable: %s", out)
	}
}
