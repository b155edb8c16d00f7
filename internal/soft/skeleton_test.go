package soft

import (
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// recorder is a transport that records what the skeleton asks of it.
type recorder struct {
	calls []string
	state *driver.QPAttr
	veto  error
	wcs   []driver.WorkCompletion
}

func (r *recorder) VetoModify(next driver.QPState, _ *driver.QPAttr) error {
	r.calls = append(r.calls, "veto "+next.String())
	return r.veto
}
func (r *recorder) Modified(driver.QPAttrMask) { r.calls = append(r.calls, "modified") }
func (r *recorder) EnterReset()                { r.calls = append(r.calls, "reset") }
func (r *recorder) EnterRTR()                  { r.calls = append(r.calls, "rtr") }
func (r *recorder) EnterRTS()                  { r.calls = append(r.calls, "rts") }
func (r *recorder) DrainSQ()                   { r.calls = append(r.calls, "drain") }
func (r *recorder) EnterErr() {
	r.calls = append(r.calls, "err from "+r.state.State.String())
}
func (r *recorder) CompleteRecv(wc driver.WorkCompletion) { r.wcs = append(r.wcs, wc) }

func toInit() (driver.QPAttr, driver.QPAttrMask) {
	return driver.QPAttr{State: driver.QPSInit, Port: 1, AccessFlags: driver.AccessLocalWrite},
		driver.QPAttrState | driver.QPAttrPort | driver.QPAttrAccessFlags
}

func toRTR() (driver.QPAttr, driver.QPAttrMask) {
	return driver.QPAttr{State: driver.QPSRTR, PathMTU: driver.MTU1024, DestQPNum: 7},
		driver.QPAttrState | driver.QPAttrPathMTU | driver.QPAttrDestQPN | driver.QPAttrRQPSN |
			driver.QPAttrMaxDestRdAtomic | driver.QPAttrMinRNRTimer
}

func toRTS() (driver.QPAttr, driver.QPAttrMask) {
	return driver.QPAttr{State: driver.QPSRTS},
		driver.QPAttrState | driver.QPAttrSQPSN | driver.QPAttrTimeout | driver.QPAttrRetryCnt |
			driver.QPAttrRNRRetry | driver.QPAttrMaxQPRdAtomic
}

func TestModifyCallsEachStatesHookInOrder(t *testing.T) {
	var cur driver.QPAttr
	r := &recorder{state: &cur}
	pending := false
	for _, step := range []func() (driver.QPAttr, driver.QPAttrMask){toInit, toRTR, toRTS} {
		a, m := step()
		if err := Modify(r, &cur, &pending, false, &a, m); err != nil {
			t.Fatal(err)
		}
	}
	sqd := driver.QPAttr{State: driver.QPSSQD}
	if err := Modify(r, &cur, &pending, false, &sqd, driver.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if !pending {
		t.Error("RTS to SQD left sqdPending clear")
	}
	e := driver.QPAttr{State: driver.QPSErr}
	if err := Modify(r, &cur, &pending, false, &e, driver.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if pending {
		t.Error("the move to Err left sqdPending set")
	}
	want := []string{
		"veto INIT", "modified",
		"veto RTR", "rtr", "modified",
		"veto RTS", "rts", "modified",
		"veto SQD", "drain", "modified",
		"veto ERR", "err from SQD", "modified",
	}
	if !slices.Equal(r.calls, want) {
		t.Fatalf("hooks called %q, want %q", r.calls, want)
	}
	if cur.State != driver.QPSSQD {
		t.Errorf("EnterErr left the state to the transport, found %v", cur.State)
	}
}

func TestModifyRefusesBeforeAnyChange(t *testing.T) {
	var cur driver.QPAttr
	r := &recorder{state: &cur}
	pending := false
	a, m := toInit()
	if err := Modify(r, &cur, &pending, true, &a, m); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Modify of a destroyed QP: %v, want ErrClosed", err)
	}
	r.veto = driver.ErrInvalidArg
	if err := Modify(r, &cur, &pending, false, &a, m); !errors.Is(err, driver.ErrInvalidArg) {
		t.Fatalf("vetoed Modify: %v, want the veto", err)
	}
	r.veto = nil
	bad, bm := toRTS()
	if err := Modify(r, &cur, &pending, false, &bad, bm); !errors.Is(err, driver.ErrInvalidState) {
		t.Fatalf("Reset to RTS: %v, want ErrInvalidState", err)
	}
	if cur != (driver.QPAttr{}) || slices.Contains(r.calls, "modified") {
		t.Fatalf("refused moves changed the QP: %+v, hooks %q", cur, r.calls)
	}
}

func TestPostRecvQueuesOrFlushes(t *testing.T) {
	r := &recorder{}
	rq := recvq.New(2, 1)
	wrs := []driver.RecvWR{{WRID: 1}, {WRID: 2}, {WRID: 3}}
	if n, err := PostRecv(r, rq, false, driver.QPSReset, wrs); n != 0 || !errors.Is(err, driver.ErrInvalidState) {
		t.Fatalf("PostRecv in Reset: %d, %v", n, err)
	}
	if n, err := PostRecv(r, nil, false, driver.QPSInit, wrs); n != 0 || !errors.Is(err, driver.ErrInvalidArg) {
		t.Fatalf("PostRecv to a QP with an SRQ: %d, %v", n, err)
	}
	if n, err := PostRecv(r, rq, true, driver.QPSInit, wrs); n != 0 || !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("PostRecv to a destroyed QP: %d, %v", n, err)
	}
	if n, err := PostRecv(r, rq, false, driver.QPSInit, wrs); n != 2 || !errors.Is(err, driver.ErrQueueFull) {
		t.Fatalf("PostRecv of 3 into 2 slots: %d, %v", n, err)
	}
	FlushRecvs(r, rq)
	if n, err := PostRecv(r, rq, false, driver.QPSErr, wrs[2:]); n != 1 || err != nil {
		t.Fatalf("PostRecv in Err: %d, %v", n, err)
	}
	var ids []uint64
	for _, wc := range r.wcs {
		if wc.Status != driver.WCWRFlushErr || wc.Opcode != driver.WCRecv {
			t.Errorf("flushed completion %+v", wc)
		}
		ids = append(ids, wc.WRID)
	}
	if !slices.Equal(ids, []uint64{1, 2, 3}) {
		t.Fatalf("flushed WRIDs %v, want the queue's oldest first, then the one posted in Err", ids)
	}
	if rq.Peek() != nil {
		t.Fatal("a receive is left in the queue")
	}
}

func TestCQOverrunLosesAndReportsOnce(t *testing.T) {
	var mu sync.Mutex
	ev := NewEventQueue()
	var c CQ
	c.Init(2, "cq", &mu, &ev)
	for i := range 2 {
		if ok, _ := c.PushLocked(&Entry{WC: driver.WorkCompletion{WRID: uint64(i)}}); !ok {
			t.Fatalf("push %d into room refused", i)
		}
	}
	for range 2 {
		if ok, _ := c.PushLocked(&Entry{WC: driver.WorkCompletion{WRID: 9}}); ok {
			t.Fatal("a push into a full ring was taken")
		}
	}
	if !errors.Is(c.Err(), driver.ErrCQOverrun) {
		t.Fatalf("Err after an overrun: %v", c.Err())
	}
	if e := <-ev.Events(); e.Type != driver.EventCQErr || e.Element != "cq" {
		t.Fatalf("event %+v, want EventCQErr of the CQ", e)
	}
	select {
	case e := <-ev.Events():
		t.Fatalf("a second event %+v for one overrun", e)
	default:
	}
	wc := make([]driver.WorkCompletion, 4)
	if n := c.Poll(wc); n != 2 || wc[0].WRID != 0 || wc[1].WRID != 1 {
		t.Fatalf("Poll: %d %+v, want the two taken, oldest first", n, wc[:n])
	}
}

func TestCQArmingWakesOnSolicitedOrFailed(t *testing.T) {
	var mu sync.Mutex
	ev := NewEventQueue()
	var c CQ
	c.Init(8, nil, &mu, &ev)
	if err := c.ReqNotify(true); err != nil {
		t.Fatal(err)
	}
	if _, woke := c.PushLocked(&Entry{}); woke {
		t.Fatal("an unsolicited success woke a CQ armed for solicited completions")
	}
	if _, woke := c.PushLocked(&Entry{WC: driver.WorkCompletion{Flags: driver.WCSolicited}}); !woke {
		t.Fatal("a solicited completion did not wake the armed CQ")
	}
	select {
	case <-c.Notify():
	default:
		t.Fatal("the wake sent nothing on Notify")
	}
	if _, woke := c.PushLocked(&Entry{WC: driver.WorkCompletion{Flags: driver.WCSolicited}}); woke {
		t.Fatal("a CQ woke twice for one arming")
	}
	mu.Lock()
	if !c.DestroyLocked() || c.DestroyLocked() {
		t.Fatal("DestroyLocked must report true once")
	}
	mu.Unlock()
	if err := c.ReqNotify(false); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("ReqNotify of a destroyed CQ: %v", err)
	}
	if n := c.Poll(make([]driver.WorkCompletion, 4)); n != 0 {
		t.Fatalf("a destroyed CQ yielded %d completions", n)
	}
}

