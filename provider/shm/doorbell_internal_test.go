package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// A take returns every valid bell rung since the last, once, across
// words and summary words, and clears the others unreported.
func TestDoorbellsTakeWhatRang(t *testing.T) {
	mem := make([]byte, cqSegSize)
	d := viewDoorbells(mem)
	rung := []uint32{0, 5, 63, 64, 4095, 4096, bellBits - 1}
	var valid [bellWords]uint64
	for _, b := range rung {
		valid[b/64] |= 1 << (b % 64)
		d.ring(b)
	}
	d.ring(5) // twice: once in the take
	d.ring(6) // of no QP
	var got []uint32
	if !d.take(&valid, func(b uint32) { got = append(got, b) }) {
		t.Fatal("take found no bell rung")
	}
	slices.Sort(got)
	if !slices.Equal(got, rung) {
		t.Fatalf("took %v, rang %v", got, rung)
	}
	if d.take(&valid, func(b uint32) { t.Errorf("bell %d taken twice", b) }) {
		t.Fatal("a second take found bells")
	}
	valid[0] |= 1 << 6
	if d.take(&valid, func(b uint32) { t.Errorf("bell %d, of no QP when it rang, taken later", b) }) {
		t.Fatal("a take found a bell cleared before")
	}
	if short := viewDoorbells(mem[:cqSegSize-1]); short.words != nil {
		t.Fatal("a segment too short for the doorbells gave a view of them")
	}
	doorbells{}.ring(3) // the zero doorbells ring nothing, and do not crash
}

// The queue holds each QP once; a bell queues every QP it stands for;
// with no bell rung, every bellSweep-th refill queues every QP.
func TestRecvBellsQueueAndSweep(t *testing.T) {
	mem := make([]byte, cqSegSize)
	d := viewDoorbells(mem)
	// QPs 0 and 3 share a bell (numbers bellBits apart).
	qps := []*qp{{qpCold: &qpCold{num: 7}}, {qpCold: &qpCold{num: 8}}, {qpCold: &qpCold{num: 9}}, {qpCold: &qpCold{num: 7 + bellBits}}}
	var r recvBells
	r.reset(qps)
	var popped []int32
	for k, ok := r.pop(); ok; k, ok = r.pop() {
		popped = append(popped, k)
	}
	if !slices.Equal(popped, []int32{0, 1, 2, 3}) {
		t.Fatalf("after reset the queue held %v, want every QP once", popped)
	}
	d.ring(bellOf(9))
	d.ring(bellOf(7))
	if !r.refill(d) {
		t.Fatal("refill found none of the bells rung")
	}
	popped = popped[:0]
	for k, ok := r.pop(); ok; k, ok = r.pop() {
		popped = append(popped, k)
	}
	slices.Sort(popped)
	if !slices.Equal(popped, []int32{0, 2, 3}) {
		t.Fatalf("bells of QPs 9 and 7 queued %v, want positions 0, 2 and 3", popped)
	}
	r.push(1)
	r.push(1)
	if k, ok := r.pop(); !ok || k != 1 {
		t.Fatalf("pop gave %d, %v; want 1", k, ok)
	}
	if _, ok := r.pop(); ok {
		t.Fatal("a QP pushed twice was queued twice")
	}
	for i := 1; i < bellSweep; i++ {
		if r.refill(d) {
			t.Fatalf("refill %d queued QPs with no bell rung", i)
		}
	}
	if !r.refill(d) || r.n != len(qps) {
		t.Fatalf("the sweep queued %d QPs, want %d", r.n, len(qps))
	}
	for _, ok := r.pop(); ok; _, ok = r.pop() {
	}
	d.ring(bellOf(100)) // no QP's
	if r.refill(d) {
		t.Fatalf("a bell of no QP queued %d QPs", r.n)
	}
}

