package verbs_test

import (
	"errors"
	"sync"
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

// TestDestroyWhileContextCloses: destroys racing Context.Close, in a
// program's order (QP, CQ, region, window, PD), each either destroy
// their object before the Close or report ErrClosed; none finds a CQ or
// PD still in use by objects the Close has destroyed (ErrBusy).
func TestDestroyWhileContextCloses(t *testing.T) {
	for round := range 500 {
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
		qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxSendSGE: 1, MaxRecvWR: 1, MaxRecvSGE: 1}})
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
		var wg sync.WaitGroup
		var closeErr error
		wg.Go(func() { closeErr = ctx.Close() })
		wg.Go(func() {
			for _, c := range []struct {
				what string
				f    func() error
			}{
				{"destroy QP", qp.Destroy}, {"destroy CQ", cq.Destroy}, {"dereg MR", mr.Dereg},
				{"dealloc MW", mw.Dealloc}, {"dealloc PD", pd.Dealloc},
			} {
				if err := c.f(); err != nil && !errors.Is(err, verbs.ErrClosed) {
					t.Errorf("round %d: %s while the context closes: %v, want success or ErrClosed", round, c.what, err)
				}
			}
		})
		wg.Wait()
		if closeErr != nil {
			t.Fatalf("round %d: close: %v", round, closeErr)
		}
	}
}