func TestSRQLimitEventAndModify(t *testing.T) {
	var mu sync.Mutex
	ev := NewEventQueue()
	var s SRQ
	if err := s.Init(driver.SRQInitAttr{MaxWR: 4, MaxSGE: 9, UserCtx: "srq"}, "test", 8, &mu, &ev); !errors.Is(err, driver.ErrInvalidArg) {
		t.Fatalf("Init beyond the device's SGEs: %v", err)
	}
	if err := s.Init(driver.SRQInitAttr{MaxWR: 4, MaxSGE: 1, UserCtx: "srq"}, "test", 8, &mu, &ev); err != nil {
		t.Fatal(err)
	}
	if err := s.Modify(driver.SRQAttr{MaxWR: 8}, driver.SRQAttrMaxWR); !errors.Is(err, driver.ErrUnsupported) {
		t.Fatalf("resize: %v", err)
	}
	if err := s.Modify(driver.SRQAttr{Limit: 2}, driver.SRQAttrLimit); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PostRecv([]driver.RecvWR{{WRID: 1}, {WRID: 2}, {WRID: 3}}); n != 3 || err != nil {
		t.Fatalf("PostRecv: %d, %v", n, err)
	}
	var got recvq.WR
	if !s.Take(&got) || got.WRID != 1 {
		t.Fatalf("Take: %+v", got)
	}
	select {
	case e := <-ev.Events():
		t.Fatalf("event %+v with 2 left and the limit at 2", e)
	default:
	}
	if !s.Take(&got) || got.WRID != 2 {
		t.Fatalf("Take: %+v", got)
	}
	if e := <-ev.Events(); e.Type != driver.EventSRQLimitReached || e.Element != "srq" {
		t.Fatalf("event %+v, want the limit reached", e)
	}
	if a, err := s.Query(); err != nil || a.Limit != 0 || a.MaxSGE != 1 || a.MaxWR < 4 {
		t.Fatalf("Query after the event: %+v, %v (the event disarms the limit)", a, err)
	}
	mu.Lock()
	if r := s.PeekLocked(); r == nil || r.WRID != 3 {
		t.Fatalf("PeekLocked: %+v", r)
	}
	s.DestroyLocked()
	if s.PeekLocked() != nil {
		t.Fatal("a destroyed SRQ yields receives")
	}
	mu.Unlock()
	if n, err := s.PostRecv([]driver.RecvWR{{}}); n != 0 || !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("PostRecv to a destroyed SRQ: %d, %v", n, err)
	}
}

