package verbstest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// shortWait bounds the waits that assert that something does not happen
// (an SRQ limit event that must not fire). Waits for things that must
// happen use timeout.
const shortWait = 100 * time.Millisecond

// Access rights the cases register regions with.
const (
	localRW   = verbs.AccessLocalWrite
	remoteAll = verbs.AccessLocalWrite | verbs.RemoteAccess
)

// badKey turns a valid key into one that names no region.
func badKey(k uint32) uint32 { return k ^ 0xdead0000 }

// pattern returns n bytes of a deterministic, non-periodic pattern; seeds
// give different patterns.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 | 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// newRegion registers a region on e, failing the test if it cannot.
func newRegion(t testing.TB, e Endpoint, size int, access verbs.AccessFlags) Region {
	t.Helper()
	r, err := e.NewRegion(size, access)
	if err != nil {
		t.Fatalf("new region of %d bytes with access %v: %v", size, access, err)
	}
	return r
}

// fill writes data into region r of e at off.
func fill(t testing.TB, e Endpoint, r Region, off int, data []byte) {
	t.Helper()
	if err := e.WriteRegion(r.ID, off, data); err != nil {
		t.Fatalf("write region %d: %v", r.ID, err)
	}
}

// contents returns n bytes of region r of e at off.
func contents(t testing.TB, e Endpoint, r Region, off, n int) []byte {
	t.Helper()
	b, err := e.ReadRegion(r.ID, off, n)
	if err != nil {
		t.Fatalf("read region %d: %v", r.ID, err)
	}
	return b
}

// expectBytes checks that region r of e holds want at off.
func expectBytes(t testing.TB, e Endpoint, r Region, off int, want []byte, what string) {
	t.Helper()
	got := contents(t, e, r, off, len(want))
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("%s: %d bytes at offset %d differ from byte %d: got %#x, want %#x",
			what, len(want), off, i, window(got, i), window(want, i))
	}
}

// expectZero checks that n bytes of region r of e at off are zero.
func expectZero(t testing.TB, e Endpoint, r Region, off, n int, what string) {
	t.Helper()
	expectBytes(t, e, r, off, make([]byte, n), what)
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// window returns up to 16 bytes of b from i, for messages.
func window(b []byte, i int) []byte { return b[min(i, len(b)):min(i+16, len(b))] }

// expectCanaries checks that the guard bytes around region r of e are
// intact: nothing wrote outside the region.
func expectCanaries(t testing.TB, e Endpoint, r Region) {
	t.Helper()
	ok, err := e.CanariesIntact(r.ID)
	if err != nil {
		t.Fatalf("check canaries of region %d: %v", r.ID, err)
	}
	if !ok {
		t.Fatalf("the guard bytes around region %d (%d bytes at %#x) were overwritten", r.ID, r.Len, r.Addr)
	}
}

// snapshot is the content of a region at one moment, to check later that
// nothing changed it.
type snapshot struct {
	e    Endpoint
	r    Region
	b    []byte
	name string
}

// snap takes a snapshot of region r of e.
func snap(t testing.TB, e Endpoint, r Region, name string) snapshot {
	t.Helper()
	return snapshot{e: e, r: r, b: contents(t, e, r, 0, r.Len), name: name}
}

// unchanged checks that the region still holds the snapshot's bytes and
// that its canaries are intact.
func (s snapshot) unchanged(t testing.TB) {
	t.Helper()
	expectBytes(t, s.e, s.r, 0, s.b, s.name+" must be unchanged")
	expectCanaries(t, s.e, s.r)
}

// alignedOff returns the smallest offset of r at or past from whose
// address is 8-byte aligned, as atomics need.
func alignedOff(r Region, from int) int {
	a := r.Addr + uint64(from)
	return from + int((8-a%8)%8)
}

// Work request builders. Every send WR is signaled; cases that want an
// unsignaled one clear SendSignaled.

func sendWR(wrid uint64, sg ...verbs.SGE) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: sg}
}

func writeWR(wrid uint64, dst Region, off int, sg ...verbs.SGE) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, SGList: sg,
		RemoteAddr: dst.Addr + uint64(off), RKey: dst.RKey}
}

func readWR(wrid uint64, src Region, off int, sg ...verbs.SGE) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled, SGList: sg,
		RemoteAddr: src.Addr + uint64(off), RKey: src.RKey}
}

func atomicWR(wrid uint64, op verbs.Opcode, dst Region, off int, result verbs.SGE, compareAdd, swap uint64) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: op, Flags: verbs.SendSignaled, SGList: []verbs.SGE{result},
		RemoteAddr: dst.Addr + uint64(off), RKey: dst.RKey, CompareAdd: compareAdd, Swap: swap}
}

