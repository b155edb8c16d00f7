package iwarp_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// Tests of the fast paths of a small message: a single WR posted to an
// idle connection is built and written by the posting goroutine (postNow),
// and a Send the stage holds whole is placed and completed under one hold
// of the QP's lock (rxStagedSend).

// pat is the content of message seq, n bytes long.
func pat(seq, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seq*31 + i*7 + 1)
	}
	return b
}

// TestInlineBufferReusedAtOnce: an inline Send's buffer is the
// application's again once PostSend returns (the short road, postNow,
// copies it into the batch under the post); what the peer receives is
// what the buffer held at the post, with CRCs off and on.
func TestInlineBufferReusedAtOnce(t *testing.T) {
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprint("crc=", crc), func(t *testing.T) {
			iwarp.SetCRC(crc)
			defer iwarp.SetCRC(false)
			p := newBenchPair(t, 1<<16)
			const n = 3000
			const size = 64
			recvs := make([]verbs.RecvWR, 1)
			for i := 0; i < 200; i++ {
				recvs[0] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{p.b.mr.SGE(4096+(i%200)*size, size)}}
				if _, err := p.b.qp.PostRecv(recvs); err != nil {
					t.Fatal(err)
				}
			}
			src := p.a.mr.Bytes()[:size]
			wc := make([]verbs.WorkCompletion, 16)
			got := 0
			deadline := time.Now().Add(60 * time.Second)
			for i := 0; i < n; i++ {
				copy(src, pat(i, size))
				wr := []verbs.SendWR{{WRID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendInline | verbs.SendSignaled, SGList: []verbs.SGE{p.a.mr.SGE(0, size)}}}
				for {
					_, err := p.a.qp.PostSend(wr)
					if err == nil {
						break
					}
					if !errors.Is(err, verbs.ErrQueueFull) {
						t.Fatal(err)
					}
					p.a.drain(t)
				}
				for j := range src {
					src[j] = 0xEE
				}
				p.a.drain(t)
				// B keeps up.
				for got <= i-100 || (i == n-1 && got < n) {
					if time.Now().After(deadline) {
						t.Fatalf("stuck at %d of %d", got, n)
					}
					k := p.b.rcq.Poll(wc)
					for _, w := range wc[:k] {
						if w.Status != verbs.WCSuccess {
							t.Fatalf("recv %+v", w)
						}
						off := 4096 + int(w.WRID)*size
						if !bytes.Equal(p.b.mr.Bytes()[off:off+size], pat(got, size)) {
							t.Fatalf("message %d: received %x, posted %x", got, p.b.mr.Bytes()[off:off+size], pat(got, size))
						}
						recvs[0] = verbs.RecvWR{WRID: w.WRID, SGList: []verbs.SGE{p.b.mr.SGE(off, size)}}
						if _, err := p.b.qp.PostRecv(recvs); err != nil {
							t.Fatal(err)
						}
						got++
					}
					p.a.drain(t)
				}
			}
		})
	}
}

// TestShortRoadsUnderLoad: one QP posts single WRs of every kind the
// short roads take (postNow, rxStagedSend) and some they do not (Reads,
// fenced Writes, Sends of more than one stage, inline ones), signaled or
// not, from several goroutines (serialised in a sequence), while the peer
// sends back; every send completion comes in order with success, and
// every Send arrives in order with its bytes.
func TestShortRoadsUnderLoad(t *testing.T) {
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprint("crc=", crc), func(t *testing.T) {
			iwarp.SetCRC(crc)
			defer iwarp.SetCRC(false)
			shortRoadsUnderLoad(t)
		})
	}
}

