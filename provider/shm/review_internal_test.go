package shm

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Regressions from an adversarial review of the provider.

// waitForFrame waits until some goroutine's stack has frame in it.
func waitForFrame(t *testing.T, frame string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if strings.Contains(string(buf[:runtime.Stack(buf, true)]), frame) {
			return
		}
		runtime.Gosched()
	}
	t.Fatalf("no goroutine reached %s", frame)
}

// TestSendSurvivesRemappedSGE: a Send into a receive of two SGEs whose
// first SGE's segment the peer sends again (a new mapping replaces the
// old) while the requester resolves the second one. The old mapping, into
// which the first SGE was resolved, stays mapped until the Send is done:
// it was unmapped under it, and the copy faulted (SIGSEGV).
func TestSendSurvivesRemappedSGE(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	bq := driverQP(p.B.(*verbstest.Local).QPs[0])
	bctx := bq.ctx
	bq.mu.Lock()
	ac := bq.conn
	bq.mu.Unlock()
	r1 := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)
	r2 := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)
	src := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(1, 4096))
	postRecv(t, p.B, 0, verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{r1.SGE(0, 64), r2.SGE(0, 64)}})
	s1 := bctx.mrs[r1.LKey>>8].Load().segID
	// The peer's key slot of r2 names a segment 777 not pushed yet, and
	// its reader cannot answer the request for it (segMu).
	bctx.keys.publish(r2.LKey>>8, keyInfo{key: r2.LKey, access: verbs.AccessLocalWrite, kind: kindSegment, segID: 777,
		addr: r2.Addr, length: 4096, pd: bq.pd.id})
	bctx.segMu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.A.PostSend(0, []verbs.SendWR{send(9, src.SGE(0, 128))})
	}()
	waitForFrame(t, "shm.(*conn).segment(")
	push := func(id uint32) {
		fd := hostileFD(t, fdLarge)
		var m ctrl
		m.set(msgSeg, id, 1)
		ac.wmu.Lock()
		ac.sock.WriteMsgUnix(m[:], unix.UnixRights(fd), nil)
		ac.wmu.Unlock()
		unix.Close(fd)
	}
	push(s1)  // the first SGE's segment again: absorb replaces its mapping
	push(777) // the segment awaited
	<-done
	bctx.segMu.Unlock()
	if wcs := waitWCs(t, p.A, verbstest.SendCQ, 1); wcs[0].WRID != 9 {
		t.Fatalf("send completion %+v", wcs[0])
	}
}
