package loop_test

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// TestCQEIsTheSizeAsked: a loop0 CQ holds exactly the completions its
// CreateCQ asked for, and CQ.CQE says so.
func TestCQEIsTheSizeAsked(t *testing.T) {
	ctx, err := verbs.Open("loop0")
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	for _, n := range []int{1, 5, 64} {
		cq, err := ctx.CreateCQ(n)
		if err != nil {
			t.Fatal(err)
		}
		if got := cq.CQE(); got != n {
			t.Errorf("CreateCQ(%d).CQE() = %d", n, got)
		}
	}
}
