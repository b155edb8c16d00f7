package shm

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Receive completions a hostile peer writes. B is the peer: it writes
// completions straight into the ring its Sends complete A's receives in
// (the ring it maps of A's), naming anything. A's Poll believes only the
// status, flags, immediate and byte count it reads there, and only
// within what A posted: the WRID comes from A's record of the receive at
// the position named, the QP is the one whose ring it came from, a
// position with no receive posted (or completed already) is dropped, and
// a Send's byte count beyond the receive's buffers completes it with a
// length error. A peer caught lying is cut off: A's QP moves to the
// error state.

// forge writes wc into the ring through which B completes receives of
// A's QP i, as B's requester does, bypassing it.
func forge(t *testing.T, p *verbstest.Pair, i int, wc driver.WorkCompletion) {
	t.Helper()
	if !connOf(driverQP(p.B.(*verbstest.Local).QPs[i])).peerCQ.produce(&wc, nil) {
		t.Fatal("the ring is full")
	}
}

// pollAll polls A's receive CQ until it has nothing more to give.
func pollAll(p *verbstest.Pair) []verbs.WorkCompletion { return pollCQ(p.A.RecvCQ) }

// pollCQ polls cq until it has nothing more to give.
func pollCQ(cq *verbs.CQ) []verbs.WorkCompletion {
	var out []verbs.WorkCompletion
	wc := make([]verbs.WorkCompletion, 8)
	for {
		n := cq.Poll(wc)
		if n == 0 {
			return out
		}
		out = append(out, wc[:n]...)
	}
}

// expectCutOff waits for A's QP i to move to the error state.
func expectCutOff(t *testing.T, p *verbstest.Pair, i int) {
	t.Helper()
	for deadline := time.Now().Add(waitLimit); ; {
		a, err := p.A.QPs[i].Query()
		if err == nil && a.State == verbs.QPSErr {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's QP %d is %v (%v) after its peer forged a completion; want it cut off", i, a.State, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestForgedCompletionOfNoReceive: a completion naming a position where
// A posted nothing, with a WRID of the peer's choosing, is dropped.
func TestForgedCompletionOfNoReceive(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	forge(t, p, 0, driver.WorkCompletion{WRID: 999, Opcode: driver.WCRecv, ByteLen: 8})
	forge(t, p, 0, driver.WorkCompletion{WRID: 0, Opcode: driver.WCRecv, ByteLen: 8})
	if got := pollAll(p); len(got) != 0 {
		t.Fatalf("Poll handed out completions of receives never posted: %+v", got)
	}
	expectCutOff(t, p, 0)
}

// forgeForPosted posts a receive of 16 bytes, WRID 77, on A's QP, has
// the peer write wc as its completion, and returns what A polls: it must
// be exactly one completion.
func forgeForPosted(t *testing.T, wc driver.WorkCompletion) (*verbstest.Pair, verbs.WorkCompletion) {
	t.Helper()
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	buf := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(77, buf.SGE(0, 16)))
	wc.WRID = 0 // the receive's position
	forge(t, p, 0, wc)
	got := pollAll(p)
	if len(got) != 1 {
		t.Fatalf("the peer's completion of receive 77 came out as %d completions: %+v", len(got), got)
	}
	return p, got[0]
}

// TestForgedCompletionTakesRecordedWRID: the completion of a receive A
// posted carries the WRID A posted and A's QP number, whatever the peer
// wrote; the same receive completed again is dropped.
func TestForgedCompletionTakesRecordedWRID(t *testing.T) {
	p, got := forgeForPosted(t, driver.WorkCompletion{Opcode: driver.WCRecv, ByteLen: 8, QPNum: 0xabcdef})
	if got.WRID != 77 || got.QPNum != p.A.QPNum(0) || got.Status != verbs.WCSuccess || got.ByteLen != 8 {
		t.Fatalf("the completion of receive 77 came out %+v; want WRID 77 on QP %#x, a success of 8 bytes", got, p.A.QPNum(0))
	}
	forge(t, p, 0, driver.WorkCompletion{WRID: 0, Opcode: driver.WCRecv, ByteLen: 8})
	if got := pollAll(p); len(got) != 0 {
		t.Fatalf("a receive completed twice: %+v", got)
	}
	expectCutOff(t, p, 0)
}

// TestForgedCompletionLongerThanReceive: a Send's completion claiming
// more bytes than the receive's buffers hold completes the receive with
// a length error and no byte count.
func TestForgedCompletionLongerThanReceive(t *testing.T) {
	p, got := forgeForPosted(t, driver.WorkCompletion{Opcode: driver.WCRecv, ByteLen: 4096})
	if got.WRID != 77 || got.Status == verbs.WCSuccess || got.ByteLen != 0 {
		t.Fatalf("a 4096-byte completion of a 16-byte receive came out %+v; want WRID 77 failed with no byte count", got)
	}
	expectCutOff(t, p, 0)
}

// TestForgedCompletionForAnotherQP: A's two QPs share a receive CQ and
// each has a receive posted. The peer of QP 0 writes a completion naming
// QP 1: it completes QP 0's receive, on QP 0; QP 1's receive is still
// posted, and is completed by QP 1's honest peer.
func TestForgedCompletionForAnotherQP(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{QPs: 2})
	buf := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(10, buf.SGE(0, 16)))
	postRecv(t, p.A, 1, recv(11, buf.SGE(16, 16)))
	forge(t, p, 0, driver.WorkCompletion{WRID: 0, Opcode: driver.WCRecv, ByteLen: 8, QPNum: p.A.QPNum(1)})
	got := pollAll(p)
	if len(got) != 1 || got[0].WRID != 10 || got[0].QPNum != p.A.QPNum(0) {
		t.Fatalf("a completion QP 0's peer wrote naming QP 1 came out %+v; want receive 10 of QP %#x", got, p.A.QPNum(0))
	}
	src := newRegion(t, p.B, 8, verbs.AccessLocalWrite)
	fill(t, p.B, src, 0, pattern(7, 8))
	postSend(t, p.B, 1, send(20, src.SGE(0, 8)))
	wcs := waitWCs(t, p.A, verbstest.RecvCQ, 1)
	if wcs[0].WRID != 11 || wcs[0].QPNum != p.A.QPNum(1) || wcs[0].Status != verbs.WCSuccess || wcs[0].ByteLen != 8 {
		t.Fatalf("QP 1's receive completed as %+v; want receive 11, 8 bytes, on QP %#x", wcs[0], p.A.QPNum(1))
	}
}

