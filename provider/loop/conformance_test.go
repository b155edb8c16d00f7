package loop_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

var pairs atomic.Int64

// TestConformance runs the whole conformance suite on loop0.
func TestConformance(t *testing.T) {
	verbstest.Run(t, verbstest.Harness{
		Device: "loop0",
		Addr:   func(testing.TB) string { return fmt.Sprintf("loop://conformance-%d", pairs.Add(1)) },
	})
}

// TestConformanceLenient runs the suite taking loop0 to lack the
// capabilities whose absence makes the suite accept more outcomes: its
// lenient side must pass a device that behaves strictly.
func TestConformanceLenient(t *testing.T) {
	verbstest.Run(t, verbstest.Harness{
		Device: "loop0",
		Addr:   func(testing.TB) string { return fmt.Sprintf("loop://conformance-%d", pairs.Add(1)) },
		Without: verbs.CapAckedCompletion | verbs.CapModifyConnect | verbs.CapRecvNoSGE | verbs.CapSQD |
			verbs.CapAtomicResultSGList | verbs.CapQPErrorEvents | verbs.CapTransportRetry | verbs.CapCommEstEvent,
	})
}
