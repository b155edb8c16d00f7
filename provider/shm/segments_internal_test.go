package shm

import (
	"bytes"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// connOf returns q's connection.
func connOf(q *qp) *conn {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.conn
}

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

// pushSegment has c send its peer segment id as the descriptor fd.
func pushSegment(c *conn, id uint32, fd int) {
	var m ctrl
	m.set(msgSeg, id, 1)
	c.wmu.Lock()
	c.sock.WriteMsgUnix(m[:], unix.UnixRights(fd), nil)
	c.wmu.Unlock()
}

// stallOnSegment has A post n RDMA Writes to a region of B whose key
// slot names a segment B never sent (777), and which B's reader cannot
// send (segMu is held until the test ends), and waits until A's
// requester waits for it. It returns B's connection, and a channel that
// PostSend's return closes.
func stallOnSegment(t *testing.T, p *verbstest.Pair, n int) (*conn, <-chan struct{}) {
	t.Helper()
	bq := driverQP(p.B.(*verbstest.Local).QPs[0])
	target := newRegion(t, p.B, 4096, driverRemoteAll)
	local := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	forgeGrant(bq, keyInfo{key: target.RKey, access: driverRemoteAll, kind: kindSegment, segID: 777,
		addr: target.Addr, length: 4096, pd: bq.pd.id})
	bq.ctx.segMu.Lock()
	t.Cleanup(bq.ctx.segMu.Unlock)
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		wrs[i] = rdma(uint64(i+1), verbs.OpRDMAWrite, local.SGE(0, 64), target, 0)
	}
	posted := make(chan struct{})
	go func() {
		defer close(posted)
		p.A.PostSend(0, wrs)
	}()
	waitForFrame(t, "shm.(*conn).segment(")
	return connOf(bq), posted
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
	ac := connOf(bq)
	r1 := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)
	r2 := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)
	src := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(1, 4096))
	postRecv(t, p.B, 0, verbs.RecvWR{WRID: 1, SGList: []verbs.SGE{r1.SGE(0, 64), r2.SGE(0, 64)}})
	s1 := bctx.lookupMR(r1.LKey).segID
	// The peer's key slot of r2 names a segment 777 not pushed yet, and
	// its reader cannot answer the request for it (segMu).
	forgeGrant(bq, keyInfo{key: r2.LKey, access: verbs.AccessLocalWrite, kind: kindSegment, segID: 777,
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
		pushSegment(ac, id, fd)
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

// TestPeerThatDoesNotReadIsDropped: a peer floods segment requests and
// never reads the answers. The reader blocked writing one while it held
// the context's segment lock, and every AllocMR, and the connection's
// close, waited for the peer for ever; now a control write that cannot
// go out within ctrlWriteTimeout ends the connection.
func TestPeerThatDoesNotReadIsDropped(t *testing.T) {
	q := victimQP(t)
	sock, att := socketPair(t)
	fds := hostileFDs(t, []byte{fdMedium, fdMedium, fdKeys, fdSmall, fdEvent})
	if err := unix.Sendmsg(att, validHello(16, 4, 16, false, nil), unix.UnixRights(fds...), nil, 0); err != nil {
		t.Fatal(err)
	}
	closeFDs(fds)
	h, rfds, err := readHello(sock, time.Now().Add(callBound), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := attach(q, sock, h, rfds)
	if err != nil {
		t.Fatal(err)
	}
	c.start()
	defer unix.Close(att)
	var m ctrl
	m.set(msgGetSeg, 12345, 0)
	// Until the victim's socket is full both ways: its reader is blocked
	// answering (the attacker never reads) and takes no more requests.
	for full := 0; full < 5000; {
		if unix.Sendmsg(att, m[:], nil, nil, unix.MSG_DONTWAIT) != nil {
			full++
			runtime.Gosched()
		} else {
			full = 0
		}
	}
	waitForFrame(t, "shm.(*conn).pushSegmentLocked(")
	done := make(chan error, 1)
	go func() {
		r, err := q.pd.AllocMR(4096, driver.AccessLocalWrite|driver.AccessRemoteRead)
		if err == nil {
			r.Dereg()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("AllocMR: %v", err)
		}
	case <-time.After(callBound):
		t.Fatal("AllocMR waits on a peer that does not read its socket")
	}
	closed := make(chan struct{})
	go func() { c.close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(callBound):
		t.Fatal("closing the connection waits on a peer that does not read its socket")
	}
}

// mappingPair makes a pair in this process and returns A's QP and
// connection, a 4 KiB region of B that A may reach and a local 4 KiB
// region of A: what the tests of A's mappings of B's segments read with.
func mappingPair(t *testing.T) (p *verbstest.Pair, vq *qp, vc *conn, target, local verbstest.Region) {
	t.Helper()
	p = localHarness().NewPair(t, verbstest.PairOptions{})
	vq = driverQP(p.A.QPs[0])
	vc = connOf(vq)
	target = newRegion(t, p.B, 4096, driverRemoteAll)
	local = newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	return p, vq, vc, target, local
}

// TestPeerMappingsBounded: a peer pushes far more segments than anyone
// needs (the same page under new ids). The requester keeps at most
// maxPeerMappings of them mapped: it mapped every one, until the process
// ran out of mappings (vm.max_map_count) and the runtime of memory.
func TestPeerMappingsBounded(t *testing.T) {
	p, vq, vc, target, local := mappingPair(t)
	fd := hostileFD(t, fdSmall)
	defer unix.Close(fd)
	id := uint32(1 << 20)
	for round := range 6 {
		// As the reader hands them over, in batches it does not drop.
		vc.arriveMu.Lock()
		for range maxArrivals - 1 {
			d, err := unix.Dup(fd)
			if err != nil {
				vc.arriveMu.Unlock()
				t.Fatal(err)
			}
			vc.arrivals = append(vc.arrivals, segReply{id: id, fd: d})
			id++
		}
		vc.arriveMu.Unlock()
		vc.setHold(holdDirty)
		postSend(t, p.A, 0, rdma(uint64(round), verbs.OpRDMARead, local.SGE(0, 64), target, 0))
		if wcs := waitWCs(t, p.A, verbstest.SendCQ, 1); wcs[0].Status != verbs.WCSuccess {
			t.Fatalf("round %d: Read completed with %v", round, wcs[0].Status)
		}
		vq.mu.Lock()
		n, retired := len(vc.segs), len(vc.retired)
		vq.mu.Unlock()
		if n > maxPeerMappings || retired != 0 {
			t.Fatalf("round %d: %d peer segments mapped (at most %d), %d retired ones left", round, n, maxPeerMappings, retired)
		}
	}
}

// TestDeathWhileAwaitingSegment: the requester waits for a segment the
// peer was asked for, and the peer dies. Its WRs are flushed within a
// second: the requester saw the death only when its wait timed out (2 s),
// since the goroutine that marks the connection ended needs the QP's
// lock, which the waiting requester holds.
func TestDeathWhileAwaitingSegment(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	bc, posted := stallOnSegment(t, p, 2)
	start := time.Now()
	bc.sock.Close() // what the kernel does when the peer is killed
	wcs := waitWCs(t, p.A, verbstest.SendCQ, 2)
	if d := time.Since(start); d > time.Second {
		t.Errorf("the WRs completed %v after the peer died (%v, %v), want within 1 s", d, wcs[0].Status, wcs[1].Status)
	}
	for _, wc := range wcs {
		if wc.Status == verbs.WCSuccess {
			t.Errorf("WR %d completed as a success", wc.WRID)
		}
	}
	<-posted
}

// mapsCount counts this process's mappings.
func mapsCount(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}

// TestPeerMappingsBoundedDuringWait: while a WR waits for a segment, the
// peer pushes thousands of others. They stay within the bound on peer
// mappings: each one the requester dropped stayed mapped until the WR
// was done, whether the WR used it or not.
func TestPeerMappingsBoundedDuringWait(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	base := mapsCount(t)
	bc, posted := stallOnSegment(t, p, 1)
	fd := hostileFD(t, fdSmall)
	defer unix.Close(fd)
	const pushes = 3 * maxPeerMappings
	peak := 0
	for i := range pushes {
		pushSegment(bc, uint32(1<<20+i), fd)
		if i%256 == 0 {
			peak = max(peak, mapsCount(t)-base)
		}
	}
	<-posted // the WR gave up on segment 777 (segWait)
	if peak > maxPeerMappings+64 {
		t.Errorf("%d more mappings during one WR's wait, with at most %d peer segments mapped", peak, maxPeerMappings)
	}
}

// holdsInode reports whether a descriptor of this process is open on
// the file of device and inode id.
func holdsInode(t *testing.T, id [2]uint64) bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat("/proc/self/fd/"+e.Name(), &st) == nil && st.Dev == id[0] && st.Ino == id[1] {
			return true
		}
	}
	return false
}

// TestRepeatedSegmentKeepsMapping: the peer pushes a segment the
// requester has mapped, as it is mapped (as when its push at the start
// of the connection crosses an answer to a request for it). The mapping
// is kept, nothing is retired or remapped, and the descriptor is closed;
// the same segment pushed with other rights is mapped anew.
func TestRepeatedSegmentKeepsMapping(t *testing.T) {
	p, vq, vc, target, local := mappingPair(t)
	read := func(id uint64) {
		t.Helper()
		postSend(t, p.A, 0, rdma(id, verbs.OpRDMARead, local.SGE(0, 64), target, 0))
		if wcs := waitWCs(t, p.A, verbstest.SendCQ, 1); wcs[0].Status != verbs.WCSuccess {
			t.Fatalf("Read %d completed with %v", id, wcs[0].Status)
		}
	}
	read(1)
	vq.mu.Lock()
	if len(vc.segs) != 1 {
		vq.mu.Unlock()
		t.Fatalf("%d peer segments mapped after one Read, want 1", len(vc.segs))
	}
	var id uint32
	var mapped *segment
	for i, s := range vc.segs {
		id, mapped = i, s
	}
	writable := vc.segRW[id]
	vq.mu.Unlock()
	var pushed [2]uint64 // the device and inode of the memfd pushed last
	push := func(writable bool) {
		t.Helper()
		fd := hostileFD(t, fdSmall)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		pushed = [2]uint64{st.Dev, st.Ino}
		vc.arriveMu.Lock()
		vc.arrivals = append(vc.arrivals, segReply{id: id, fd: fd, writable: writable})
		vc.arriveMu.Unlock()
		vc.setHold(holdDirty)
	}
	push(writable)
	read(2)
	vq.mu.Lock()
	same, retired := vc.segs[id] == mapped, len(vc.retired)
	vq.mu.Unlock()
	if !same || retired != 0 {
		t.Fatalf("after the same segment again: mapping kept %v, %d retired; want kept, none", same, retired)
	}
	if holdsInode(t, pushed) {
		t.Fatal("the repeated push's descriptor is still open")
	}
	push(!writable)
	read(3)
	vq.mu.Lock()
	same = vc.segs[id] == mapped
	vq.mu.Unlock()
	if same {
		t.Fatal("the segment pushed with other rights was not mapped anew")
	}
}

// forgeGrant writes k into the grant table q's peer reads, as a hostile
// owner would.
func forgeGrant(q *qp, k keyInfo) {
	q.grantMu.Lock()
	q.grants.publish(keytab.Index(k.key), k)
	q.grantMu.Unlock()
}
