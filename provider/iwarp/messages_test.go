package iwarp_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// pairEnd is one tcp0 QP of this process, with its PD, CQs and a
// region that grants every access.
type pairEnd struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ // the send CQ, and the receive CQ unless rcq is another
	rcq *verbs.CQ // the receive CQ
	qp  *verbs.QP
	mr  *verbs.MR
}

// openEnd opens tcp0 with a PD, a CQ of cqDepth for sends and receives
// (or one of each with twoCQs), a QP of capacity qpCap and a region of
// size bytes; the device closes when the test ends.
func openEnd(tb testing.TB, cqDepth int, twoCQs bool, qpCap verbs.QPCap, size int) *pairEnd {
	tb.Helper()
	e := &pairEnd{}
	var err error
	if e.ctx, err = verbs.Open("tcp0"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.ctx.Close() })
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		tb.Fatal(err)
	}
	if e.cq, err = e.ctx.CreateCQ(cqDepth); err != nil {
		tb.Fatal(err)
	}
	e.rcq = e.cq
	if twoCQs {
		if e.rcq, err = e.ctx.CreateCQ(cqDepth); err != nil {
			tb.Fatal(err)
		}
	}
	if e.qp, err = e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.rcq, Cap: qpCap}); err != nil {
		tb.Fatal(err)
	}
	if e.mr, err = e.pd.AllocMR(size, verbs.AccessLocalWrite|verbs.RemoteAccess); err != nil {
		tb.Fatal(err)
	}
	return e
}

// connectQPs connects a, dialling dialAddr, to b, accepting on l, with
// the parameters given (nil for the defaults); the connections close
// when the test ends. A failure names both sides' errors: a listener
// that drops the connection fails the dial with a bare EOF, and says why
// only to its Accept.
func connectQPs(tb testing.TB, l *cm.Listener, dialAddr string, a, b *verbs.QP, dial, accept *cm.Param) (ca, cb *cm.Conn) {
	tb.Helper()
	actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer acancel()
	done := make(chan error, 1)
	go func() {
		req, err := l.Accept(actx)
		if err == nil {
			cb, err = req.Accept(b, accept)
		}
		done <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca, err := cm.Dial(ctx, dialAddr, a, dial)
	if err != nil {
		acancel() // an Accept still waiting has nothing to wait for
		aerr := <-done
		if aerr == nil {
			cb.Close()
		}
		tb.Fatalf("dial %s: %v (the accepting side: %v)", dialAddr, err, aerr)
	}
	if err := <-done; err != nil {
		ca.Close()
		tb.Fatalf("accept: %v", err)
	}
	tb.Cleanup(func() {
		ca.Close()
		cb.Close()
	})
	return ca, cb
}

// connectMany connects n QPs of a to n of b: a's and b's own QPs and n-1
// more on each side, all of a side on its end's CQ, with qpCap; the QPs
// are destroyed and the connections closed when the test ends. Destroyed
// more QPs are made on each side with them and destroyed before
// connecting, so that the CQs have had more QPs than they keep. It
// returns both sides' QPs, in pairs, and a's connections.
func connectMany(tb testing.TB, a, b *pairEnd, n, destroyed int, qpCap verbs.QPCap) (aqps, bqps []*verbs.QP, aconns []*cm.Conn) {
	tb.Helper()
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	aqps, bqps = []*verbs.QP{a.qp}, []*verbs.QP{b.qp}
	var gone []*verbs.QP
	for i := range n - 1 + destroyed {
		for _, e := range []struct {
			end *pairEnd
			qps *[]*verbs.QP
		}{{a, &aqps}, {b, &bqps}} {
			qp, err := e.end.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.end.cq, RecvCQ: e.end.cq, Cap: qpCap})
			if err != nil {
				tb.Fatal(err)
			}
			if i >= n-1 {
				gone = append(gone, qp)
				continue
			}
			tb.Cleanup(func() { qp.Destroy() })
			*e.qps = append(*e.qps, qp)
		}
	}
	for _, qp := range gone {
		if err := qp.Destroy(); err != nil {
			tb.Fatal(err)
		}
	}
	aconns = make([]*cm.Conn, n)
	for i := range n {
		aconns[i], _ = connectQPs(tb, l, l.Addr(), aqps[i], bqps[i], nil, nil)
	}
	return aqps, bqps, aconns
}

