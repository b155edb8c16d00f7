package shm

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// A QP's access flags bound what its peer is handed. The peer here is
// hostile: it ignores the QP's published rights and looks only at what
// it was handed — its grant table, read straight from the bytes, and the
// segments it mapped, writable or not — and asks for the segment
// writable itself.

// accessPair connects A (dialling) to B, whose QP is moved to Init with
// access first, and returns them with A's connection to B.
func accessPair(t *testing.T, access verbs.AccessFlags) (*verbstest.Local, *verbstest.Local, *conn) {
	t.Helper()
	return connectedPair(t, cm.ListenConfig{}, access)
}

// handed is what the hostile peer c holds of the region of key in segment
// seg: the rights its grant table names (and whether it names the key at
// all), whether asking for the segment writable gets it, and whether the
// segment is then mapped, and writable.
type handed struct {
	granted       bool
	rights        verbs.AccessFlags
	mapped, rw    bool
	writableAsked bool
}

// handedTo says what c holds; a mapping it holds must be writable by the
// MMU exactly when c says it is.
func handedTo(t *testing.T, c *conn, key, seg uint32) handed {
	var h handed
	s := c.keys.slot(keytab.Index(key))
	if s.key.Load() == key && s.kind.Load() != kindNone {
		h.granted, h.rights = true, verbs.AccessFlags(s.access.Load())&verbs.RemoteAccess
	}
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	_, h.writableAsked = c.segment(seg, true)
	c.afterWR()
	c.absorb()
	m, mapped := c.segs[seg]
	h.mapped, h.rw = mapped, c.segRW[seg]
	if mapped {
		if perms := mappingAt(t, m.mem).perms; (perms[1] == 'w') != h.rw {
			t.Fatalf("the peer's mapping of segment %d has permissions %s, writable %v", seg, perms, h.rw)
		}
	}
	return h
}

// writeOnce has A write 8 bytes into the region and returns the status.
func writeOnce(t *testing.T, a *verbstest.Local, target verbstest.Region, wrid uint64) verbs.WCStatus {
	t.Helper()
	local := newRegion(t, a, 8, verbs.AccessLocalWrite)
	fill(t, a, local, 0, pattern(int(wrid), 8))
	postSend(t, a, 0, rdma(wrid, verbs.OpRDMAWrite, local.SGE(0, 8), target, 0))
	return waitWCs(t, a, verbstest.SendCQ, 1)[0].Status
}

// TestQPAccessBoundsWhatThePeerHolds: B's QP grants remote read only, and
// its PD has a region granting every remote right alone in its segment.
// The peer's grant table names the region with remote read only, the
// segment is mapped read-only, and asked for writable it is refused. After
// a Modify in RTS that adds remote write, the peer is granted it and
// handed the segment writable; after one that takes it away again, its
// grant and (an honest peer's) mapping are read-only again and a Write
// fails. A QP with no remote right hands its peer neither the key nor the
// segment.
func TestQPAccessBoundsWhatThePeerHolds(t *testing.T) {
	const readOnly = verbs.AccessLocalWrite | verbs.AccessRemoteRead
	a, b, c := accessPair(t, readOnly)
	target := newRegion(t, b, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	seg := segmentOf(t, driverQP(b.QPs[0]).ctx, target.RKey)
	want := func(step string, h handed, granted bool, rights verbs.AccessFlags, rw bool) {
		t.Helper()
		if h.granted != granted || h.rights != rights || h.rw != rw || h.writableAsked != rw || (rw && !h.mapped) {
			t.Fatalf("%s: the peer holds %+v; want granted %v with remote rights %v, writable %v", step, h, granted, rights, rw)
		}
	}
	want("QP granting remote read", handedTo(t, c, target.RKey, seg), true, verbs.AccessRemoteRead, false)
	if st := writeOnce(t, a, target, 1); st != verbs.WCRemAccessErr {
		t.Fatalf("Write through a QP without remote write: %v", st)
	}

	// A's QP is in the error state after the refused Write: connect
	// again, and change B's rights in RTS.
	a, b, c = accessPair(t, readOnly)
	target = newRegion(t, b, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	seg = segmentOf(t, driverQP(b.QPs[0]).ctx, target.RKey)
	setAccess := func(acc verbs.AccessFlags) {
		t.Helper()
		if err := b.QPs[0].Modify(&verbs.QPAttr{AccessFlags: acc}, verbs.QPAttrAccessFlags); err != nil {
			t.Fatalf("Modify in RTS to %v: %v", acc, err)
		}
	}
	setAccess(readOnly | verbs.AccessRemoteWrite)
	want("after a Modify adding remote write", handedTo(t, c, target.RKey, seg), true, verbs.AccessRemoteRead|verbs.AccessRemoteWrite, true)
	if st := writeOnce(t, a, target, 2); st != verbs.WCSuccess {
		t.Fatalf("Write once remote write is granted: %v", st)
	}
	setAccess(readOnly)
	// The segment comes again read-only over the socket: wait for the
	// honest peer to have mapped it so.
	deadline := time.Now().Add(waitLimit)
	for {
		h := handedTo(t, c, target.RKey, seg)
		if !h.rw || time.Now().After(deadline) {
			want("after a Modify taking remote write away", h, true, verbs.AccessRemoteRead, false)
			break
		}
		time.Sleep(time.Millisecond)
	}
	if st := writeOnce(t, a, target, 3); st != verbs.WCRemAccessErr {
		t.Fatalf("Write after remote write was taken away: %v", st)
	}

	_, b, c = accessPair(t, verbs.AccessLocalWrite)
	target = newRegion(t, b, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	seg = segmentOf(t, driverQP(b.QPs[0]).ctx, target.RKey)
	if h := handedTo(t, c, target.RKey, seg); h.granted || h.mapped || h.writableAsked {
		t.Fatalf("QP with no remote right: the peer holds %+v", h)
	}
}