// shortRoadsUnderLoad is TestShortRoadsUnderLoad with CRCs as set.
func shortRoadsUnderLoad(t *testing.T) {
	const slot = 4096
	const nrecv = 128
	const total = 4000
	p := newBenchPair(t, 1<<20)
	// B's receive buffers: [0, nrecv*slot); A's Send sources: [0, 512K),
	// its Writes' source at 512K and its Reads' sink at 600K; B's Write
	// target at 600K and Read source at 700K.
	var bmu sync.Mutex // B's QP posts from the checker and the back-sender
	postRecvB := func(i int) {
		bmu.Lock()
		defer bmu.Unlock()
		if _, err := p.b.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{p.b.mr.SGE(i*slot, slot)}}}); err != nil {
			t.Error(err)
		}
	}
	for i := 0; i < nrecv; i++ {
		postRecvB(i)
	}
	// A receives B's back traffic into its upper half. B sends only
	// against credits, one for each receive A has posted and not yet
	// seen filled: iWARP has no receiver-not-ready retry.
	var credits atomic.Int64
	credits.Store(64)
	for i := 0; i < 64; i++ {
		if _, err := p.a.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{p.a.mr.SGE(768<<10+i*64, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Bool
	fail := func(format string, args ...any) {
		if failed.CompareAndSwap(false, true) {
			t.Errorf(format, args...)
		}
	}
	// Expected Send contents, by send sequence.
	var expMu sync.Mutex
	expected := map[int][]byte{}
	sendSeq := 0

	// drain polls cq until stop is closed, handing each completion, a
	// successful one, to handle, which returns false on a failure.
	drain := func(cq *verbs.CQ, what string, handle func(w verbs.WorkCompletion) bool) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wc := make([]verbs.WorkCompletion, 32)
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, w := range wc[:cq.Poll(wc)] {
					if w.Status != verbs.WCSuccess {
						fail("%s completion %+v", what, w)
						return
					}
					if !handle(w) {
						return
					}
				}
			}
		}()
	}
	// A's send CQ: completions in order of WRID among signaled ones.
	var lastWRID atomic.Int64
	lastWRID.Store(-1)
	var sent atomic.Int64 // completions polled
	drain(p.a.cq, "A send", func(w verbs.WorkCompletion) bool {
		if int64(w.WRID) <= lastWRID.Load() {
			fail("send completion %d after %d", w.WRID, lastWRID.Load())
			return false
		}
		lastWRID.Store(int64(w.WRID))
		sent.Add(1)
		return true
	})
	// A's receive CQ: repost, and give B the credit back.
	drain(p.a.rcq, "A receive", func(w verbs.WorkCompletion) bool {
		if _, err := p.a.qp.PostRecv([]verbs.RecvWR{{WRID: w.WRID, SGList: []verbs.SGE{p.a.mr.SGE(768<<10+int(w.WRID)*64, 64)}}}); err != nil {
			fail("A repost: %v", err)
			return false
		}
		credits.Add(1)
		return true
	})
	// B sends small messages back, unsignaled mostly, and polls its send CQ.
	wg.Add(1)
	go func() {
		defer wg.Done()
		wc := make([]verbs.WorkCompletion, 32)
		inflight := 0
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			bmu.Lock()
			flags := verbs.SendFlags(0)
			if i%8 == 0 {
				flags = verbs.SendSignaled
			}
			var err error
			if inflight < 32 && credits.Load() > 0 {
				credits.Add(-1)
				_, err = p.b.qp.PostSend([]verbs.SendWR{{WRID: uint64(i), Opcode: verbs.OpSend, Flags: flags, SGList: []verbs.SGE{p.b.mr.SGE(900<<10, 16)}}})
				if err != nil {
					credits.Add(1) // not sent
				} else if flags != 0 {
					inflight++
				}
			}
			bmu.Unlock()
			if err != nil && !errors.Is(err, verbs.ErrQueueFull) {
				fail("B post: %v", err)
				return
			}
			n := p.b.cq.Poll(wc)
			inflight -= n
			for _, w := range wc[:n] {
				if w.Status != verbs.WCSuccess {
					fail("B send completion %+v", w)
					return
				}
			}
			runtime.Gosched()
		}
	}()
	// B's receive checker: each message in order, with its bytes.
	next := 0
	drain(p.b.rcq, "B receive", func(w verbs.WorkCompletion) bool {
		expMu.Lock()
		want, ok := expected[next]
		delete(expected, next)
		expMu.Unlock()
		if !ok {
			fail("B received message %d, not posted", next)
			return false
		}
		off := int(w.WRID) * slot
		got := p.b.mr.Bytes()[off : off+int(w.ByteLen)]
		if int(w.ByteLen) != len(want) || !bytes.Equal(got, want) {
			fail("message %d: %d bytes, want %d; equal=%v", next, w.ByteLen, len(want), bytes.Equal(got, want))
			return false
		}
		next++
		postRecvB(int(w.WRID))
		return true
	})
	// Posters: several goroutines, one sequence.
	var postMu sync.Mutex
	var wrid atomic.Int64
	posters := 4
	per := total / posters
	var pwg sync.WaitGroup
	for g := 0; g < posters; g++ {
		pwg.Add(1)
		go func(g int) {
			defer pwg.Done()
			rnd := rand.New(rand.NewSource(int64(g)))
			for k := 0; k < per && !failed.Load(); k++ {
				postMu.Lock()
				id := wrid.Add(1) - 1
				var wr verbs.SendWR
				kind := rnd.Intn(10)
				flags := verbs.SendFlags(0)
				if rnd.Intn(3) == 0 {
					flags |= verbs.SendSignaled
				}
				var msg []byte
				switch {
				case kind < 5: // Send, sometimes inline
					size := []int{0, 1, 16, 64, 200, 256, 257, 500, 1500, 2048}[rnd.Intn(10)]
					srcOff := (int(id) % 256) * 2048
					msg = pat(int(id), size)
					copy(p.a.mr.Bytes()[srcOff:], msg)
					if size <= 64 && rnd.Intn(2) == 0 {
						flags |= verbs.SendInline
					}
					wr = verbs.SendWR{WRID: uint64(id), Opcode: verbs.OpSend, Flags: flags, SGList: []verbs.SGE{p.a.mr.SGE(srcOff, size)}}
				case kind < 8: // Write into B's upper region
					size := []int{0, 8, 300, 5000}[rnd.Intn(4)]
					if rnd.Intn(4) == 0 {
						flags |= verbs.SendFence
					}
					wr = verbs.SendWR{WRID: uint64(id), Opcode: verbs.OpRDMAWrite, Flags: flags, SGList: []verbs.SGE{p.a.mr.SGE(512<<10, size)},
						RemoteAddr: p.b.mr.Addr() + 600<<10, RKey: p.b.mr.RKey()}
				default: // Read
					wr = verbs.SendWR{WRID: uint64(id), Opcode: verbs.OpRDMARead, Flags: flags, SGList: []verbs.SGE{p.a.mr.SGE(600<<10, 128)},
						RemoteAddr: p.b.mr.Addr() + 700<<10, RKey: p.b.mr.RKey()}
				}
				// Keep the receiver ahead: no more than nrecv/2 Sends
				// unreceived.
				if msg != nil {
					for {
						expMu.Lock()
						pending := len(expected)
						expMu.Unlock()
						if pending < nrecv/2 || failed.Load() {
							break
						}
						runtime.Gosched()
					}
					expMu.Lock()
					expected[sendSeq] = msg
					sendSeq++
					expMu.Unlock()
				}
				deadline := time.Now().Add(30 * time.Second)
				for {
					_, err := p.a.qp.PostSend([]verbs.SendWR{wr})
					if err == nil {
						break
					}
					if !errors.Is(err, verbs.ErrQueueFull) || time.Now().After(deadline) {
						fail("post %d: %v", id, err)
						break
					}
					runtime.Gosched()
				}
				if wr.Flags&verbs.SendInline != 0 {
					// The buffer is the application's again.
					for j := range msg {
						p.a.mr.Bytes()[(int(id)%256)*2048+j] ^= 0xff
					}
				}
				postMu.Unlock()
			}
		}(g)
	}
	pwg.Wait()
	// A last signaled Send makes everything before complete.
	deadline := time.Now().Add(30 * time.Second)
	for {
		expMu.Lock()
		pending := len(expected)
		expMu.Unlock()
		if pending == 0 || failed.Load() {
			break
		}
		if time.Now().After(deadline) {
			fail("%d Sends never arrived", pending)
			break
		}
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	t.Logf("posted %d WRs, %d Sends, %d send completions polled", wrid.Load(), sendSeq, sent.Load())
}

