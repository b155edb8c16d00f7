package iwarp_test

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/cm"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestPartialReadRequestHoldsNoReceive: a peer that sends a whole Send
// and then the first bytes of a Read Request, and stalls, cannot keep the
// Send's receive from completing (it was held back for the Read Request,
// to answer it first, until that FPDU was done).
func TestPartialReadRequestHoldsNoReceive(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{g.r.SGE(0, 64)}}}); n != 1 {
		t.Fatalf("post receive: %v", err)
	}
	send := h.fpdu(h.untagged(wire.OpSend, wire.QNSend, 32), bytes.Repeat([]byte{1}, 32))
	rr := h.readRequest(0, 0, 0)
	h.send(append(send, rr[:8]...))
	wcs, err := v.e.Completions(verbstest.RecvCQ, 1, 5*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].WRID != 5 {
		t.Fatalf("the Send arrived whole and its receive completed with %+v (%v), want a success", wcs, err)
	}
}

// TestPeerThatStopsReadingTimesOut: a peer that takes nothing more, yet
// whose TCP answers the zero-window probes (a stopped process), keeps a
// Write outstanding only for the QP's timeout and retries (here cm's
// Timeout 14 and RetryCnt 7: 0.55 s); the Write then completes with
// WCRetryExcErr and the QP fails (the Write stayed outstanding for good).
// The application busy-polls, so that the receive side may be the one the
// kernel tells of the timeout (the Write was then flushed instead).
func TestPeerThatStopsReadingTimesOut(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	for range 3 {
		v := newVictim(t, 4)
		src := guard(t, v, 32<<20, verbs.AccessLocalWrite)
		dialHostile(t, v, false, false, false)
		if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{src.r.SGE(0, src.r.Len)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
			t.Fatalf("post write: %v", err)
		}
		wc := make([]verbs.WorkCompletion, 4)
		deadline := time.Now().Add(20 * time.Second)
		for v.e.SendCQ.Poll(wc) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the Write never completed")
			}
		}
		if wc[0].WRID != 7 || wc[0].Status != verbs.WCRetryExcErr {
			t.Fatalf("the Write completed with %+v, want a retry-exceeded error", wc[0])
		}
		expectVictimError(t, v)
	}
}

// TestSmallWriteToStoppedPeerTimesOut: a 64-byte Write whose bytes, and
// the Read that asks for its confirmation, the peer's TCP takes and
// acknowledges, but that nothing answers (the peer's process is
// stopped), completes with WCRetryExcErr after the QP's timeout, and
// not before: TCP's own timeout never fires, as nothing stays
// unacknowledged.
func TestSmallWriteToStoppedPeerTimesOut(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	const timeout = 4096 * time.Nanosecond << 14 * 8 // cm's Timeout 14 and RetryCnt 7
	v := newVictim(t, 4)
	src := guard(t, v, 4096, verbs.AccessLocalWrite)
	dialHostile(t, v, false, false, false)
	posted := time.Now()
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{src.r.SGE(0, 64)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
		t.Fatalf("post write: %v", err)
	}
	wcs, err := v.e.Completions(verbstest.SendCQ, 1, 20*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].WRID != 7 || wcs[0].Status != verbs.WCRetryExcErr {
		t.Fatalf("the Write completed with %+v (%v), want a retry-exceeded error", wcs, err)
	}
	if d := time.Since(posted); d < timeout {
		t.Fatalf("the Write timed out %v after its post, before the QP's timeout (%v)", d, timeout)
	}
	expectVictimError(t, v)
}

