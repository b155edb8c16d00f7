package iwarp_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs/verbstest"
)

// The conformance suite between two network namespaces joined by a veth
// pair: the endpoints reach each other over a real (virtual) link, with
// addresses that exist only inside those namespaces. The test creates
// the namespaces as root with ip(8), re-executes this test binary in
// the first (endpoint A), and starts every endpoint B in the second;
// everything is removed at the end.

const (
	envNetnsPeer = "GOVERBS_IWARP_NETNS_PEER" // inner run: the command that starts B in the other namespace
	envNetnsAddr = "GOVERBS_IWARP_NETNS_ADDR" // inner run: B's address
	netnsAddrA   = "192.168.213.1"
	netnsAddrB   = "192.168.213.2"
)

// TestConformanceNetns runs the suite between two network namespaces.
func TestConformanceNetns(t *testing.T) {
	if wrapper := os.Getenv(envNetnsPeer); wrapper != "" {
		netnsInner(t, wrapper, os.Getenv(envNetnsAddr))
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("creating network namespaces needs root")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("ip(8) is not installed (Debian package iproute2)")
	}
	id := os.Getpid()
	nsA, nsB := fmt.Sprintf("gviwa%d", id), fmt.Sprintf("gviwb%d", id)
	vethA, vethB := fmt.Sprintf("gva%d", id), fmt.Sprintf("gvb%d", id)
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		exec.Command(ip, "netns", "del", nsA).Run()
		exec.Command(ip, "netns", "del", nsB).Run()
	})
	run("netns", "add", nsA)
	run("netns", "add", nsB)
	run("link", "add", vethA, "netns", nsA, "type", "veth", "peer", "name", vethB, "netns", nsB)
	run("-n", nsA, "addr", "add", netnsAddrA+"/24", "dev", vethA)
	run("-n", nsB, "addr", "add", netnsAddrB+"/24", "dev", vethB)
	for _, ns := range []string{nsA, nsB} {
		run("-n", ns, "link", "set", "lo", "up")
	}
	run("-n", nsA, "link", "set", vethA, "up")
	run("-n", nsB, "link", "set", vethB, "up")

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(t.TempDir(), "peer-in-netns")
	script := fmt.Sprintf("#!/bin/sh\nexec %s netns exec %s %s \"$@\"\n", ip, nsB, self)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := []string{"netns", "exec", nsA, self, "-test.run=^TestConformanceNetns$", "-test.v"}
	cmd := exec.CommandContext(ctx, ip, args...)
	cmd.Env = append(os.Environ(), envNetnsPeer+"="+wrapper, envNetnsAddr+"="+netnsAddrB)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the suite in namespace %s against %s failed: %v\n%s", nsA, nsB, err, out)
	}
	passed := strings.Count(string(out), "--- PASS")
	if !strings.Contains(string(out), "--- PASS: TestConformanceNetns") {
		t.Fatalf("the inner run did not pass:\n%s", out)
	}
	t.Logf("the suite passed between namespaces %s (%s) and %s (%s) over veth: %d subtests", nsA, netnsAddrA, nsB, netnsAddrB, passed)
}

// netnsInner is the run inside the first namespace: B starts through
// wrapper, in the second namespace, and listens on addr.
func netnsInner(t *testing.T, wrapper, addr string) {
	// SpawnPeer starts B as os.Args[0]: make that the wrapper.
	prev := os.Args[0]
	os.Args[0] = wrapper
	defer func() { os.Args[0] = prev }()
	var port atomic.Int32
	port.Store(21000)
	verbstest.Run(t, verbstest.Harness{
		Device: "tcp0",
		// Nothing else listens in a fresh namespace: any port is free.
		Addr:   func(testing.TB) string { return fmt.Sprintf("tcp://%s:%d", addr, port.Add(1)) },
		Remote: verbstest.SpawnPeer("tcp0"),
	})
}