// connectPair connects two QPs with the parameters given (nil for the
// defaults) and returns the dialling and the accepting side.
func connectPair(t *testing.T, size int, dial, accept *cm.Param) (a, b *pairEnd, ca, cb *cm.Conn) {
	t.Helper()
	qpCap := verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 16, MaxSendSGE: 4, MaxRecvSGE: 4}
	a, b = openEnd(t, 256, false, qpCap, size), openEnd(t, 256, false, qpCap, size)
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ca, cb = connectQPs(t, l, l.Addr(), a.qp, b.qp, dial, accept)
	return a, b, ca, cb
}

// wait collects n completions from e's CQ.
func (e *pairEnd) wait(t *testing.T, n int) []verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []verbs.WorkCompletion
	buf := make([]verbs.WorkCompletion, n)
	for len(out) < n {
		k, err := e.cq.Wait(ctx, buf[:n-len(out)])
		if err != nil {
			t.Fatalf("waiting for %d completions, got %+v: %v", n, out, err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

func fillPattern(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
}

// TestSegmentation sends messages much larger than an FPDU (made small
// here) across scatter/gather lists whose boundaries fall inside
// segments, and checks that they arrive byte-exact: a Send, an RDMA
// Write and an RDMA Read, each of an odd length.
func TestSegmentation(t *testing.T) {
	defer iwarp.SetMaxPayload(1000)()
	const n = 123457
	a, b, _, _ := connectPair(t, 1<<20, nil, nil)
	src := a.mr.Bytes()
	fillPattern(src[:n], 3)
	// The receive scatters over three SGEs of odd sizes.
	sizes := []int{777, 50001, n - 777 - 50001}
	var sg []verbs.SGE
	off := 0
	for i, s := range sizes {
		sg = append(sg, b.mr.SGE(200000+off+i*100, s))
		off += s
	}
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 9, SGList: sg}}); err != nil {
		t.Fatal(err)
	}
	// The Send gathers from two SGEs.
	send := verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 60000), a.mr.SGE(60000, n-60000)}}
	write := verbs.SendWR{WRID: 2, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, n)}, RemoteAddr: b.mr.Addr() + 500000, RKey: b.mr.RKey()}
	read := verbs.SendWR{WRID: 3, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(400000, 1001), a.mr.SGE(500000, n-1001)}, RemoteAddr: b.mr.Addr() + 500000, RKey: b.mr.RKey()}
	if _, err := a.qp.PostSend([]verbs.SendWR{send, write, read}); err != nil {
		t.Fatal(err)
	}
	for i, wc := range a.wait(t, 3) {
		if wc.Status != verbs.WCSuccess || wc.WRID != uint64(i+1) {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	rwc := b.wait(t, 1)[0]
	if rwc.Status != verbs.WCSuccess || rwc.ByteLen != n {
		t.Fatalf("receive completion %+v, want %d bytes", rwc, n)
	}
	var got []byte
	off = 0
	for i, s := range sizes {
		got = append(got, b.mr.Bytes()[200000+off+i*100:][:s]...)
		off += s
	}
	if !bytes.Equal(got, src[:n]) {
		t.Fatal("the Send did not arrive byte-exact across its segments and receive SGEs")
	}
	if !bytes.Equal(b.mr.Bytes()[500000:500000+n], src[:n]) {
		t.Fatal("the Write did not arrive byte-exact")
	}
	back := append(append([]byte(nil), a.mr.Bytes()[400000:401001]...), a.mr.Bytes()[500000:500000+n-1001]...)
	if !bytes.Equal(back, src[:n]) {
		t.Fatal("the Read did not come back byte-exact across its SGEs")
	}
}

// TestManyReadsOutstanding posts far more Reads than the ORD allows at
// once and checks that they all complete, in order, with the right data:
// the requester holds each Read until a slot of the ORD is free, and the
// responder (whose IRD matches) never sees too many.
func TestManyReadsOutstanding(t *testing.T) {
	for _, ord := range []uint8{1, 3, 16} {
		a, b, _, _ := connectPair(t, 1<<16, &cm.Param{InitiatorDepth: ord}, &cm.Param{ResponderResources: ord})
		fillPattern(b.mr.Bytes()[:4096], 11)
		var wrs []verbs.SendWR
		const reads = 40
		for i := range reads {
			wrs = append(wrs, verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{a.mr.SGE(8192+i*64, 64)}, RemoteAddr: b.mr.Addr() + uint64(i*64), RKey: b.mr.RKey()})
		}
		if _, err := a.qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
		for i, wc := range a.wait(t, reads) {
			if wc.Status != verbs.WCSuccess || wc.WRID != uint64(i) || wc.ByteLen != 64 {
				t.Fatalf("ORD %d: completion %d: %+v", ord, i, wc)
			}
		}
		if !bytes.Equal(a.mr.Bytes()[8192:8192+reads*64], b.mr.Bytes()[:reads*64]) {
			t.Fatalf("ORD %d: the Reads brought back the wrong bytes", ord)
		}
	}
}

