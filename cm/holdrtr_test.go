package cm_test

import (
	"context"
	"errors"
	"testing"

	"github.com/goverbs/goverbs/cm"
	_ "github.com/goverbs/goverbs/provider/loop"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestDialRefusesHoldRTR: HoldRTR is the accepting side's; a Dial that
// asks for it is refused before anything is sent, its QP left in Reset.
func TestDialRefusesHoldRTR(t *testing.T) {
	_, _, qp := verbstest.QPOn(t, "loop0", 4)
	l, err := cm.Listen("loop://hold-rtr-dial")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = cm.Dial(context.Background(), "loop://hold-rtr-dial", qp, &cm.Param{HoldRTR: true})
	if !errors.Is(err, verbs.ErrInvalidArg) {
		t.Fatalf("Dial with HoldRTR returned %v, want an error wrapping %q", err, verbs.ErrInvalidArg)
	}
	if s := qp.State(); s != verbs.QPSReset {
		t.Fatalf("the QP of the refused Dial is in %v, want RESET", s)
	}
}
