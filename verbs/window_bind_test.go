package verbs_test

import (
	"errors"
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// TestBindMWType1Unbind: QP.BindMW binds a type 1 window, and a zero
// length with no region unbinds it, each giving it a new key; a type 2
// window is refused by QP.BindMW.
func TestBindMWType1Unbind(t *testing.T) {
	ctx, err := verbs.Open("loop0")
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.AllocMR(64, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	peer, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	connect(qp, peer.Num())
	connect(peer, qp.Num())
	mw, err := pd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	keys := map[uint32]bool{mw.RKey(): true}
	for i, b := range []struct {
		mr *verbs.MR
		n  uint64
	}{{mr, 64}, {nil, 0}} {
		if err := qp.BindMW(mw, uint64(i), b.mr, mr.Addr(), b.n, verbs.AccessRemoteRead, verbs.SendSignaled); err != nil {
			t.Fatal(err)
		}
		if cq.Poll(wc) != 1 || wc[0].Status != verbs.WCSuccess || wc[0].Opcode != verbs.WCBindMW {
			t.Fatalf("bind %d: %+v", i, wc[0])
		}
		if keys[mw.RKey()] {
			t.Fatalf("bind %d kept a key the window had", i)
		}
		keys[mw.RKey()] = true
	}
	mw2, err := pd.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.BindMW(mw2, 9, mr, mr.Addr(), 8, verbs.AccessRemoteRead, verbs.SendSignaled); !errors.Is(err, verbs.ErrInvalidArg) {
		t.Fatalf("QP.BindMW of a type 2 window: %v, want ErrInvalidArg", err)
	}
	if err := pd.Dealloc(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("Dealloc of a PD with windows: %v, want ErrBusy", err)
	}
	for _, w := range []*verbs.MW{mw, mw2} {
		if err := w.Dealloc(); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Dealloc(); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("second Dealloc: %v, want ErrClosed", err)
	}
}
