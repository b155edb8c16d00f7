package verbs_test

import (
	"errors"
	"testing"

	_ "github.com/goverbs/goverbs/provider/loop"
	"github.com/goverbs/goverbs/verbs"
)

// TestDestroyAfterContextClose: Context.Close destroys every object made
// on the context; a destroy the program calls afterwards, in any order,
// reports ErrClosed (the object is gone), never ErrBusy for the CQ, SRQ
// or PD whose QPs and regions the Close took with it.
func TestDestroyAfterContextClose(t *testing.T) {
	ctx, err := verbs.Open("loop0")
	if err != nil {
		t.Fatal(err)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 2, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 1, MaxSendSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pd.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctx.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	for _, c := range []struct {
		what string
		f    func() error
	}{
		{"destroy CQ", cq.Destroy}, {"dealloc PD", pd.Dealloc}, {"destroy SRQ", srq.Destroy},
		{"destroy QP", qp.Destroy}, {"dereg MR", mr.Dereg}, {"dealloc MW", mw.Dealloc},
		{"destroy SRQ", srq.Destroy}, {"destroy CQ", cq.Destroy}, {"dealloc PD", pd.Dealloc},
		{"dealloc MW", mw.Dealloc},
	} {
		if err := c.f(); !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("%s after the context was closed: %v, want ErrClosed", c.what, err)
		}
	}
}
