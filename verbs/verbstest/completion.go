package verbstest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// writes returns n 8-byte Writes from src into consecutive words of dst,
// with WRIDs first, first+1, ..., signaled only where signaled says so.
func writes(n int, first uint64, src, dst Region, signaled func(i int) bool) []verbs.SendWR {
	var wrs []verbs.SendWR
	for i := range n {
		wr := writeWR(first+uint64(i), dst, 8*i, src.SGE(8*i, 8))
		if !signaled(i) {
			wr.Flags &^= verbs.SendSignaled
		}
		wrs = append(wrs, wr)
	}
	return wrs
}

// writePair makes a pair with opts and n words of source data at A and
// a zeroed target at B.
func writePair(t *testing.T, h Harness, opts PairOptions, n int) (p *Pair, src, dst Region, data []byte) {
	p = h.NewPair(t, opts)
	src = newRegion(t, p.A, 8*n, localRW)
	data = pattern(50, 8*n)
	fill(t, p.A, src, 0, data)
	dst = newRegion(t, p.B, 8*n, remoteAll)
	return p, src, dst, data
}

// testUnsignaled: unsignaled WRs produce no completion; the signaled one
// after them does.
func testUnsignaled(t *testing.T, h Harness) {
	p, src, dst, data := writePair(t, h, PairOptions{}, 4)
	postSend(t, p.A, 0, writes(4, 1, src, dst, func(i int) bool { return i == 3 })...)
	expectSendWC(t, waitOne(t, p.A, SendCQ), 4, verbs.WCRDMAWrite, p.A.QPNum(0))
	expectEmpty(t, p.A, SendCQ)
	expectBytes(t, p.B, dst, 0, data, "data of the unsignaled and signaled Writes")
}

// testRetirement: polling a signaled WR's completion frees the send queue
// slots of the unsignaled WRs before it, so a queue of 4 takes 3
// unsignaled and 1 signaled WR round after round.
func testRetirement(t *testing.T, h Harness) {
	const rounds = 64
	p, src, dst, data := writePair(t, h, PairOptions{Cap: verbs.QPCap{MaxSendWR: 4}}, 4)
	for r := range rounds {
		first := uint64(4 * r)
		postSend(t, p.A, 0, writes(4, first, src, dst, func(i int) bool { return i == 3 })...)
		expectSendWC(t, waitOne(t, p.A, SendCQ), first+3, verbs.WCRDMAWrite, p.A.QPNum(0))
	}
	expectEmpty(t, p.A, SendCQ)
	expectBytes(t, p.B, dst, 0, data, "data of the Writes")
}

// testSigAll: on a QP created with SigAll every WR completes, signaled or
// not.
func testSigAll(t *testing.T, h Harness) {
	p, src, dst, data := writePair(t, h, PairOptions{SigAll: true}, 4)
	postSend(t, p.A, 0, writes(4, 1, src, dst, func(int) bool { return false })...)
	expectStatuses(t, wait(t, p.A, SendCQ, 4), verbs.WCSuccess, 1, 2, 3, 4)
	expectEmpty(t, p.A, SendCQ)
	expectBytes(t, p.B, dst, 0, data, "data of the Writes")
}