func recvWR(wrid uint64, sg ...verbs.SGE) verbs.RecvWR {
	return verbs.RecvWR{WRID: wrid, SGList: sg}
}

// postSend posts wrs to QP qp of e and fails unless all were posted.
func postSend(t testing.TB, e Endpoint, qp int, wrs ...verbs.SendWR) {
	t.Helper()
	if n, err := e.PostSend(qp, wrs); n != len(wrs) || err != nil {
		t.Fatalf("PostSend of %d WRs on QP %d: posted %d: %v", len(wrs), qp, n, err)
	}
}

// postRecv posts wrs to QP qp of e and fails unless all were posted.
func postRecv(t testing.TB, e Endpoint, qp int, wrs ...verbs.RecvWR) {
	t.Helper()
	if n, err := e.PostRecv(qp, wrs); n != len(wrs) || err != nil {
		t.Fatalf("PostRecv of %d WRs on QP %d: posted %d: %v", len(wrs), qp, n, err)
	}
}

// expectRefused checks that a post was refused at its first WR with an
// error wrapping target.
func expectRefused(t testing.TB, what string, n int, err, target error) {
	t.Helper()
	expectRefusedAt(t, what, 0, n, err, target)
}

// expectRefusedAt checks that a post stopped at WR at with an error
// wrapping target.
func expectRefusedAt(t testing.TB, what string, at, n int, err, target error) {
	t.Helper()
	if n != at || !errors.Is(err, target) {
		t.Fatalf("%s: posted %d with error %v; want %d posted and an error wrapping %q", what, n, err, at, target)
	}
}

// wait collects exactly n completions from e's CQ kind, failing if they do
// not all come within timeout.
func wait(t testing.TB, e Endpoint, kind CQKind, n int) []verbs.WorkCompletion {
	t.Helper()
	wcs, err := e.Completions(kind, n, timeout)
	if err != nil {
		t.Fatalf("waiting for %d completions on the %v: %v (got %v)", n, kind, err, fmtWCs(wcs))
	}
	if len(wcs) != n {
		t.Fatalf("waiting for %d completions on the %v: got %d within %v: %v", n, kind, len(wcs), timeout, fmtWCs(wcs))
	}
	return wcs
}

// waitOne collects one completion from e's CQ kind.
func waitOne(t testing.TB, e Endpoint, kind CQKind) verbs.WorkCompletion {
	t.Helper()
	return wait(t, e, kind, 1)[0]
}

// expectEmpty checks that e's CQ kind holds no completion now.
func expectEmpty(t testing.TB, e Endpoint, kind CQKind) {
	t.Helper()
	wcs, err := e.Completions(kind, 0, 0)
	if err != nil {
		t.Fatalf("polling the %v: %v", kind, err)
	}
	if len(wcs) != 0 {
		t.Fatalf("the %v should hold no completion, it holds %v", kind, fmtWCs(wcs))
	}
}

// expectQuiet checks that no completion arrives on e's CQ kind for
// shortWait: something that must not complete yet does not.
func expectQuiet(t testing.TB, e Endpoint, kind CQKind, what string) {
	t.Helper()
	wcs, err := e.Completions(kind, 1, shortWait)
	if err != nil {
		t.Fatalf("waiting on the %v: %v", kind, err)
	}
	if len(wcs) != 0 {
		t.Fatalf("%s: the %v got %s", what, kind, fmtWCs(wcs))
	}
}

func (k CQKind) String() string {
	if k == RecvCQ {
		return "receive CQ"
	}
	return "send CQ"
}

func fmtWC(wc verbs.WorkCompletion) string {
	return fmt.Sprintf("{WRID %#x %v %v flags %#x len %d imm %#x qp %d src %d}",
		wc.WRID, wc.Status, wc.Opcode, wc.Flags, wc.ByteLen, wc.Imm, wc.QPNum, wc.SrcQP)
}

func fmtWCs(wcs []verbs.WorkCompletion) string {
	s := "["
	for i, wc := range wcs {
		if i > 0 {
			s += " "
		}
		s += fmtWC(wc)
	}
	return s + "]"
}

// expectStatus checks a completion's WRID and status.
func expectStatus(t testing.TB, wc verbs.WorkCompletion, wrid uint64, status verbs.WCStatus) {
	t.Helper()
	if wc.WRID != wrid || wc.Status != status {
		t.Fatalf("completion %s: want WRID %#x with status %q", fmtWC(wc), wrid, status)
	}
}

