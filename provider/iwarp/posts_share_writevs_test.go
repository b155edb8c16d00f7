package iwarp_test

import (
	"context"
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// streamPair connects two tcp0 QPs whose send queues hold 256 WRs, each
// with a send CQ and a receive CQ of its own, and waits for a Write from
// a to complete: a's stream is open, its send queue empty.
func streamPair(t *testing.T) (a, b *pairEnd) {
	t.Helper()
	a, b, _ = streamPairConn(t)
	return a, b
}

// streamPairConn is streamPair that also returns a's connection.
func streamPairConn(t *testing.T) (a, b *pairEnd, ca *cm.Conn) {
	t.Helper()
	// The tests decide when they poll and post: a post may be left
	// however long ago the last poll and post were, unless a test
	// narrows these again.
	t.Cleanup(iwarp.SetLeaveWindow(time.Hour))
	t.Cleanup(iwarp.SetLeaveGap(time.Hour))
	qpCap := verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, b = openEnd(t, 1024, true, qpCap, 1<<16), openEnd(t, 1024, true, qpCap, 1<<16)
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ca, _ = connectQPs(t, l, l.Addr(), a.qp, b.qp, nil, nil)
	if _, err := a.qp.PostSend([]verbs.SendWR{write8(a, b, 0, 0, verbs.SendSignaled)}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(t, 1); wc[0].Status != verbs.WCSuccess {
		t.Fatalf("first Write: %+v", wc[0])
	}
	return a, b, ca
}

// write8 is an 8-byte RDMA Write from a's offset off to b's offset off.
func write8(a, b *pairEnd, id uint64, off int, flags verbs.SendFlags) verbs.SendWR {
	return verbs.SendWR{WRID: id, Opcode: verbs.OpRDMAWrite, Flags: flags,
		SGList: []verbs.SGE{a.mr.SGE(off, 8)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()}
}

// deepen posts sixteen signaled Writes from a and waits for their
// completions to reach a's CQ, where they stay unpolled: a's send queue
// is deep, and nothing is under way.
func deepen(t *testing.T, a, b *pairEnd) {
	t.Helper()
	for i := range 16 {
		if _, err := a.qp.PostSend([]verbs.SendWR{write8(a, b, uint64(i), 8*i, verbs.SendSignaled)}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); iwarp.SendCQHeld(a.qp.Driver()) != 16; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the first sixteen Writes completed", iwarp.SendCQHeld(a.qp.Driver()))
		}
	}
}

// TestStreamOfSinglePostsSharesWritevs posts a stream of 8-byte Writes
// one per PostSend, polling only for the signaled one in 32, and checks
// that they went out several to a writev and all arrived.
func TestStreamOfSinglePostsSharesWritevs(t *testing.T) {
	a, b := streamPair(t)
	writes, restore := iwarp.CountSocketWrites(a.qp.Driver(), b.qp.Driver())
	const n, every, window = 2048, 32, 128
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 8)
	done := 0
	for posted := 0; done < n; {
		for posted < n && posted-done < window {
			off := 8 * (posted % 4096)
			binary.LittleEndian.PutUint64(a.mr.Bytes()[off:], uint64(posted)+1)
			flags := verbs.SendFlags(0)
			if (posted+1)%every == 0 {
				flags = verbs.SendSignaled
			}
			if _, err := a.qp.PostSend([]verbs.SendWR{write8(a, b, uint64(posted), off, flags)}); err != nil {
				t.Fatalf("post %d: %v", posted, err)
			}
			posted++
		}
		k, err := a.cq.Wait(ctx, wc)
		if err != nil {
			t.Fatalf("%d of %d Writes completed: %v", done, n, err)
		}
		for _, c := range wc[:k] {
			if c.Status != verbs.WCSuccess {
				t.Fatalf("completion %+v", c)
			}
			done = int(c.WRID) + 1
		}
	}
	restore()
	for i := range n {
		if got := binary.LittleEndian.Uint64(b.mr.Bytes()[8*i:]); got != uint64(i)+1 {
			t.Fatalf("Write %d left %d at the peer", i, got)
		}
	}
	// One writev per coalesceMax Writes, and the confirming Reads' and
	// the flushes by polls between: far fewer than one per Write.
	if w := writes(); w > n/4 {
		t.Fatalf("%d Writes posted one at a time went out in %d writevs, want at most %d", n, w, n/4)
	}
}

// sendGoesOutAtOnce posts an 8-byte Send from a to b and checks that it
// was not left for a later writev and that b receives it.
func sendGoesOutAtOnce(t *testing.T, a, b *pairEnd) {
	t.Helper()
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{b.mr.SGE(4096, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{WRID: 50, Opcode: verbs.OpSend, SGList: []verbs.SGE{a.mr.SGE(8192, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if iwarp.LeftForLater(a.qp.Driver()) {
		t.Fatal("it was left for a later writev")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]verbs.WorkCompletion
	if _, err := b.rcq.Wait(ctx, wc[:]); err != nil || wc[0].Status != verbs.WCSuccess {
		t.Fatalf("the Send did not arrive: %+v, %v", wc[0], err)
	}
}

// TestPostGoesOutAtOnce checks that a WR is written at once, not left
// for a later writev, when it is larger than 4 KiB (its copies cost more
// than a system call), when the send queue holds few WRs (a ping-pong, or
// a request, waits for nobody), when one of the QP's CQs is armed (an
// application may sleep on it, waiting for the answer), and when it is a
// Read or an atomic, whose rate the responder's ORD slots bound.
func TestPostGoesOutAtOnce(t *testing.T) {
	t.Run("shallow queue", func(t *testing.T) {
		a, b := streamPair(t)
		for i := range 15 {
			if _, err := a.qp.PostSend([]verbs.SendWR{write8(a, b, uint64(i), 8*i, 0)}); err != nil {
				t.Fatal(err)
			}
			if iwarp.LeftForLater(a.qp.Driver()) {
				t.Fatalf("post %d, into a queue of %d WRs, was left for a later writev", i, i)
			}
		}
	})
	for _, armed := range []string{"send", "receive"} {
		// An application may be asleep on the armed CQ, waiting for the
		// answer to what is posted now.
		t.Run("deep queue, its "+armed+" CQ armed", func(t *testing.T) {
			defer iwarp.SetLeftBackstop(time.Hour)()
			a, b := streamPair(t)
			deepen(t, a, b)
			cq := a.cq
			if armed == "receive" {
				cq = a.rcq
			}
			if err := cq.ReqNotify(false); err != nil {
				t.Fatal(err)
			}
			sendGoesOutAtOnce(t, a, b)
		})
	}
	for _, c := range []struct {
		name        string
		window, gap time.Duration
	}{
		{"no poll of its CQs lately", time.Nanosecond, time.Hour},
		{"a post long after the previous", time.Hour, time.Nanosecond},
	} {
		// A writer that posts now and then, or that does not poll,
		// would leave each post to the timer.
		t.Run(c.name, func(t *testing.T) {
			defer iwarp.SetLeftBackstop(time.Hour)()
			a, b := streamPair(t)
			deepen(t, a, b)
			defer iwarp.SetLeaveWindow(c.window)()
			defer iwarp.SetLeaveGap(c.gap)()
			// The first post that may be left after a poll notes the
			// time of that poll: one Write before the Send.
			if _, err := a.qp.PostSend([]verbs.SendWR{write8(a, b, 16, 128, 0)}); err != nil {
				t.Fatal(err)
			}
			sendGoesOutAtOnce(t, a, b)
		})
	}
	t.Run("a Write of more than 4 KiB into a deep queue", func(t *testing.T) {
		a, b := streamPair(t)
		deepen(t, a, b)
		wr := write8(a, b, 16, 0, 0)
		wr.SGList[0].Length = 4<<10 + 1
		if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
			t.Fatal(err)
		}
		if iwarp.LeftForLater(a.qp.Driver()) {
			t.Fatal("it was left for a later writev")
		}
	})
	for _, op := range []verbs.Opcode{verbs.OpRDMARead, verbs.OpAtomicFetchAndAdd} {
		t.Run(op.String()+" into a deep queue", func(t *testing.T) {
			a, b := streamPair(t)
			for i := range 32 {
				if _, err := a.qp.PostSend([]verbs.SendWR{write8(a, b, uint64(i), 8*i, 0)}); err != nil {
					t.Fatal(err)
				}
			}
			// The last sixteen were left: a poll sends them.
			var scratch [4]verbs.WorkCompletion
			for deadline := time.Now().Add(10 * time.Second); iwarp.LeftForLater(a.qp.Driver()); a.rcq.Poll(scratch[:]) {
				if time.Now().After(deadline) {
					t.Fatal("the Writes left were not sent")
				}
			}
			wr := write8(a, b, 32, 256, verbs.SendSignaled)
			wr.Opcode = op
			if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			if iwarp.LeftForLater(a.qp.Driver()) {
				t.Fatal("it was left for a later writev")
			}
		})
	}
}

// TestLeftPostIsSent leaves a Write with immediate data in a deep send
// queue and checks that each of the ways the transmitter is told sends
// it: a Poll of either of the QP's CQs, an application about to sleep on
// one (ReqNotify), and, when the application does none of these, the
// timer. The peer's receive completion shows that it arrived.
func TestLeftPostIsSent(t *testing.T) {
	for _, way := range []string{"send CQ poll", "receive CQ poll", "ReqNotify", "timer"} {
		t.Run(way, func(t *testing.T) {
			// Only the way tested sends it: the timer, too, only once
			// the post is seen left.
			defer iwarp.SetLeftBackstop(time.Hour)()
			a, b := streamPair(t)
			if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 99, SGList: []verbs.SGE{b.mr.SGE(0, 8)}}}); err != nil {
				t.Fatal(err)
			}
			deepen(t, a, b)
			imm := verbs.SendWR{WRID: 16, Opcode: verbs.OpRDMAWriteWithImm, Imm: 0x5eed,
				SGList: []verbs.SGE{a.mr.SGE(512, 8)}, RemoteAddr: b.mr.Addr() + 512, RKey: b.mr.RKey()}
			if _, err := a.qp.PostSend([]verbs.SendWR{imm}); err != nil {
				t.Fatal(err)
			}
			if left := iwarp.PostsLeft(a.qp.Driver()); left != 1 || !iwarp.LeftForLater(a.qp.Driver()) {
				t.Fatalf("%d WRs left in the queue (for a later writev: %v), want the one posted last", left, iwarp.LeftForLater(a.qp.Driver()))
			}
			var scratch [32]verbs.WorkCompletion
			switch way {
			case "send CQ poll":
				a.cq.Poll(scratch[:])
			case "receive CQ poll":
				a.rcq.Poll(scratch[:])
			case "ReqNotify":
				if err := a.rcq.ReqNotify(false); err != nil {
					t.Fatal(err)
				}
			case "timer":
				iwarp.ArmLazyTimer(a.qp.Driver(), time.Microsecond)
			}
			if way != "timer" && iwarp.LeftForLater(a.qp.Driver()) {
				t.Fatalf("the Write left in the queue was not sent by the %s", way)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var wc [1]verbs.WorkCompletion
			if _, err := b.rcq.Wait(ctx, wc[:]); err != nil {
				t.Fatalf("the Write left in the queue did not arrive: %v", err)
			}
			if wc[0].Status != verbs.WCSuccess || wc[0].Opcode != verbs.WCRecvRDMAWithImm || wc[0].Imm != 0x5eed {
				t.Fatalf("receive completion %+v", wc[0])
			}
		})
	}
}

// leaveWrites makes a's send queue deep (deepen) and leaves k signaled
// 8-byte Writes in it, WRIDs 100 on, each from a's offset 1024+8i to the
// same offset of b, carrying 1000+i.
func leaveWrites(t *testing.T, a, b *pairEnd, k int) {
	t.Helper()
	deepen(t, a, b)
	for i := range k {
		off := 1024 + 8*i
		binary.LittleEndian.PutUint64(a.mr.Bytes()[off:], uint64(1000+i))
		if _, err := a.qp.PostSend([]verbs.SendWR{write8(a, b, uint64(100+i), off, verbs.SendSignaled)}); err != nil {
			t.Fatal(err)
		}
	}
	if got := iwarp.PostsLeft(a.qp.Driver()); got != uint64(k) || !iwarp.LeftForLater(a.qp.Driver()) {
		t.Fatalf("%d Writes left (for a later writev: %v), want %d", got, iwarp.LeftForLater(a.qp.Driver()), k)
	}
}

// TestLeftPostsFlushWhenTheQPFails moves a QP with Writes left in its
// queue to the error state: they complete flushed, in order, after those
// that went out.
func TestLeftPostsFlushWhenTheQPFails(t *testing.T) {
	defer iwarp.SetLeftBackstop(time.Hour)()
	a, b := streamPair(t)
	leaveWrites(t, a, b, 5)
	if err := a.qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	for i, c := range a.wait(t, 21) {
		want, id := verbs.WCSuccess, uint64(i)
		if i >= 16 {
			want, id = verbs.WCWRFlushErr, uint64(100+i-16)
		}
		if c.Status != want || c.WRID != id {
			t.Fatalf("completion %d: %+v, want WRID %d, %v", i, c, id, want)
		}
	}
}

// TestLeftPostSurvivesARefusedPost posts a WR that PostSend refuses
// after one left in the queue: the left one still goes out and lands.
func TestLeftPostSurvivesARefusedPost(t *testing.T) {
	defer iwarp.SetLeftBackstop(time.Hour)()
	a, b := streamPair(t)
	leaveWrites(t, a, b, 1)
	bad := write8(a, b, 999, 0, 0)
	bad.SGList = []verbs.SGE{a.mr.SGE(0, 8), a.mr.SGE(8, 8)} // more SGEs than MaxSendSGE
	if _, err := a.qp.PostSend([]verbs.SendWR{bad}); err == nil {
		t.Fatal("a WR with too many SGEs was taken")
	}
	if wc := a.wait(t, 17)[16]; wc.WRID != 100 || wc.Status != verbs.WCSuccess {
		t.Fatalf("the left Write completed %+v", wc)
	}
	if got := binary.LittleEndian.Uint64(b.mr.Bytes()[1024:]); got != 1000 {
		t.Fatalf("the peer holds %d, want 1000", got)
	}
}

// TestPollOfASharedCQSendsEveryQPsLeftPosts leaves a Write in the queue
// of each of six QPs that share their CQs (the receive CQ, of more than
// four QPs, has a receiver of its own): polling the send CQ sends them
// all.
func TestPollOfASharedCQSendsEveryQPsLeftPosts(t *testing.T) {
	defer iwarp.SetLeftBackstop(time.Hour)()
	defer iwarp.SetLeaveWindow(time.Hour)()
	defer iwarp.SetLeaveGap(time.Hour)()
	const n = 6
	qpCap := verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	a := openEnd(t, 4096, true, qpCap, 1<<16)
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	qps := []*verbs.QP{a.qp}
	for range n - 1 {
		q, err := a.pd.CreateQP(verbs.QPInitAttr{SendCQ: a.cq, RecvCQ: a.rcq, Cap: qpCap})
		if err != nil {
			t.Fatal(err)
		}
		qps = append(qps, q)
	}
	peers := make([]*pairEnd, n)
	for j, q := range qps {
		peers[j] = openEnd(t, 1024, true, qpCap, 1<<16)
		connectQPs(t, l, l.Addr(), q, peers[j].qp, nil, nil)
		for i := range 16 {
			if _, err := q.PostSend([]verbs.SendWR{write8(a, peers[j], uint64(i), 8*i, verbs.SendSignaled)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for deadline := time.Now().Add(10 * time.Second); iwarp.SendCQHeld(a.qp.Driver()) != 16*n; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the first %d Writes completed", iwarp.SendCQHeld(a.qp.Driver()), 16*n)
		}
	}
	for j, q := range qps {
		if _, err := q.PostSend([]verbs.SendWR{write8(a, peers[j], 100, 1024, verbs.SendSignaled)}); err != nil {
			t.Fatal(err)
		}
		if !iwarp.LeftForLater(q.Driver()) {
			t.Fatalf("QP %d: the Write was not left for a later writev", j)
		}
	}
	seen := 0
	for _, c := range a.wait(t, 17*n) {
		if c.Status != verbs.WCSuccess {
			t.Fatalf("completion %+v", c)
		}
		if c.WRID == 100 {
			seen++
		}
	}
	if seen != n {
		t.Fatalf("%d of the %d left Writes completed", seen, n)
	}
}

// TestSendPostedBeforeCloseArrives leaves a Send for a later writev and
// closes the connection at once: the Send was posted before the
// disconnect, so it goes out, and the peer receives it.
func TestSendPostedBeforeCloseArrives(t *testing.T) {
	defer iwarp.SetLeftBackstop(time.Hour)()
	a, b, ca := streamPairConn(t)
	deepen(t, a, b)
	binary.LittleEndian.PutUint64(a.mr.Bytes()[8192:], 0xc105e)
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{b.mr.SGE(4096, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{WRID: 50, Opcode: verbs.OpSend, SGList: []verbs.SGE{a.mr.SGE(8192, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if !iwarp.LeftForLater(a.qp.Driver()) {
		t.Fatal("the Send was not left for a later writev")
	}
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]verbs.WorkCompletion
	if _, err := b.rcq.Wait(ctx, wc[:]); err != nil || wc[0].Status != verbs.WCSuccess {
		t.Fatalf("the Send posted before Close did not arrive: %+v, %v", wc[0], err)
	}
	if got := binary.LittleEndian.Uint64(b.mr.Bytes()[4096:]); got != 0xc105e {
		t.Fatalf("the peer received %#x, want 0xc105e", got)
	}
}