// testBusyPoll: polling in a loop, without waiting, finds the completion.
func testBusyPoll(t *testing.T, h Harness) {
	p, src, dst, data := writePair(t, h, PairOptions{}, 1)
	postSend(t, p.A, 0, writeWR(1, dst, 0, src.SGE(0, 8)))
	wc := make([]verbs.WorkCompletion, 4)
	deadline := time.Now().Add(timeout)
	n := 0
	for n == 0 && time.Now().Before(deadline) {
		n = p.A.SendCQ.Poll(wc)
		runtime.Gosched()
	}
	if n != 1 {
		t.Fatalf("busy polling for %v found %d completions: %s", timeout, n, fmtWCs(wc[:n]))
	}
	expectSendWC(t, wc[0], 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	expectBytes(t, p.B, dst, 0, data, "written data")
}

// waitResult is what a CQ.Wait in another goroutine returned.
type waitResult struct {
	n   int
	err error
	wc  verbs.WorkCompletion
}

// waitInBackground calls A's RecvCQ.Wait in a goroutine and delivers its
// result on the channel; cancelling ctx ends it.
func waitInBackground(ctx context.Context, p *Pair) <-chan waitResult {
	res := make(chan waitResult, 1)
	go func() {
		wc := make([]verbs.WorkCompletion, 4)
		n, err := p.A.RecvCQ.Wait(ctx, wc)
		res <- waitResult{n, err, wc[0]}
	}()
	return res
}

// expectWaitResult waits for a background Wait to return the receive of
// wrid.
func expectWaitResult(t testing.TB, p *Pair, res <-chan waitResult, wrid uint64, n int) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-res:
		if r.err != nil || r.n != 1 {
			t.Fatalf("CQ.Wait returned %d completions, error %v; want 1", r.n, r.err)
		}
		expectRecvWC(t, r.wc, wrid, verbs.WCRecv, n, p.A.QPNum(0))
	case <-timer.C:
		t.Fatalf("CQ.Wait did not return within %v of the Send", timeout)
	}
}

// sendPair makes a pair whose B has a 64-byte source region with a pattern
// and whose A has a 64-byte receive region with one receive posted.
func sendPair(t *testing.T, h Harness) (p *Pair, src, dst Region) {
	p = h.NewPair(t, PairOptions{})
	src = newRegion(t, p.B, 64, localRW)
	fill(t, p.B, src, 0, pattern(51, 64))
	dst = newRegion(t, p.A, 64, localRW)
	postRecv(t, p.A, 0, recvWR(9, dst.SGE(0, 64)))
	return p, src, dst
}

// testWait: CQ.Wait blocks until the peer's Send arrives and returns it.
func testWait(t *testing.T, h Harness) {
	p, src, dst := sendPair(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res := waitInBackground(ctx, p)
	postSend(t, p.B, 0, sendWR(1, src.SGE(0, 48)))
	expectWaitResult(t, p, res, 9, 48)
	expectBytes(t, p.A, dst, 0, pattern(51, 64)[:48], "message received through Wait")
	expectSendWC(t, waitOne(t, p.B, SendCQ), 1, verbs.WCSend, p.B.QPNum(0))
}

// idleWindow is how long testWaitIdleCPU measures a blocked waiter.
const idleWindow = 200 * time.Millisecond

// testWaitIdleCPU: a goroutine blocked in CQ.Wait uses no CPU: over a
// window in which nothing arrives the process uses well under half a
// CPU (busy polling would use a whole one).
func testWaitIdleCPU(t *testing.T, h Harness) {
	if _, ok := processCPU(); !ok {
		skip(t, "process CPU time is not measurable on this system")
	}
	p, src, _ := sendPair(t, h)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res := waitInBackground(ctx, p)
	cpu0, _ := processCPU()
	start := time.Now()
	window := time.NewTimer(idleWindow)
	<-window.C
	cpu1, _ := processCPU()
	wall, cpu := time.Since(start), cpu1-cpu0
	select {
	case r := <-res:
		t.Fatalf("CQ.Wait returned before anything arrived: %d completions, error %v", r.n, r.err)
	default:
	}
	postSend(t, p.B, 0, sendWR(1, src.SGE(0, 8)))
	expectWaitResult(t, p, res, 9, 8)
	if cpu > wall/2 {
		t.Fatalf("while a goroutine waited in CQ.Wait for %v the process used %v of CPU: the wait is not idle", wall, cpu)
	}
	t.Logf("CPU while waiting: %v in %v", cpu, wall)
}

// parkedInWait waits until n goroutines of this process are asleep in
// CQ.Wait on a completion channel (past any sleep of the provider's
// own), looking at their stacks once a millisecond: it knows them by
// the frame of verbs' notifyWait, so a rename there must be made here.
func parkedInWait(t testing.TB, n int) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	limit := time.NewTimer(timeout)
	defer limit.Stop()
	buf := make([]byte, 1<<20)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		parked := 0
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, " [select") && strings.Contains(g, "verbs.(*CQ).notifyWait(") {
				parked++
			}
		}
		if parked >= n {
			return
		}
		select {
		case <-tick.C:
		case <-limit.C:
			t.Fatalf("%d goroutines asleep in CQ.Wait after %v, want %d", parked, timeout, n)
		}
	}
}