// TestSendWithInvalidate checks Send with Invalidate: the receive
// completion reports the invalidated STag, and remote access with it then
// fails.
func TestSendWithInvalidate(t *testing.T) {
	a, b, _, _ := connectPair(t, 1<<16, nil, nil)
	target, err := b.pd.RegMR(b.mr.Bytes()[4096:8192], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{b.mr.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	send := verbs.SendWR{WRID: 1, Opcode: verbs.OpSendWithInv, Flags: verbs.SendSignaled, InvalidateRKey: target.RKey(),
		SGList: []verbs.SGE{a.mr.SGE(0, 16)}}
	if _, err := a.qp.PostSend([]verbs.SendWR{send}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(t, 1)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("Send with Invalidate: %+v", wc)
	}
	wc := b.wait(t, 1)[0]
	if wc.Status != verbs.WCSuccess || wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != target.RKey() {
		t.Fatalf("receive completion %+v: want WCWithInv and STag %#x", wc, target.RKey())
	}
	write := verbs.SendWR{WRID: 2, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 16)}, RemoteAddr: target.Addr(), RKey: target.RKey()}
	if _, err := a.qp.PostSend([]verbs.SendWR{write}); err != nil {
		t.Fatal(err)
	}
	if wc := a.wait(t, 1)[0]; wc.Status != verbs.WCRemAccessErr {
		t.Fatalf("Write with an invalidated STag: %v, want %v", wc.Status, verbs.WCRemAccessErr)
	}
}

// TestConnectionReset resets the connection under a QP with work
// outstanding: within a second its connection ends, the QP is in the
// error state, and every WR completes with a flush.
func TestConnectionReset(t *testing.T) {
	v := newVictim(t, 4)
	h := dialHostile(t, v, false, false, false)
	r := newRegion(t, v.e, 64, verbs.AccessLocalWrite)
	recvs := []verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{r.SGE(0, 32)}}, {WRID: 2, SGList: []verbs.SGE{r.SGE(32, 32)}}}
	if n, err := v.e.PostRecv(0, recvs); n != 2 {
		t.Fatal(err)
	}
	start := time.Now()
	h.nc.(*net.TCPConn).SetLinger(0) // close with a reset
	h.nc.Close()
	select {
	case <-v.conn.Done():
	case <-time.After(time.Second):
		t.Fatal("the connection did not end within a second of a reset")
	}
	wcs, err := v.e.Completions(1, 2, time.Second)
	if err != nil || len(wcs) != 2 || wcs[0].Status != verbs.WCWRFlushErr || wcs[1].Status != verbs.WCWRFlushErr {
		t.Fatalf("completions %+v, %v: want both receives flushed", wcs, err)
	}
	if s, _ := v.e.QPState(0); s != verbs.QPSErr {
		t.Fatalf("QP in %v after a reset", s)
	}
	t.Logf("reset noticed and flushed in %v", time.Since(start))
}