// TestSlowPeerIsNotTimedOut: a healthy peer on a slow path (it reads the
// stream at some 6 MB/s, and answers each confirming Read at once) is
// not timed out while an 8 MiB Write, and the Read behind it, take longer
// than the QP's timeout (0.55 s) to reach it: they sit in the socket, and
// nothing comes from the peer meanwhile (the Write failed with
// WCRetryExcErr).
func TestSlowPeerIsNotTimedOut(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	v := newVictim(t, 4)
	src := guard(t, v, 8<<20, verbs.AccessLocalWrite)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{src.r.SGE(0, src.r.Len)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
		t.Fatalf("post write: %v", err)
	}
	done := make(chan []verbs.WorkCompletion, 1)
	go func() {
		wcs, _ := v.e.Completions(verbstest.SendCQ, 1, 15*time.Second)
		done <- wcs
	}()
	for {
		select {
		case wcs := <-done:
			if len(wcs) != 1 || wcs[0].WRID != 7 || wcs[0].Status != verbs.WCSuccess {
				t.Fatalf("the Write to a slow, healthy peer completed with %+v, want a success", wcs)
			}
			return
		default:
		}
		b := h.readFPDU()
		switch {
		case !wire.Hdr(b).Tagged() && wire.Hdr(b).Opcode() == wire.OpReadRequest:
			r := wire.ReadRequest(b)
			var hdr [wire.TaggedLen]byte
			wire.Hdr(hdr[:]).SetTagged(wire.OpReadResponse, true, r.SinkSTag(), r.SinkTO(), 0)
			h.send(h.fpdu(hdr[:], nil))
		case !wire.Hdr(b).Tagged() && wire.Hdr(b).Opcode() == wire.OpTerminate:
			t.Fatal("the victim terminated the stream")
		}
		time.Sleep(10 * time.Millisecond) // the slow path: some 64 KiB per 10 ms
	}
}

// TestRequestIsTimedFromReachingPeer: a request is given the QP's
// timeout from when the peer's TCP took it, not from when it was sent:
// the confirming Read, sent at once behind a 1 MiB Write that a stalled
// path holds in this side's socket for 0.4 of a timeout, reaches the
// peer late, and the peer, which then takes all at once and answers 0.7
// of a timeout later (1.1 timeouts after the post), is not timed out.
func TestRequestIsTimedFromReachingPeer(t *testing.T) {
	const timeout = 2 * time.Second // above cm's 0.55 s, for the margins
	defer iwarp.SetMinUserTimeout(timeout)()
	v := newVictim(t, 4)
	src := guard(t, v, 1<<20, verbs.AccessLocalWrite)
	h := dialHostile(t, v, false, false, false)
	posted := time.Now()
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{src.r.SGE(0, src.r.Len)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
		t.Fatalf("post write: %v", err)
	}
	time.Sleep(timeout * 4 / 10) // the stalled path: the peer takes no more than its window
	var rr wire.ReadRequest
	for rr == nil {
		b := h.readFPDU()
		if !wire.Hdr(b).Tagged() && wire.Hdr(b).Opcode() == wire.OpReadRequest {
			rr = wire.ReadRequest(b)
		}
	}
	time.Sleep(time.Until(posted.Add(timeout * 11 / 10)))
	var hdr [wire.TaggedLen]byte
	wire.Hdr(hdr[:]).SetTagged(wire.OpReadResponse, true, rr.SinkSTag(), rr.SinkTO(), 0)
	h.send(h.fpdu(hdr[:], nil))
	wcs, err := v.e.Completions(verbstest.SendCQ, 1, 15*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].WRID != 7 || wcs[0].Status != verbs.WCSuccess {
		t.Fatalf("the Write whose confirmation reached the peer late completed with %+v (%v), want a success", wcs, err)
	}
}

// TestPeerThatNeverAnswersTimesOut: a peer that keeps sending (RDMA
// Writes of 64 KiB every millisecond) but never answers a Read keeps it
// outstanding only for a few of the QP's timeouts (here 0.55 s), once it
// has sent more than any healthy peer can have queued ahead of an answer
// (answerSlack): the Read then completes with WCRetryExcErr and the QP
// fails: the peer's traffic does not keep the Read outstanding for good,
// as it would if only silence timed a request out.
func TestPeerThatNeverAnswersTimesOut(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	v := newVictim(t, 4)
	sink := guard(t, v, 4096, verbs.AccessLocalWrite)
	const chunk = 16 << 10
	target := guard(t, v, chunk, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{sink.r.SGE(0, 64)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
		t.Fatalf("post read: %v", err)
	}
	done := make(chan []verbs.WorkCompletion, 1)
	go func() {
		wcs, _ := v.e.Completions(verbstest.SendCQ, 1, 30*time.Second)
		done <- wcs
	}()
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	write := h.write(target.r.RKey, target.r.Addr, bytes.Repeat([]byte{0xa5}, chunk))
	sent := 0
	for {
		select {
		case wcs := <-done:
			if len(wcs) != 1 || wcs[0].WRID != 7 || wcs[0].Status != verbs.WCRetryExcErr {
				t.Fatalf("the unanswered Read completed with %+v, want a retry-exceeded error", wcs)
			}
			t.Logf("the Read timed out after %v, the peer having sent %d MiB meanwhile", time.Since(start).Round(time.Millisecond), sent>>20)
			if sent <= iwarp.AnswerSlack {
				t.Fatalf("the peer sent only %d bytes before the timeout, no more than AnswerSlack (%d): the test did not keep it talking", sent, iwarp.AnswerSlack)
			}
			expectVictimError(t, v)
			return
		case <-tick.C:
			for range 4 {
				if _, err := h.nc.Write(write); err != nil {
					break
				}
				sent += chunk
			}
		}
	}
}

// slowProxy forwards a TCP connection to server: what the client sends
// at full speed, what the server sends at rate bytes a second, read from
// the server no faster, so that the server's data waits in its own
// socket as on a slow path.
func slowProxy(t *testing.T, server string, rate int) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10)
			})
		}}
		s, err := d.Dial("tcp", server)
		if err != nil {
			c.Close()
			return
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		go io.Copy(s, c)
		go func() {
			buf := make([]byte, 4096)
			next := time.Now()
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
				next = next.Add(time.Duration(n) * time.Second / time.Duration(rate)) // pacing, not synchronisation
				time.Sleep(time.Until(next))
			}
		}()
	}()
	return l.Addr().String()
}

