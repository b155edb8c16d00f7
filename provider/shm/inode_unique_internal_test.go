package shm

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestKernelReleaseParsing: the kernel releases from which memfd inode
// numbers are unique (5.9) are told from those before it, whatever
// follows the version, and a release that does not parse counts as old.
func TestKernelReleaseParsing(t *testing.T) {
	for rel, want := range map[string]bool{
		"6.18.44-fc-v1147":      true,
		"5.9.0":                 true,
		"5.10":                  true,
		"5.15.0-91-generic":     true,
		"10.0.1":                true,
		"5.8.18-100.fc31":       false,
		"4.18.0-513.el8.x86_64": false,
		"3.17":                  false,
		"6":                     false,
		"":                      false,
		"x.y":                   false,
	} {
		if got := releaseAtLeast(rel, 5, 9); got != want {
			t.Errorf("releaseAtLeast(%q, 5, 9) = %v, want %v", rel, got, want)
		}
	}
}

// TestPeerSegmentsSharedOnlyWhereInodesAreUnique: a file on another device
// than the memfds' is never taken for a mapped one; where inode numbers
// may be reused, each segment of a peer's memfd is a mapping of its own,
// which stays mapped, and in use, when another segment of the same memfd
// is closed.
func TestPeerSegmentsSharedOnlyWhereInodesAreUnique(t *testing.T) {
	var st unix.Stat_t
	if err := unix.Stat(os.TempDir(), &st); err != nil {
		t.Fatal(err)
	}
	if dev, ok := memfdDevice(); ok && dev != uint64(st.Dev) && uniqueInode(uint64(st.Dev)) {
		t.Fatalf("a file of device %#x is taken as a memfd of device %#x", st.Dev, dev)
	}

	saved := memfdDevice
	memfdDevice = func() (uint64, bool) { return 0, false }
	t.Cleanup(func() { memfdDevice = saved })
	seg, err := newSegment("test", 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.close()
	mapOne := func() *segment {
		t.Helper()
		fd, err := unix.Dup(seg.fd)
		if err != nil {
			t.Fatal(err)
		}
		s, err := mapPeerSegment(fd, 4096, true)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := mapOne(), mapOne()
	defer b.close()
	if a.shared != nil || b.shared != nil || &a.mem[0] == &b.mem[0] {
		t.Fatal("a memfd whose inode number may be reused shares one mapping")
	}
	a.close()
	b.mem[100] = 7
	if seg.mem[100] != 7 {
		t.Fatal("the mapping left once the other was closed does not reach the memfd")
	}
}
