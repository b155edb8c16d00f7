package iwarp_test

import (
	"fmt"
	"net"
	"testing"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/listenwait"
	_ "github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

func TestMain(m *testing.M) {
	// The tests dial their own listeners, in this process or in a child
	// of it, and a listener that waits 1 s for the MPA Request or the RTR
	// drops a dialler stalled that long (see package listenwait); the
	// tests of what a listener does with a silent or overdue peer set
	// the waits they need.
	listenwait.Set(listenwait.TestTimeout)
	verbstest.PeerMain()
	goleak.VerifyTestMain(m)
}

// freeAddr returns tcp://127.0.0.1:<port> with a port that was free a
// moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return fmt.Sprintf("tcp://%s", l.Addr())
}

// TestConformance runs the whole conformance suite over real TCP with the
// two endpoints in two processes: B is this test binary, re-executed.
func TestConformance(t *testing.T) {
	verbstest.Run(t, verbstest.Harness{Device: "tcp0", Addr: freeAddr, Remote: verbstest.SpawnPeer("tcp0")})
}

// TestConformanceInProcess runs the suite with both endpoints in this
// process, so that the race detector sees both sides of every exchange.
func TestConformanceInProcess(t *testing.T) {
	verbstest.Run(t, verbstest.Harness{Device: "tcp0", Addr: freeAddr})
}
