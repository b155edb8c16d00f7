package shm

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Access rights enforced by the MMU: a peer maps a segment read-only
// unless a region on it grants remote write or atomics (or it holds
// receive buffers), and never maps a segment without remote rights at
// all. These tests run both endpoints in this process, so that they can
// look at the requester's mappings of the responder's segments.

// mapping is a line of /proc/self/maps.
type mapping struct {
	start, end uint64
	perms      string
	path       string
}

// mappingAt returns the mapping that starts at the first byte of b.
func mappingAt(t testing.TB, b []byte) mapping {
	t.Helper()
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || start != addr {
			continue
		}
		m := mapping{start: start, end: end, perms: fields[1]}
		if len(fields) > 5 {
			m.path = strings.Join(fields[5:], " ")
		}
		return m
	}
	t.Fatalf("no mapping starts at %#x", addr)
	return mapping{}
}

// segmentOf returns the AllocMR segment id of the region of key in ctx.
func segmentOf(t testing.TB, ctx *devCtx, key uint32) uint32 {
	t.Helper()
	ctx.mu.RLock()
	defer ctx.mu.RUnlock()
	m := ctx.lookupMR(key)
	if m == nil || m.si == nil {
		t.Fatalf("key %#x names no region in shared memory", key)
	}
	for id, si := range ctx.segs {
		if si == m.si {
			return id
		}
	}
	t.Fatalf("the segment of key %#x is not registered", key)
	return 0
}

// peerSegment returns the requester's mapping of the responder's segment
// id, or nil.
func peerSegment(q *qp, id uint32) *segment {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.conn.segs[id]
}

// writeFaults writes b[0] and reports the fault address if the write
// faulted instead of landing.
func writeFaults(b []byte) (addr uintptr, faulted bool) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(interface{ Addr() uintptr }); ok {
				addr, faulted = e.Addr(), true
				return
			}
			panic(r)
		}
	}()
	b[0] ^= 0xff
	return 0, false
}

