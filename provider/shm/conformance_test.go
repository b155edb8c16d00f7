package shm_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/listenwait"
	"github.com/goverbs/goverbs/provider/shm"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

func TestMain(m *testing.M) {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	shm.ChildMain()
	verbstest.PeerMain()
	goleak.VerifyTestMain(m)
}

var pairs atomic.Int64

func addr(testing.TB) string {
	return fmt.Sprintf("shm://@goverbs-test-%d-%d", os.Getpid(), pairs.Add(1))
}

// TestConformance runs the whole conformance suite with the two endpoints
// in two processes: B is this test binary, re-executed.
func TestConformance(t *testing.T) {
	verbstest.Run(t, verbstest.Harness{Device: "shm0", Addr: addr, Remote: verbstest.SpawnPeer("shm0")})
}

// TestConformanceInProcess runs it with both endpoints in this process, so
// that the race detector sees both sides of every exchange.
func TestConformanceInProcess(t *testing.T) {
	verbstest.Run(t, verbstest.Harness{Device: "shm0", Addr: addr})
}