// TestSlowPathReadBehindWrites: a healthy goverbs peer W on a slow path
// (256 KB/s towards the requester R) has 1 MiB of RDMA Writes queued for
// R when R posts a 64-byte Read of W. W's Read Response waits, in W's
// transmitter and socket, behind its Writes, while R receives W's Writes
// steadily and no answer: for longer than answerStalls of R's timeouts
// (0.55 s), yet less than answerSlack bytes. The Read succeeds.
func TestSlowPathReadBehindWrites(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	opts := verbstest.PairOptions{}.Defaults()
	w, err := verbstest.NewLocal("tcp0", opts, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := verbstest.NewLocal("tcp0", opts, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan error, 1)
	go func() { acc <- w.Accept(l, opts) }()
	if err := r.Dial("tcp://"+slowProxy(t, l.Addr()[len("tcp://"):], 256<<10), opts); err != nil {
		t.Fatal(err)
	}
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
	// W's own timeout is long (Timeout 20: 34 s): only R's is under test.
	for _, m := range []struct {
		a    verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSSQD, Timeout: 20}, verbs.QPAttrState | verbs.QPAttrTimeout},
		{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState},
	} {
		if err := w.QPs[0].Modify(&m.a, m.mask); err != nil {
			t.Fatal(err)
		}
	}
	const wlen, nw = 256 << 10, 4
	src := newRegion(t, w, wlen, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	dst := newRegion(t, r, wlen, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	sink := newRegion(t, r, 64, verbs.AccessLocalWrite)
	if err := w.WriteRegion(src.ID, 0, bytes.Repeat([]byte{0x5a}, wlen)); err != nil {
		t.Fatal(err)
	}
	var wrs []verbs.SendWR
	for i := range nw {
		wrs = append(wrs, verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{src.SGE(0, wlen)}, RemoteAddr: dst.Addr, RKey: dst.RKey})
	}
	if n, err := w.PostSend(0, wrs); n != nw {
		t.Fatalf("post the Writes: %d, %v", n, err)
	}
	// The Read goes once the Writes have begun to arrive.
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		b, err := r.ReadRegion(dst.ID, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] == 0x5a {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Write arrived")
		}
	}
	start := time.Now()
	if n, err := r.PostSend(0, []verbs.SendWR{{WRID: 99, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{sink.SGE(0, 64)}, RemoteAddr: src.Addr, RKey: src.RKey}}); n != 1 {
		t.Fatalf("post the Read: %v", err)
	}
	wcs, err := r.Completions(verbstest.SendCQ, 1, 60*time.Second)
	if err != nil || len(wcs) != 1 {
		t.Fatalf("the Read: %v, %v", wcs, err)
	}
	t.Logf("the Read completed with %v after %v", wcs[0].Status, time.Since(start).Round(time.Millisecond))
	if wcs[0].Status != verbs.WCSuccess {
		t.Fatalf("the Read of a healthy peer on a slow path completed with %v", wcs[0].Status)
	}
	wwcs, err := w.Completions(verbstest.SendCQ, nw, 60*time.Second)
	if err != nil || len(wwcs) != nw {
		t.Fatalf("the Writes: %d completions, %v", len(wwcs), err)
	}
	for _, wc := range wwcs {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("Write %d completed with %v", wc.WRID, wc.Status)
		}
	}
}