// TestReadOnlyRegionMappedReadOnly: after an RDMA Read of a region
// without remote write, the requester maps its memfd ("goverbs-mr")
// read-only and shared (r--s) — a store through that mapping faults in
// the MMU — while a region with remote write is mapped rw-s; an RDMA
// Write to the read-only region fails with WCRemAccessErr and changes
// nothing. The peer's key table is mapped read-only too.
func TestReadOnlyRegionMappedReadOnly(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	b := p.B.(*verbstest.Local)
	bctx := driverQP(b.QPs[0]).ctx
	aq := driverQP(p.A.QPs[0])

	ro := newRegion(t, p.B, 256, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	rw := newRegion(t, p.B, 256, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	fill(t, p.B, ro, 0, pattern(1, 256))
	fill(t, p.B, rw, 0, pattern(2, 256))
	dst := newRegion(t, p.A, 512, verbs.AccessLocalWrite)
	postSend(t, p.A, 0,
		rdma(1, verbs.OpRDMARead, dst.SGE(0, 256), ro, 0),
		rdma(2, verbs.OpRDMARead, dst.SGE(256, 256), rw, 0))
	for i, wc := range waitWCs(t, p.A, verbstest.SendCQ, 2) {
		expectWC(t, wc, uint64(i+1), verbs.WCSuccess)
	}
	if !bytes.Equal(contents(t, p.A, dst, 0, 256), pattern(1, 256)) || !bytes.Equal(contents(t, p.A, dst, 256, 256), pattern(2, 256)) {
		t.Fatal("RDMA Reads returned wrong bytes")
	}

	roSeg := peerSegment(aq, segmentOf(t, bctx, ro.RKey))
	rwSeg := peerSegment(aq, segmentOf(t, bctx, rw.RKey))
	if roSeg == nil || rwSeg == nil {
		t.Fatal("the requester has not mapped the segments it read")
	}
	for _, c := range []struct {
		what  string
		mem   []byte
		perms string
		name  string
	}{
		{"the read-only region's segment", roSeg.mem, "r--s", "/memfd:goverbs-mr"},
		{"the writable region's segment", rwSeg.mem, "rw-s", "/memfd:goverbs-mr"},
		{"the peer's grant table", aq.conn.keySeg.mem, "r--s", "/memfd:goverbs-grants"},
	} {
		m := mappingAt(t, c.mem)
		if m.perms != c.perms || !strings.HasPrefix(m.path, c.name) {
			t.Errorf("%s is mapped %s %q, want %s %s", c.what, m.perms, m.path, c.perms, c.name)
		}
		t.Logf("%s: %#x-%#x %s %s", c.what, m.start, m.end, m.perms, m.path)
	}
	// The MMU, not only the provider's checks, refuses a store.
	if addr, ok := writeFaults(roSeg.mem); !ok || addr != uintptr(unsafe.Pointer(&roSeg.mem[0])) {
		t.Fatalf("a store into the read-only mapping did not fault (fault %v at %#x)", ok, addr)
	}

	postSend(t, p.A, 0, rdma(3, verbs.OpRDMAWrite, dst.SGE(256, 64), ro, 0))
	expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 3, verbs.WCRemAccessErr)
	if s, err := p.A.QPState(0); err != nil || s != verbs.QPSErr {
		t.Fatalf("requester QP in %v (%v) after the refused Write, want ERR", s, err)
	}
	if !bytes.Equal(contents(t, p.B, ro, 0, 256), pattern(1, 256)) {
		t.Fatal("the refused RDMA Write changed the read-only region")
	}
	expectCanaries(t, p.B, ro, rw)
}

// TestPrivateRegionNeverShared: at the control-message level, a peer
// that asks for the segment of a region without remote rights gets an
// answer without a descriptor, for reading or writing, and so does one
// that asks for a segment that does not exist; one that asks to write a
// read-only region's segment gets a read-only descriptor, which the
// kernel refuses to map writable. A segment whose regions all belong to
// another PD than the QP's is neither pushed to its peer nor served.
func TestPrivateRegionNeverShared(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	b := p.B.(*verbstest.Local)
	bctx := driverQP(b.QPs[0]).ctx
	c := driverQP(p.A.QPs[0]).conn

	// await takes the next answer or push for segment id from the
	// arrivals, before the requester sees it (it posts nothing, and so
	// takes none); ask sends a raw request for segment id and awaits the
	// answer.
	q := driverQP(p.A.QPs[0])
	await := func(id uint32) segReply {
		t.Helper()
		timer := time.NewTimer(waitLimit)
		defer timer.Stop()
		for {
			select {
			case <-c.segNote:
				c.arriveMu.Lock()
				for i, r := range c.arrivals {
					if r.id == id {
						c.arrivals = append(c.arrivals[:i], c.arrivals[i+1:]...)
						c.arriveMu.Unlock()
						return r
					}
				}
				c.arriveMu.Unlock()
			case <-timer.C:
				t.Fatalf("no answer to the request for segment %d", id)
			}
		}
	}
	ask := func(id uint32, write bool) segReply {
		t.Helper()
		q.mu.Lock()
		defer q.mu.Unlock()
		w := uint32(0)
		if write {
			w = 1
		}
		c.sendCtrl(msgGetSeg, id, w)
		return await(id)
	}

	priv := newRegion(t, p.B, 256, verbs.AccessLocalWrite)
	privID := segmentOf(t, bctx, priv.LKey)
	for _, write := range []bool{false, true} {
		if r := ask(privID, write); r.fd >= 0 {
			unix.Close(r.fd)
			t.Fatalf("a peer asking for a private region's segment (write %v) got a descriptor", write)
		}
	}
	if r := ask(1<<31, false); r.fd >= 0 {
		unix.Close(r.fd)
		t.Fatal("a peer asking for a segment that does not exist got a descriptor")
	}

	ro := newRegion(t, p.B, 256, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	r := ask(segmentOf(t, bctx, ro.RKey), true)
	if r.fd < 0 || r.writable {
		t.Fatalf("asking to write a read-only region's segment: descriptor %d, writable %v; want a read-only descriptor", r.fd, r.writable)
	}
	defer unix.Close(r.fd)
	if fl, err := unix.FcntlInt(uintptr(r.fd), unix.F_GETFL, 0); err != nil || fl&unix.O_ACCMODE != unix.O_RDONLY {
		t.Fatalf("descriptor flags %#x (%v), want O_RDONLY", fl, err)
	}
	if m, err := unix.Mmap(r.fd, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); !errors.Is(err, unix.EACCES) {
		if err == nil {
			unix.Munmap(m)
		}
		t.Fatalf("mapping the read-only descriptor writable: %v, want EACCES", err)
	}

	// A region of another PD, with every remote right, is not the
	// business of a peer of this QP's PD: neither pushed nor served.
	pd2, err := b.Ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd2.Dealloc()
	other, err := pd2.AllocMR(256, verbs.AccessLocalWrite|verbs.RemoteAccess)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Dereg()
	otherID := segmentOf(t, bctx, other.RKey())
	for _, write := range []bool{false, true} {
		if r := ask(otherID, write); r.fd >= 0 {
			unix.Close(r.fd)
			t.Fatalf("a peer of another PD asking for a region's segment (write %v) got a descriptor", write)
		}
	}

	// Nor does a region of the QP's PD that peers do not reach (local
	// rights only, no receive posted) inside another PD's segment hand
	// the peer that segment, though the other PD's region may be written
	// remotely; a receive posted into it does, writable.
	host, err := pd2.AllocMR(256, verbs.AccessLocalWrite|verbs.RemoteAccess)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Dereg()
	hostID := segmentOf(t, bctx, host.RKey())
	local, err := b.PD.RegMR(host.Bytes()[:64], verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Dereg()
	if r := ask(hostID, true); r.fd >= 0 {
		unix.Close(r.fd)
		t.Fatal("a local-only region of the QP's PD in another PD's remotely writable segment handed the peer that segment")
	}
	if _, err := b.QPs[0].PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{local.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	recv := await(hostID)
	q.mu.Unlock()
	if recv.fd < 0 || !recv.writable {
		t.Fatalf("a receive posted into the QP's PD's region handed the peer %+v, want a writable descriptor", recv)
	}
	unix.Close(recv.fd)

	// Once the last region of the QP's PD leaves a segment that regions
	// of another PD keep alive, the peer is told it is gone.
	shared, err := b.PD.AllocMR(256, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	sharedID := segmentOf(t, bctx, shared.RKey())
	q.mu.Lock()
	pushed := await(sharedID) // pushed at once: a region the peer may read
	q.mu.Unlock()
	if pushed.fd < 0 || pushed.gone {
		t.Fatalf("the peer of the QP's PD got %+v for a segment with a region it may read, want a descriptor", pushed)
	}
	unix.Close(pushed.fd)
	kept, err := pd2.RegMR(shared.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Dereg()
	if segmentOf(t, bctx, kept.RKey()) != sharedID {
		t.Fatal("a region registered inside an AllocMR region is not in its segment")
	}
	if err := shared.Dereg(); err != nil {
		t.Fatal(err)
	}
	q.mu.Lock()
	gone := await(sharedID)
	q.mu.Unlock()
	if !gone.gone {
		t.Fatalf("after the last region of the QP's PD left segment %d the peer got %+v, want it gone", sharedID, gone)
	}
}