func TestAdmitAndRelease(t *testing.T) {
	if err := Admit(true, 0, 1); !errors.Is(err, driver.ErrClosed) {
		t.Errorf("Admit when closed: %v", err)
	}
	if err := Admit(false, 1, 1); !errors.Is(err, driver.ErrNoResources) {
		t.Errorf("Admit at the limit: %v", err)
	}
	if err := Admit(false, 0, 1); err != nil {
		t.Errorf("Admit with room: %v", err)
	}
	released, n := false, 1
	if err := Release(&released, &n); err != nil || !released || n != 0 {
		t.Fatalf("Release: %v, released %v, n %d", err, released, n)
	}
	if err := Release(&released, &n); !errors.Is(err, driver.ErrClosed) || n != 0 {
		t.Fatalf("second Release: %v, n %d", err, n)
	}
}

// faceQP is a provider's QP that embeds the face.
type faceQP struct {
	QP
	recorder
	mu         sync.Mutex
	attr       driver.QPAttr
	destroyed  bool
	sqdPending bool
	rq         *recvq.Queue
}

func TestQPFaceServesTheProvidersFields(t *testing.T) {
	q := &faceQP{rq: recvq.New(4, 1)}
	q.recorder.state = &q.attr
	q.QP.Init(0x42, &q.mu, q, q, &q.attr, &q.destroyed, &q.sqdPending, &q.rq)
	if q.Num() != 0x42 {
		t.Fatalf("Num %#x", q.Num())
	}
	a, m := toInit()
	if err := q.Modify(&a, m); err != nil {
		t.Fatal(err)
	}
	if n, err := q.PostRecv([]driver.RecvWR{{WRID: 5}}); n != 1 || err != nil {
		t.Fatalf("PostRecv in Init: %d, %v", n, err)
	}
	if r := q.rq.Peek(); r == nil || r.WRID != 5 {
		t.Fatalf("the receive is not in the provider's queue: %+v", r)
	}
	got, err := q.Query()
	if err != nil || got.State != driver.QPSInit || got.CurState != driver.QPSInit || got.Port != 1 {
		t.Fatalf("Query: %+v, %v", got, err)
	}
	q.destroyed = true
	if _, err := q.Query(); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Query of a destroyed QP: %v", err)
	}
	if err := q.Modify(&a, m); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Modify of a destroyed QP: %v", err)
	}
}