// testWaitTogether: two goroutines asleep in CQ.Wait on one CQ are
// woken one per completion: a completion's notification wakes one of
// them, and the next completion the other.
func testWaitTogether(t *testing.T, h Harness) {
	p, src, dst := sendPair(t, h)
	postRecv(t, p.A, 0, recvWR(10, dst.SGE(0, 64)))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	waits := []<-chan waitResult{waitInBackground(ctx, p), waitInBackground(ctx, p)}
	parkedInWait(t, 2)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for i, want := range []uint64{9, 10} {
		postSend(t, p.B, 0, sendWR(uint64(i+1), src.SGE(0, 16)))
		select {
		case r := <-waits[0]:
			waits = waits[1:]
			expectOneRecv(t, p, r, want)
		case r := <-waits[len(waits)-1]:
			waits = waits[:len(waits)-1]
			expectOneRecv(t, p, r, want)
		case <-timer.C:
			t.Fatalf("Send %d: no CQ.Wait of the %d asleep returned within %v", i+1, len(waits), timeout)
		}
	}
	for i := range 2 {
		expectSendWC(t, waitOne(t, p.B, SendCQ), uint64(i+1), verbs.WCSend, p.B.QPNum(0))
	}
}

// testWaitBurst: two goroutines asleep in CQ.Wait on one CQ, each taking
// one completion at a time, and two completions that arrive together
// (two Sends in one PostSend): both goroutines return. The notification
// of the first wakes one of them; the second arrives while the CQ is
// disarmed and fires nothing, so the woken one must see that the other
// is woken too.
func testWaitBurst(t *testing.T, h Harness) {
	p, src, dst := sendPair(t, h)
	postRecv(t, p.A, 0, recvWR(10, dst.SGE(0, 64)))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res := make(chan waitResult, 2)
	for range 2 {
		go func() {
			wc := make([]verbs.WorkCompletion, 1)
			n, err := p.A.RecvCQ.Wait(ctx, wc)
			res <- waitResult{n, err, wc[0]}
		}()
	}
	parkedInWait(t, 2)
	postSend(t, p.B, 0, sendWR(1, src.SGE(0, 16)), sendWR(2, src.SGE(0, 16)))
	got := map[uint64]bool{}
	for range 2 {
		r := <-res
		if r.err != nil || r.n != 1 {
			t.Fatalf("CQ.Wait returned %d completions, error %v, with %d completion(s) left in the CQ; want 1",
				r.n, r.err, p.A.RecvCQ.Poll(make([]verbs.WorkCompletion, 4)))
		}
		expectRecvWC(t, r.wc, r.wc.WRID, verbs.WCRecv, 16, p.A.QPNum(0))
		got[r.wc.WRID] = true
	}
	if !got[9] || !got[10] {
		t.Fatalf("the two waiters took receives %v, want 9 and 10", got)
	}
	for i := range 2 {
		expectSendWC(t, waitOne(t, p.B, SendCQ), uint64(i+1), verbs.WCSend, p.B.QPNum(0))
	}
}

// expectOneRecv checks that a background Wait returned the receive of
// wrid, 16 bytes.
func expectOneRecv(t testing.TB, p *Pair, r waitResult, wrid uint64) {
	t.Helper()
	if r.err != nil || r.n != 1 {
		t.Fatalf("CQ.Wait returned %d completions, error %v; want 1", r.n, r.err)
	}
	expectRecvWC(t, r.wc, wrid, verbs.WCRecv, 16, p.A.QPNum(0))
}

// testWaitContextClosed: a goroutine asleep in CQ.Wait returns ErrClosed
// when the CQ's device context is closed.
func testWaitContextClosed(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	ctx, err := verbs.Open(p.A.Ctx.Device().Name)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(16)
	if err != nil {
		ctx.Close()
		t.Fatal(err)
	}
	expectWaitEndsClosed(t, cq, ctx.Close, "its context's closing")
}