// expectStatuses checks that wcs are the completions of wrids, in order,
// all with status.
func expectStatuses(t testing.TB, wcs []verbs.WorkCompletion, status verbs.WCStatus, wrids ...uint64) {
	t.Helper()
	if len(wcs) != len(wrids) {
		t.Fatalf("got %d completions %s, want %d", len(wcs), fmtWCs(wcs), len(wrids))
	}
	for i := range wcs {
		expectStatus(t, wcs[i], wrids[i], status)
	}
}

// expectSendWC checks a successful requester completion.
func expectSendWC(t testing.TB, wc verbs.WorkCompletion, wrid uint64, op verbs.WCOpcode, qpNum uint32) {
	t.Helper()
	expectStatus(t, wc, wrid, verbs.WCSuccess)
	if wc.Opcode != op || wc.QPNum != qpNum {
		t.Fatalf("completion %s: want opcode %v on QP %d", fmtWC(wc), op, qpNum)
	}
}

// expectRecvWC checks a successful receive completion of n bytes on QP
// qpNum, with opcode op. It does not look at SrcQP, which ibv_poll_cq(3)
// defines for UD QPs only.
func expectRecvWC(t testing.TB, wc verbs.WorkCompletion, wrid uint64, op verbs.WCOpcode, n int, qpNum uint32) {
	t.Helper()
	expectStatus(t, wc, wrid, verbs.WCSuccess)
	if wc.Opcode != op || wc.ByteLen != uint32(n) || wc.QPNum != qpNum {
		t.Fatalf("receive completion %s: want opcode %v, %d bytes, QP %d", fmtWC(wc), op, n, qpNum)
	}
}

// do posts wr signaled on A's QP 0 and returns its completion, the only
// one the send CQ then holds.
func do(t testing.TB, p *Pair, wr verbs.SendWR) verbs.WorkCompletion {
	t.Helper()
	wr.Flags |= verbs.SendSignaled
	postSend(t, p.A, 0, wr)
	wc := waitOne(t, p.A, SendCQ)
	if wc.WRID != wr.WRID || wc.QPNum != p.A.QPNum(0) {
		t.Fatalf("completion %s: want WRID %#x on QP %d", fmtWC(wc), wr.WRID, p.A.QPNum(0))
	}
	expectEmpty(t, p.A, SendCQ) // one WR, one completion
	return wc
}

// expectState waits up to timeout for QP qp of e to be in state want:
// a peer's QP may reach it a moment after the requester's completion.
func expectState(t testing.TB, e Endpoint, qp int, want verbs.QPState) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var tick *time.Ticker
	for {
		s, err := e.QPState(qp)
		if err == nil && s == want {
			return
		}
		if tick == nil {
			tick = time.NewTicker(time.Millisecond)
			defer tick.Stop()
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("QP %d is in state %v (error %v), want %v within %v", qp, s, err, want, timeout)
		}
	}
}

// WRIDs the flush checks use.
const (
	flushSendID = 0xf1005e
	flushRecvID = 0xf100ec
)

// expectFlushAfterError checks that QP qp of e, in the error state, still
// takes work requests and flushes them: a send and a receive posted now
// complete with WCWRFlushErr, as soon as the device gets to them. The CQs
// must hold nothing else.
func expectFlushAfterError(t testing.TB, e Endpoint, qp int) {
	t.Helper()
	buf := newRegion(t, e, 16, localRW)
	postSend(t, e, qp, writeWR(flushSendID, buf, 0, buf.SGE(0, 8)))
	postRecv(t, e, qp, recvWR(flushRecvID, buf.SGE(8, 8)))
	expectStatus(t, waitOne(t, e, SendCQ), flushSendID, verbs.WCWRFlushErr)
	expectStatus(t, waitOne(t, e, RecvCQ), flushRecvID, verbs.WCWRFlushErr)
}

// bothLocal is why a case that puts both ends in the test's process
// skips in a harness with a remote B: the harness's addresses are B's.
const bothLocal = "B in another process: the case needs both ends in this one"

// requireCap skips the case when the device does not declare capability
// c, named name in the message.
func requireCap(t testing.TB, h Harness, c verbs.DeviceCaps, name string) {
	t.Helper()
	if !deviceAttr(t, h).Has(c) {
		skip(t, "no "+name)
	}
}

// deviceAttr returns the attributes of the harness's device, for cases
// that choose their pairs' options by them.
func deviceAttr(t testing.TB, h Harness) verbs.DeviceAttr {
	t.Helper()
	ctx, err := verbs.Open(h.Device)
	if err != nil {
		t.Fatalf("open %s: %v", h.Device, err)
	}
	defer ctx.Close()
	a := ctx.QueryDevice()
	a.Caps &^= h.Without
	return a
}