// A CQ shared by more QPs than bellMinQPs takes every QP's receive
// completions, those its peers write and those it flushes itself, with
// the WRID and QP each belongs to, at the first poll after they are
// written: their doorbells say where they are (the sweep of every QP,
// bellSweep empty polls apart, is not what finds them).
func TestSharedCQTakesReceivesOfManyQPs(t *testing.T) {
	const nQPs = bellMinQPs + 5
	addr := fmt.Sprintf("shm://@goverbs-test-bells-%d", os.Getpid())
	_, spd, scq := openShm(t)
	_, cpd, ccq := openShm(t)
	inbox := allocMR(t, spd, 8*nQPs, verbs.AccessLocalWrite)
	outbox := allocMR(t, cpd, 8*nQPs, verbs.AccessLocalWrite)
	l, err := cm.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	type pair struct{ s, c *verbs.QP }
	pairs := make([]pair, nQPs)
	accepted := make(chan error, 1)
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for i := range pairs {
			req, err := l.Accept(ctx)
			if err != nil {
				accepted <- err
				return
			}
			qp, err := smallQP(spd, scq)
			if err == nil {
				pairs[i].s = qp
				err = toInit(qp)
			}
			if err == nil {
				_, err = qp.PostRecv([]verbs.RecvWR{recv(uint64(100+i), inbox.SGE(8*i, 8))})
			}
			if err == nil {
				_, err = req.Accept(qp, nil)
			}
			if err != nil {
				req.Reject(nil)
				accepted <- err
				return
			}
		}
		accepted <- nil
	}()
	var conns []*cm.Conn
	defer func() {
		cancel()
		l.Close()
		<-acceptDone
		for _, c := range conns {
			c.Close()
		}
		for _, p := range pairs {
			for _, q := range []*verbs.QP{p.c, p.s} {
				if q != nil {
					q.Destroy()
				}
			}
		}
	}()
	for i := range pairs {
		qp, err := smallQP(cpd, ccq)
		if err != nil {
			t.Fatal(err)
		}
		pairs[i].c = qp
		conn, err := cm.Dial(ctx, addr, qp, nil)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}

	// The QPs' first look at their rings (after they joined the CQ)
	// finds nothing.
	wc := make([]verbs.WorkCompletion, 4)
	if n := scq.Poll(wc); n != 0 {
		t.Fatalf("%d completions before anything was sent", n)
	}
	// Every client QP but the last sends, the last first. A Send
	// completes once the receiver's completion is written.
	for i := nQPs - 2; i >= 0; i-- {
		binary.NativeEndian.PutUint64(outbox.Bytes()[8*i:], uint64(1000+i))
		if _, err := pairs[i].c.PostSend([]verbs.SendWR{send(uint64(i), outbox.SGE(8*i, 8))}); err != nil {
			t.Fatal(err)
		}
	}
	for sent := 0; sent < nQPs-1; {
		n := ccq.Poll(wc)
		for _, w := range wc[:n] {
			if w.Status != verbs.WCSuccess {
				t.Fatalf("send completion %+v", w)
			}
		}
		if sent += n; ctx.Err() != nil {
			t.Fatalf("%d of %d Sends completed", sent, nQPs-1)
		}
	}
	seen := map[uint64]bool{}
	for len(seen) < nQPs-1 {
		n := scq.Poll(wc[:1])
		if n == 0 {
			t.Fatalf("an empty poll with %d of %d receive completions taken", len(seen), nQPs-1)
		}
		for _, w := range wc[:n] {
			i := int(w.WRID) - 100
			switch {
			case w.Status != verbs.WCSuccess || w.Opcode != verbs.WCRecv:
				t.Fatalf("receive completion %+v", w)
			case i < 0 || i >= nQPs-1 || seen[w.WRID]:
				t.Fatalf("receive completion of WR %d, not one of those sent to, or twice", w.WRID)
			case w.QPNum != pairs[i].s.Num():
				t.Fatalf("WR %d completed for QP %d, posted to QP %d", w.WRID, w.QPNum, pairs[i].s.Num())
			}
			if got := binary.NativeEndian.Uint64(inbox.Bytes()[8*i:]); got != uint64(1000+i) {
				t.Fatalf("QP %d received %d, sent %d", i, got, 1000+i)
			}
			seen[w.WRID] = true
		}
	}
	// The last QP's receive, never consumed, is flushed by this process
	// when the QP moves to the error state.
	last := pairs[nQPs-1].s
	if err := last.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if n := scq.Poll(wc[:1]); n != 1 || wc[0].Status != verbs.WCWRFlushErr || wc[0].WRID != uint64(100+nQPs-1) || wc[0].QPNum != last.Num() {
		t.Fatalf("poll after the flush: %d completions, %+v; want WR %d of QP %d flushed", n, wc[0], 100+nQPs-1, last.Num())
	}
}
