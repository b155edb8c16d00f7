package loop_test

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

func pollOne(t *testing.T, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 1)
	for i := 0; ; i++ {
		if cq.Poll(wc) == 1 {
			return wc[0]
		}
		if i > 1<<26 {
			t.Fatal("no completion")
		}
	}
}

// IB (C10-74, rxe_check_bind_mw): a window may grant remote write on a
// region registered LocalWrite|MWBind without remote rights of its own:
// the point of a window is that the region's own rkey grants nothing.
func TestMWBindOnRegionWithoutRemoteRights(t *testing.T) {
	p := newPair(t, t.Name())
	pd := p.qpB.PD()
	mr, err := pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.qpB.BindMW(w, 7, mr, mr.Addr(), 512, verbs.AccessRemoteWrite|verbs.AccessRemoteRead, verbs.SendSignaled); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, p.cqB); wc.Status != verbs.WCSuccess {
		t.Fatalf("bind of a remote-write window on a LocalWrite|MWBind region: %v (ibverbs/rxe accept it)", wc.Status)
	}
}

// ibv_bind_mw twice in a row (the second posted before the first
// completes) works in ibverbs: mw->rkey is advanced at post time.
func TestMWBackToBackType1Binds(t *testing.T) {
	p := newPair(t, t.Name())
	pd := p.qpB.PD()
	mr, err := pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.RemoteAccess|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	// A Send that meets receiver-not-ready stalls the send queue ahead
	// of the binds, as any WR still under way would.
	if _, err := p.qpB.PostSend([]verbs.SendWR{{WRID: 9, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{p.mrB.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.qpB.BindMW(w, 1, mr, mr.Addr(), 512, verbs.AccessRemoteRead, verbs.SendSignaled); err != nil {
		t.Fatal(err)
	}
	if err := p.qpB.BindMW(w, 2, mr, mr.Addr()+512, 512, verbs.AccessRemoteRead, verbs.SendSignaled); err != nil {
		t.Fatal(err)
	}
	if _, err := p.qpA.PostRecv([]verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{p.mrA.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, p.cqB); wc.Status != verbs.WCSuccess || wc.WRID != 9 {
		t.Fatalf("send: %+v", wc)
	}
	for i := 0; i < 2; i++ {
		if wc := pollOne(t, p.cqB); wc.Status != verbs.WCSuccess {
			t.Fatalf("bind %d: %v", wc.WRID, wc.Status)
		}
	}
}

// Unbinding a type 1 window (length 0) as ibv_bind_mw does with
// bind_info.mr == NULL.
func TestMWUnbindWithNilMR(t *testing.T) {
	p := newPair(t, t.Name())
	pd := p.qpB.PD()
	mr, err := pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.RemoteAccess|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.qpB.BindMW(w, 1, mr, mr.Addr(), 512, verbs.AccessRemoteRead, verbs.SendSignaled); err != nil {
		t.Fatal(err)
	}
	pollOne(t, p.cqB)
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("BindMW(nil MR, length 0) panicked: %v", r)
		}
	}()
	if err := p.qpB.BindMW(w, 2, nil, 0, 0, 0, verbs.SendSignaled); err != nil {
		t.Fatalf("unbind: %v", err)
	}
}

// A Send with Invalidate that fails at the responder (too long for the
// receive) leaves the window bound under its key (rxe invalidates only
// once the receive takes the message).
func TestMWFailedSendWithInvKeepsWindow(t *testing.T) {
	p := newPair(t, t.Name())
	pd := p.qpB.PD()
	mr, err := pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.RemoteAccess|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pd.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.qpB.PostSend([]verbs.SendWR{w.Bind(1, mr, mr.Addr(), 512, verbs.AccessRemoteRead, verbs.SendSignaled)}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, p.cqB); wc.Status != verbs.WCSuccess {
		t.Fatalf("bind: %v", wc.Status)
	}
	key := w.RKey()
	if _, err := p.qpB.PostRecv([]verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{p.mrB.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.qpA.PostSend([]verbs.SendWR{{WRID: 6, Opcode: verbs.OpSendWithInv, InvalidateRKey: key, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{p.mrA.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	wc := pollOne(t, p.cqB)
	if wc.Status != verbs.WCLocLenErr {
		t.Fatalf("receive of a Send too long for it: %+v, want %v", wc, verbs.WCLocLenErr)
	}
	if wc.Flags&verbs.WCWithInv != 0 {
		t.Fatalf("a failed Send with Invalidate (%v) invalidated window %#x", wc.Status, wc.InvalidatedRKey)
	}
}