// TestForgedSRQCompletion: B's two QPs take their receives from one SRQ;
// A's QP 1 is honest, the peer of QP 0 forges. A receive of the SRQ that
// the forger completes is completed on QP 0, the QP whose ring it came
// from (any peer of the SRQ may take its receives); one the honest peer
// completed already is not completed again, and the forger is cut off.
func TestForgedSRQCompletion(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{QPs: 2, SRQ: true})
	b := p.B.(*verbstest.Local)
	buf := newRegion(t, p.B, 128, verbs.AccessLocalWrite)
	for i := range 2 {
		if _, err := b.SRQ.PostRecv([]verbs.RecvWR{recv(uint64(200+i), buf.SGE(64*i, 16))}); err != nil {
			t.Fatal(err)
		}
	}
	src := newRegion(t, p.A, 8, verbs.AccessLocalWrite)
	postSend(t, p.A, 1, send(1, src.SGE(0, 8)))
	if w := waitWCs(t, p.B, verbstest.RecvCQ, 1)[0]; w.WRID != 200 || w.QPNum != p.B.QPNum(1) {
		t.Fatalf("the honest peer's Send completed as %+v; want receive 200 on QP %#x", w, p.B.QPNum(1))
	}
	forger := connOf(driverQP(p.A.QPs[0])).peerCQ
	for _, pos := range []uint64{1, 0} {
		if !forger.produce(&driver.WorkCompletion{WRID: pos, Opcode: driver.WCRecv, ByteLen: 8, QPNum: p.B.QPNum(1)}, nil) {
			t.Fatal("the ring is full")
		}
	}
	got := pollCQ(b.RecvCQ)
	if len(got) != 1 || got[0].WRID != 201 || got[0].QPNum != p.B.QPNum(0) {
		t.Fatalf("the forger's completions of SRQ positions 1 and 0 came out %+v; want receive 201 on QP %#x alone", got, p.B.QPNum(0))
	}
	for deadline := time.Now().Add(waitLimit); ; {
		if a, err := b.QPs[0].Query(); err == nil && a.State == verbs.QPSErr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the forger's QP was not cut off")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestForgedReceiveCompletionsSanitized: what Poll hands the application
// of a receive A posted says only what a receive completion of shm0 can:
// a known status, a receive's opcode, the immediate and solicited flags
// alone, and for a success no more bytes than the receive holds; anything
// else comes out failed, with no byte count.
func TestForgedReceiveCompletionsSanitized(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	buf := newRegion(t, p.A, 256, verbs.AccessLocalWrite)
	forged := []driver.WorkCompletion{
		{Opcode: 77, ByteLen: 8},
		{Opcode: driver.WCRecv, ByteLen: 0xffffffff},
		{Opcode: driver.WCRecv, ByteLen: 8, Flags: driver.WCWithInv | 0x80, InvalidatedRKey: 5},
		{Opcode: driver.WCRecv, Status: 200},
	}
	for i := range forged {
		postRecv(t, p.A, 0, recv(uint64(100+i), buf.SGE(64*i, 64)))
		forged[i].WRID = uint64(i) // the receive's position
		forge(t, p, 0, forged[i])
	}
	wc := pollAll(p)
	if len(wc) != len(forged) {
		t.Fatalf("Poll returned %d completions, want %d", len(wc), len(forged))
	}
	for i, w := range wc {
		if w.WRID != uint64(100+i) {
			t.Errorf("completion %d: WRID %d", i, w.WRID)
		}
		if w.Opcode != verbs.WCRecv && w.Opcode != verbs.WCRecvRDMAWithImm {
			t.Errorf("completion %d: opcode %v", i, w.Opcode)
		}
		if w.Flags&^(verbs.WCWithImm|verbs.WCSolicited) != 0 || w.InvalidatedRKey != 0 {
			t.Errorf("completion %d: flags %v, invalidated key %#x", i, w.Flags, w.InvalidatedRKey)
		}
		if w.Status > verbs.WCGeneralErr {
			t.Errorf("completion %d: status %d", i, w.Status)
		}
	}
	for _, i := range []int{0, 1} {
		if wc[i].Status == verbs.WCSuccess || wc[i].ByteLen != 0 {
			t.Errorf("forged completion %d came out %+v; want a failure with no byte count", i, wc[i])
		}
	}
	if wc[2].Status != verbs.WCSuccess || wc[2].ByteLen != 8 || wc[2].Flags != 0 {
		t.Errorf("a plausible completion came out %+v; want a success of 8 bytes with no flags", wc[2])
	}
}

// FuzzForgedReceiveCompletions: whatever completions the peer writes
// into the ring of A's QP, each 16 bytes of the input one completion (a
// position, status, opcode, flags, whether it carries a message inline,
// byte count), what A polls names only receives A posted, each once, on
// A's QP, with a known status and flags, and a successful Send no longer
// than its receive; and nothing of A's region outside the receives'
// buffers is written.
func FuzzForgedReceiveCompletions(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0})
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 0, 0, 8, 3, 0, 255, 255, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 48, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 16, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 96, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		p := localHarness().NewPair(t, verbstest.PairOptions{})
		buf := newRegion(t, p.A, 256, verbs.AccessLocalWrite)
		before := pattern(1, 256)
		fill(t, p.A, buf, 0, before)
		lengths := map[uint64]uint32{}
		for i := range 4 {
			n := uint32(16 * (i + 1))
			lengths[uint64(100+i)] = n
			postRecv(t, p.A, 0, recv(uint64(100+i), buf.SGE(64*i, int(n))))
		}
		ring := connOf(driverQP(p.B.(*verbstest.Local).QPs[0])).peerCQ
		var inline sglist.List
		inline.One(bytes.Repeat([]byte{0xee}, inlineMax))
		for len(in) >= 16 {
			wc := driver.WorkCompletion{WRID: binary.LittleEndian.Uint64(in), Status: driver.WCStatus(in[8]),
				Opcode: driver.WCOpcode(in[9]), Flags: driver.WCFlags(in[10]), ByteLen: binary.LittleEndian.Uint32(in[12:])}
			payload := &inline
			if in[11]&1 == 0 {
				payload = nil
			}
			if !ring.produce(&wc, payload) {
				break
			}
			in = in[16:]
		}
		seen := map[uint64]bool{}
		for _, w := range pollAll(p) {
			n, posted := lengths[w.WRID]
			switch {
			case !posted || seen[w.WRID]:
				t.Fatalf("a completion of WRID %d, not posted or completed already: %+v", w.WRID, w)
			case w.QPNum != p.A.QPNum(0):
				t.Fatalf("a completion on QP %#x, not A's: %+v", w.QPNum, w)
			case w.Status > verbs.WCGeneralErr || w.Flags&^(verbs.WCWithImm|verbs.WCSolicited) != 0:
				t.Fatalf("a completion with an unknown status or flags: %+v", w)
			case w.Status == verbs.WCSuccess && w.Opcode == verbs.WCRecv && w.ByteLen > n:
				t.Fatalf("a successful Send of %d bytes into a receive of %d: %+v", w.ByteLen, n, w)
			}
			seen[w.WRID] = true
		}
		after := contents(t, p.A, buf, 0, 256)
		for i := range 4 {
			copy(after[64*i:64*i+16*(i+1)], before[64*i:]) // the receives' buffers
		}
		if !bytes.Equal(after, before) {
			t.Fatalf("the region was written outside the receives' buffers:\n%x", after)
		}
		expectCanaries(t, p.A, buf)
	})
}