// testWaitDestroyed: a goroutine asleep in CQ.Wait returns ErrClosed when
// the CQ is destroyed.
func testWaitDestroyed(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	cq, err := p.A.Ctx.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	expectWaitEndsClosed(t, cq, cq.Destroy, "the CQ's destruction")
}

// expectWaitEndsClosed checks that a goroutine asleep in CQ.Wait on cq
// returns ErrClosed once end (what) has run.
func expectWaitEndsClosed(t *testing.T, cq *verbs.CQ, end func() error, what string) {
	t.Helper()
	res := make(chan error, 1)
	go func() {
		_, err := cq.Wait(context.Background(), make([]verbs.WorkCompletion, 1))
		res <- err
	}()
	parkedInWait(t, 1)
	if err := end(); err != nil {
		t.Fatalf("%s, with a goroutine in CQ.Wait: %v", what, err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-res:
		if !errors.Is(err, verbs.ErrClosed) {
			t.Fatalf("CQ.Wait after %s returned %v, want ErrClosed", what, err)
		}
	case <-timer.C:
		t.Fatalf("CQ.Wait did not return within %v of %s", timeout, what)
	}
}

// testEventDriven: the completion channel drives reception: arm with
// ReqNotify(false), the peer sends, the token arrives, Poll finds the
// message, N times in a row.
func testEventDriven(t *testing.T, h Harness) {
	const msgs = 8
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.B, 8*msgs, localRW)
	data := pattern(52, 8*msgs)
	fill(t, p.B, src, 0, data)
	dst := newRegion(t, p.A, 8*msgs, localRW)
	var recvs []verbs.RecvWR
	for i := range msgs {
		recvs = append(recvs, recvWR(uint64(100+i), dst.SGE(8*i, 8)))
	}
	postRecv(t, p.A, 0, recvs...)
	cq := p.A.RecvCQ
	wc := make([]verbs.WorkCompletion, 4)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for i := range msgs {
		if n := cq.Poll(wc); n != 0 {
			t.Fatalf("receive CQ holds %s before message %d was sent", fmtWCs(wc[:n]), i)
		}
		if err := cq.ReqNotify(false); err != nil {
			t.Fatalf("ReqNotify: %v", err)
		}
		postSend(t, p.B, 0, sendWR(uint64(1+i), src.SGE(8*i, 8)))
		select {
		case <-cq.Notify():
		case <-timer.C:
			t.Fatalf("no notification for message %d within %v", i, timeout)
		}
		n := cq.Poll(wc)
		if n != 1 {
			t.Fatalf("after the notification for message %d Poll returned %d completions: %s", i, n, fmtWCs(wc[:n]))
		}
		expectRecvWC(t, wc[0], uint64(100+i), verbs.WCRecv, 8, p.A.QPNum(0))
	}
	expectBytes(t, p.A, dst, 0, data, "messages received by events")
	expectStatuses(t, wait(t, p.B, SendCQ, msgs), verbs.WCSuccess, 1, 2, 3, 4, 5, 6, 7, 8)
}