// TestDialRefused checks the error of a dial to a port nobody listens on.
func TestDialRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	a := &pairEnd{}
	if a.ctx, err = verbs.Open("tcp0"); err != nil {
		t.Fatal(err)
	}
	defer a.ctx.Close()
	pd, _ := a.ctx.AllocPD()
	cq, _ := a.ctx.CreateCQ(4)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cm.Dial(ctx, "tcp://"+addr, qp, nil); !errors.Is(err, cm.ErrRefused) {
		t.Fatalf("dial to a closed port: %v, want an error wrapping cm.ErrRefused", err)
	}
}

// TestReject checks that a rejection reaches the dialler with its
// private data.
func TestReject(t *testing.T) {
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if req, err := l.Accept(ctx); err == nil {
			if string(req.PrivateData()) == "let me in" {
				req.Reject([]byte("not today"))
			}
		}
	}()
	ctx0, err := verbs.Open("tcp0")
	if err != nil {
		t.Fatal(err)
	}
	defer ctx0.Close()
	pd, _ := ctx0.AllocPD()
	cq, _ := ctx0.CreateCQ(4)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = cm.Dial(ctx, l.Addr(), qp, &cm.Param{PrivateData: []byte("let me in")})
	var rej *cm.RejectError
	if !errors.As(err, &rej) || string(rej.PrivateData) != "not today" {
		t.Fatalf("dial: %v, want a rejection with private data %q", err, "not today")
	}
}

