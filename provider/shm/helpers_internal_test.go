package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Helpers shared by the white-box tests of this package.

// waitLimit bounds every wait for something that must happen.
const waitLimit = 10 * time.Second

// remoteHarness makes pairs whose B endpoint lives in a child process.
func remoteHarness() verbstest.Harness {
	return verbstest.Harness{Device: DeviceName, Addr: func(testing.TB) string { return uniqueAddr("pair") },
		Remote: verbstest.SpawnPeer(DeviceName)}
}

// localHarness makes pairs with both endpoints in this process.
func localHarness() verbstest.Harness {
	return verbstest.Harness{Device: DeviceName, Addr: func(testing.TB) string { return uniqueAddr("pair") }}
}

// toInit moves a fresh QP to Init, where it takes receives before it is
// connected (cm keeps them).
func toInit(q *verbs.QP) error {
	return q.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.RemoteAccess | verbs.AccessLocalWrite},
		verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags)
}

// driverQP is the provider's QP behind q.
func driverQP(q *verbs.QP) *qp { return q.Driver().(*qp) }

// pattern returns n bytes of a deterministic pattern; seeds differ.
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

func word(v uint64) []byte { return binary.NativeEndian.AppendUint64(nil, v) }

// newRegion registers a region with canaries on e.
func newRegion(t testing.TB, e verbstest.Endpoint, size int, access verbs.AccessFlags) verbstest.Region {
	t.Helper()
	r, err := e.NewRegion(size, access)
	if err != nil {
		t.Fatalf("new region of %d bytes: %v", size, err)
	}
	return r
}

func fill(t testing.TB, e verbstest.Endpoint, r verbstest.Region, off int, data []byte) {
	t.Helper()
	if err := e.WriteRegion(r.ID, off, data); err != nil {
		t.Fatal(err)
	}
}

func contents(t testing.TB, e verbstest.Endpoint, r verbstest.Region, off, n int) []byte {
	t.Helper()
	b, err := e.ReadRegion(r.ID, off, n)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func expectCanaries(t testing.TB, e verbstest.Endpoint, rs ...verbstest.Region) {
	t.Helper()
	for _, r := range rs {
		if ok, err := e.CanariesIntact(r.ID); err != nil || !ok {
			t.Fatalf("canaries around region %d: intact %v, error %v", r.ID, ok, err)
		}
	}
}

func postSend(t testing.TB, e verbstest.Endpoint, i int, wrs ...verbs.SendWR) {
	t.Helper()
	if n, err := e.PostSend(i, wrs); err != nil || n != len(wrs) {
		t.Fatalf("post %d sends: %d posted, %v", len(wrs), n, err)
	}
}

func postRecv(t testing.TB, e verbstest.Endpoint, i int, wrs ...verbs.RecvWR) {
	t.Helper()
	if n, err := e.PostRecv(i, wrs); err != nil || n != len(wrs) {
		t.Fatalf("post %d receives: %d posted, %v", len(wrs), n, err)
	}
}

// waitWCs collects exactly n completions from e's CQ, waiting up to
// waitLimit.
func waitWCs(t testing.TB, e verbstest.Endpoint, kind verbstest.CQKind, n int) []verbs.WorkCompletion {
	t.Helper()
	wcs, err := e.Completions(kind, n, waitLimit)
	if err != nil || len(wcs) != n {
		t.Fatalf("want %d completions, got %d (%v): %v", n, len(wcs), err, wcs)
	}
	return wcs
}

// expectWC checks a completion's WRID and status.
func expectWC(t testing.TB, wc verbs.WorkCompletion, wrid uint64, status verbs.WCStatus) {
	t.Helper()
	if wc.WRID != wrid || wc.Status != status {
		t.Fatalf("completion of WR %d with %v, want WR %d with %v", wc.WRID, wc.Status, wrid, status)
	}
}

func rdma(wrid uint64, op verbs.Opcode, local verbs.SGE, remote verbstest.Region, off int) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: op, Flags: verbs.SendSignaled, SGList: []verbs.SGE{local},
		RemoteAddr: remote.Addr + uint64(off), RKey: remote.RKey}
}

func atomicWR(wrid uint64, op verbs.Opcode, local verbs.SGE, remote verbstest.Region, off int, cmpAdd, swap uint64) verbs.SendWR {
	wr := rdma(wrid, op, local, remote, off)
	wr.CompareAdd, wr.Swap = cmpAdd, swap
	return wr
}

func send(wrid uint64, local verbs.SGE) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{local}}
}

func recv(wrid uint64, local verbs.SGE) verbs.RecvWR {
	return verbs.RecvWR{WRID: wrid, SGList: []verbs.SGE{local}}
}

// procState is the state letter of process pid (R, S, T, ...).
func procState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, fmt.Errorf("odd /proc/%d/stat: %q", pid, s)
	}
	return s[i+2], nil
}

// becomeUser makes this process (a test's child) run as user and group
// id, another user than the test's: what such a user may do is what the
// child then tries.
func becomeUser(id int) error {
	if err := syscall.Setgid(id); err != nil {
		return fmt.Errorf("setgid %d: %w", id, err)
	}
	if err := syscall.Setuid(id); err != nil {
		return fmt.Errorf("setuid %d: %w", id, err)
	}
	return nil
}

// allocMR allocates a region of n bytes on pd, deregistered when the
// test ends.
func allocMR(t testing.TB, pd *verbs.PD, n int, access verbs.AccessFlags) *verbs.MR {
	t.Helper()
	m, err := pd.AllocMR(n, access)
	if err != nil {
		t.Fatalf("AllocMR of %d bytes: %v", n, err)
	}
	t.Cleanup(func() { m.Dereg() })
	return m
}

// asNobody is the child mode child run as user and group 65534
// (nobody).
func asNobody(child func() int) func() int {
	return func() int {
		if err := becomeUser(65534); err != nil {
			return childFail("%v", err)
		}
		return child()
	}
}

// openShm opens shm0 with a PD and a CQ, closed when the test ends.
func openShm(t testing.TB) (*verbs.Context, *verbs.PD, *verbs.CQ) {
	t.Helper()
	ctx, err := verbs.Open(DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	return ctx, pd, cq
}

// smallQP creates a QP of pd, completing into cq, with room for four WRs
// of one SGE each way.
func smallQP(pd *verbs.PD, cq *verbs.CQ) (*verbs.QP, error) {
	return pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
}

// acceptAll accepts every request that comes to l with a fresh smallQP of
// pd and cq, until l is closed; the channel it returns is closed once it
// has stopped.
func acceptAll(l *cm.Listener, pd *verbs.PD, cq *verbs.CQ) <-chan struct{} {
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			req, err := l.Accept(context.Background())
			if err != nil {
				return
			}
			qp, err := smallQP(pd, cq)
			if err != nil {
				req.Reject(nil)
				continue
			}
			if _, err := req.Accept(qp, nil); err != nil {
				qp.Destroy()
			}
		}
	}()
	return served
}
