package loop_test

import (
	"fmt"
	"sync/atomic"
	"testing"

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