// sendOne posts a 64-byte receive at b (WRID 1) and a signaled 64-byte
// Send to it from a (WRID 2).
func sendOne(t *testing.T, a, b *pairEnd) {
	t.Helper()
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{b.mr.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
}

// TestDisconnectAfterReceive checks that a receiver that disconnects as
// soon as it has a message still lets the sender's Send complete as a
// success: the Read that confirms the Send is answered before the
// receive completes, and a disconnect sends the answers queued before it
// closes the socket.
func TestDisconnectAfterReceive(t *testing.T) {
	for i := range 20 {
		a, b, _, cb := connectPair(t, 4096, nil, nil)
		sendOne(t, a, b)
		if wc := b.wait(t, 1)[0]; wc.Status != verbs.WCSuccess {
			t.Fatalf("round %d: receive completion %+v", i, wc)
		}
		cb.Close()
		if wc := a.wait(t, 1)[0]; wc.Status != verbs.WCSuccess || wc.WRID != 2 {
			t.Fatalf("round %d: the Send the peer received completed with %+v, want success", i, wc)
		}
	}
}

// openDescriptors counts the process's open descriptors.
func openDescriptors(t *testing.T) int {
	d, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(d)
}

// leavesNoDescriptor runs round once (which may open descriptors that
// stay: the runtime's poller's), then n more times, and fails the test
// if more descriptors are open after them than before.
func leavesNoDescriptor(t *testing.T, what string, n int, round func()) {
	t.Helper()
	round()
	before := openDescriptors(t)
	for range n {
		round()
	}
	if after := openDescriptors(t); after > before {
		t.Errorf("%s: %d descriptors open after %d rounds, %d before", what, after, n, before)
	}
}

// TestNoDescriptorLeak connects, uses and tears down pairs of QPs many
// times: each connection holds descriptors of its own (the socket, and
// the two epoll instances that watch it), and closes the net package's
// once it starts; all must be closed once the QPs are destroyed.
func TestNoDescriptorLeak(t *testing.T) {
	round := func() {
		t.Run("pair", func(t *testing.T) {
			a, b, ca, cb := connectPair(t, 4096, nil, nil)
			sendOne(t, a, b)
			a.wait(t, 1)
			b.wait(t, 1)
			ca.Close()
			cb.Close()
			for _, e := range []*pairEnd{a, b} {
				if err := e.qp.Destroy(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	leavesNoDescriptor(t, "connections", 20, round)
}

// TestReadWhileWrittenWithCRC: with MPA CRCs on, RDMA Reads of memory its
// owner keeps writing (a kv store's index, say) return torn data, as on
// any RDMA device, but never a frame whose CRC fails: the responder sends
// the bytes it computed the CRC over.
func TestReadWhileWrittenWithCRC(t *testing.T) {
	prev := iwarp.CRC()
	iwarp.SetCRC(true)
	defer iwarp.SetCRC(prev)
	const size = 64 << 10
	a, b, _, _ := connectPair(t, 2*size, nil, nil)
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		buf := b.mr.Bytes()[:size]
		for i := byte(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for j := range buf {
				buf[j] = i
			}
		}
	}()
	defer func() {
		close(stop)
		<-wrote
	}()
	wr := []verbs.SendWR{{Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled, SGList: []verbs.SGE{a.mr.SGE(0, size)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}
	for i := range 200 {
		wr[0].WRID = uint64(i)
		if _, err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if wc := a.wait(t, 1)[0]; wc.Status != verbs.WCSuccess {
			t.Fatalf("Read %d of memory being written: %v", i, wc.Status)
		}
	}
}

// TestTerminateBlamesTheRightWrite: of two Writes posted together to one
// region, the second runs past its end; the Terminate names the second's
// segment, and the first, placed whole, completes with success, whether
// the two ranges are adjacent or the second covers the first's.
func TestTerminateBlamesTheRightWrite(t *testing.T) {
	for _, tc := range []struct {
		name   string
		at, n2 int // the second Write's offset and length
	}{
		{"adjacent", 2048, 4096},
		{"overlapping", 0, 8192},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, _, _ := connectPair(t, 1<<16, nil, nil)
			target, err := b.pd.RegMR(b.mr.Bytes()[0:4096], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			w1 := verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{a.mr.SGE(0, 2048)}, RemoteAddr: target.Addr(), RKey: target.RKey()}
			w2 := verbs.SendWR{WRID: 2, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{a.mr.SGE(0, tc.n2)}, RemoteAddr: target.Addr() + uint64(tc.at), RKey: target.RKey()}
			if _, err := a.qp.PostSend([]verbs.SendWR{w1, w2}); err != nil {
				t.Fatal(err)
			}
			wcs := a.wait(t, 2)
			if wcs[0].WRID != 1 || wcs[0].Status != verbs.WCSuccess || wcs[1].WRID != 2 || wcs[1].Status != verbs.WCRemAccessErr {
				t.Fatalf("the Writes completed %+v and %+v; want the first a success, the second a remote access error", wcs[0], wcs[1])
			}
		})
	}
}

// TestInvalidateTwice: a second Send with Invalidate of an STag already
// invalid succeeds, as the verbs allow and siw does, and both receive
// completions report the STag; the stream goes on.
func TestInvalidateTwice(t *testing.T) {
	a, b, _, _ := connectPair(t, 1<<16, nil, nil)
	target, err := b.pd.RegMR(b.mr.Bytes()[4096:8192], verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{b.mr.SGE(0, 64)}}, {WRID: 8, SGList: []verbs.SGE{b.mr.SGE(64, 64)}}}); err != nil {
		t.Fatal(err)
	}
	inv := func(id uint64) verbs.SendWR {
		return verbs.SendWR{WRID: id, Opcode: verbs.OpSendWithInv, Flags: verbs.SendSignaled, InvalidateRKey: target.RKey(),
			SGList: []verbs.SGE{a.mr.SGE(0, 16)}}
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{inv(1), inv(2)}); err != nil {
		t.Fatal(err)
	}
	for _, wc := range a.wait(t, 2) {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("Send with Invalidate %d: %v", wc.WRID, wc.Status)
		}
	}
	for _, wc := range b.wait(t, 2) {
		if wc.Status != verbs.WCSuccess || wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != target.RKey() {
			t.Fatalf("receive %+v, want a success that reports STag %#x invalidated", wc, target.RKey())
		}
	}
}