func TestPDCountedInAndOutOnce(t *testing.T) {
	var mu sync.Mutex
	n := 0
	p, err := NewPD(false, &n, 1, &mu)
	if err != nil || n != 1 {
		t.Fatalf("NewPD: %v, count %d", err, n)
	}
	if _, err := NewPD(false, &n, 1, &mu); !errors.Is(err, driver.ErrNoResources) || n != 1 {
		t.Fatalf("NewPD at the limit: %v, count %d", err, n)
	}
	if _, err := NewPD(true, &n, 2, &mu); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("NewPD in a closed context: %v", err)
	}
	if err := p.Dealloc(); err != nil || n != 0 || !p.Released() {
		t.Fatalf("Dealloc: %v, count %d, released %v", err, n, p.Released())
	}
	if err := p.Dealloc(); !errors.Is(err, driver.ErrClosed) || n != 0 {
		t.Fatalf("second Dealloc: %v, count %d", err, n)
	}
}

func TestSQDrainedRaisesOnceWhenIdleInSQD(t *testing.T) {
	ev := NewEventQueue()
	pending := true
	SQDrained(&pending, driver.QPSSQD, true, ev, "qp")
	SQDrained(&pending, driver.QPSRTS, false, ev, "qp")
	select {
	case e := <-ev.Events():
		t.Fatalf("event %+v while busy or out of SQD", e)
	default:
	}
	SQDrained(&pending, driver.QPSSQD, false, ev, "qp")
	SQDrained(&pending, driver.QPSSQD, false, ev, "qp")
	if e := <-ev.Events(); e.Type != driver.EventSQDrained || e.Element != "qp" || pending {
		t.Fatalf("event %+v, pending %v", e, pending)
	}
	select {
	case e := <-ev.Events():
		t.Fatalf("a second event %+v for one drain", e)
	default:
	}
}

func TestWithinRefusesWhatLeavesTheRegion(t *testing.T) {
	buf := make([]byte, 16)
	const base = 0x1000
	for _, c := range []struct {
		addr, n uint64
		ok      bool
	}{
		{base, 16, true},
		{base + 4, 12, true},
		{base + 16, 0, true},
		{base + 15, 2, false},
		{base + 17, 0, false},
		{base - 1, 1, false},
		{base - 1, 2, false},
		{base + 8, ^uint64(0) - 4, false},
	} {
		b, ok := Within(buf, base, c.addr, c.n)
		if ok != c.ok || (ok && (uint64(len(b)) != c.n || (c.n > 0 && &b[0] != &buf[c.addr-base]))) {
			t.Errorf("Within(%#x, %d) = %d bytes, %v; want %v", c.addr, c.n, len(b), ok, c.ok)
		}
	}
}