// TestStagedSendForgetsEarlierRegions: a Send placed by the long road
// (too big for the stage) leaves its receive's region in rx.dstMR, which
// rxBegin clears at the next FPDU; the short road (rxStagedSend) clears it
// too, so that a zero-length Send into a receive without SGEs does not
// leave the earlier region referenced by the connection, deregistered or
// not.
func TestStagedSendForgetsEarlierRegions(t *testing.T) {
	p := newBenchPair(t, 1<<16)
	ctx := benchCtx(t)
	other, err := p.b.pd.AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.b.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{other.SGE(0, 4096)}}, {WRID: 2}}); err != nil {
		t.Fatal(err)
	}
	// The first unsignaled: no confirming Read follows it at once.
	if _, err := p.a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGList: []verbs.SGE{p.a.mr.SGE(0, 2000)}}}); err != nil {
		t.Fatal(err)
	}
	p.b.waitOne(t, ctx, p.b.rcq)
	if _, err := p.a.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled}}); err != nil {
		t.Fatal(err)
	}
	p.b.waitOne(t, ctx, p.b.rcq)
	p.a.waitOne(t, ctx, p.a.cq)
	if err := other.Dereg(); err != nil {
		t.Fatal(err)
	}
	if n := iwarp.StaleDstMRs(p.b.qp.Driver()); n != 0 {
		t.Fatalf("the receiver still points at %d region(s) of an earlier FPDU (one deregistered)", n)
	}
}