// testPollEmpty: Poll into a slice of no length — nil, or one with room
// behind it — takes nothing, with a completion ready, and leaves it for
// the next Poll; on a send CQ (a Write's completion) and on a receive CQ
// (a Send's).
func testPollEmpty(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 8, localRW)
	fill(t, p.A, src, 0, pattern(53, 8))
	dst := newRegion(t, p.B, 8, remoteAll)
	bsrc := newRegion(t, p.B, 8, localRW)
	fill(t, p.B, bsrc, 0, pattern(54, 8))
	adst := newRegion(t, p.A, 8, localRW)
	postRecv(t, p.A, 0, recvWR(9, adst.SGE(0, 8)))
	for _, c := range []struct {
		kind string
		cq   *verbs.CQ
		post func()
		want func(wc verbs.WorkCompletion)
	}{
		{"send", p.A.SendCQ, func() { postSend(t, p.A, 0, writeWR(1, dst, 0, src.SGE(0, 8))) },
			func(wc verbs.WorkCompletion) { expectSendWC(t, wc, 1, verbs.WCRDMAWrite, p.A.QPNum(0)) }},
		{"receive", p.A.RecvCQ, func() { postSend(t, p.B, 0, sendWR(2, bsrc.SGE(0, 8))) },
			func(wc verbs.WorkCompletion) { expectRecvWC(t, wc, 9, verbs.WCRecv, 8, p.A.QPNum(0)) }},
	} {
		if err := c.cq.ReqNotify(false); err != nil {
			t.Fatalf("ReqNotify on the %s CQ: %v", c.kind, err)
		}
		c.post()
		timer := time.NewTimer(timeout)
		select {
		case <-c.cq.Notify():
		case <-timer.C:
			t.Fatalf("no notification of the %s CQ within %v", c.kind, timeout)
		}
		timer.Stop()
		wc := make([]verbs.WorkCompletion, 4)
		if n := pollEmpty(t, c.cq, nil, c.kind+" CQ's Poll(nil)"); n != 0 {
			t.Fatalf("the %s CQ's Poll(nil), with a completion ready, returned %d", c.kind, n)
		}
		if n := pollEmpty(t, c.cq, wc[:0], c.kind+" CQ's Poll(wc[:0])"); n != 0 {
			t.Fatalf("the %s CQ's Poll(wc[:0]), with a completion ready, returned %d", c.kind, n)
		}
		n := c.cq.Poll(wc)
		if n != 1 {
			t.Fatalf("after the polls into empty slices the %s CQ's Poll returned %d completions, want the 1 they left: %s", c.kind, n, fmtWCs(wc[:n]))
		}
		c.want(wc[0])
	}
	expectStatuses(t, wait(t, p.B, SendCQ, 1), verbs.WCSuccess, 2)
}

// pollEmpty returns cq.Poll(wc), called in a goroutine of its own. A
// provider that panics there may have left its CQ's lock held, which the
// pair's teardown (in the test's cleanup) would then wait for until the
// test binary times out: the panic is raised again in that goroutine,
// which ends the test binary at once, saying what failed (the trace
// printed goes on through the provider's Poll).
func pollEmpty(t testing.TB, cq *verbs.CQ, wc []verbs.WorkCompletion, what string) int {
	res := make(chan int, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				panic(fmt.Sprintf("verbstest: %s: %s, with a completion ready, panicked: %v", t.Name(), what, r))
			}
		}()
		res <- cq.Poll(wc)
	}()
	return <-res
}

// pollOne busy-polls cq for one completion, without arming it.
func pollOne(t testing.TB, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 1)
	for deadline := time.Now().Add(timeout); cq.Poll(wc) == 0; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("no completion within %v", timeout)
		}
	}
	return wc[0]
}

// testSolicitedOnlySendErrors: a send CQ armed for solicited
// completions only stays quiet for a successful Write and is notified of
// a failed one (ibv_req_notify_cq(3): solicited or unsuccessful).
func testSolicitedOnlySendErrors(t *testing.T, h Harness) {
	p, src, dst, _ := writePair(t, h, PairOptions{}, 2)
	cq := p.A.SendCQ
	if err := cq.ReqNotify(true); err != nil {
		t.Fatalf("ReqNotify(solicited only): %v", err)
	}
	postSend(t, p.A, 0, writeWR(1, dst, 0, src.SGE(0, 8)))
	expectSendWC(t, pollOne(t, cq), 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	quiet := time.NewTimer(shortWait)
	defer quiet.Stop()
	select {
	case <-cq.Notify():
		t.Fatal("a send CQ armed for solicited events only was notified of a successful Write")
	case <-quiet.C:
	}
	sge := src.SGE(8, 8)
	sge.LKey = badKey(sge.LKey) // a local error: every device completes it so
	bad := writeWR(2, dst, 8, sge)
	postSend(t, p.A, 0, bad)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-cq.Notify():
	case <-timer.C:
		t.Fatalf("no notification within %v of a failed Write on a send CQ armed for solicited events", timeout)
	}
	wc := pollOne(t, cq)
	expectStatus(t, wc, 2, verbs.WCLocProtErr)
}
