package shm

import (
	"errors"
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestSRQErrOnCorruptHead: a peer that writes the consumers' head of an
// SRQ's shared ring past the receives posted (or a ring's worth behind
// them) leaves the owner unable to account for its receives. The owner
// finds it by the time its posts fill what it last knew of the ring: the
// post is refused, the SRQ raises EventSRQErr once and refuses every
// later post, and the QPs that take their receives from it move to the
// error state with EventQPFatal; a QP of the SRQ still in Reset, and
// the SRQ's other users' state, are left alone. No QP of the failed SRQ
// leaves Reset again, and none is created on it: it could never
// receive.
func TestSRQErrOnCorruptHead(t *testing.T) {
	for _, tc := range []struct {
		name string
		head func(tail uint64) uint64
	}{
		{"AheadOfTail", func(tail uint64) uint64 { return tail + 1<<32 }},
		{"RingBehind", func(tail uint64) uint64 { return tail - 40 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dc, err := (&provider{}).Open(DeviceName)
			if err != nil {
				t.Fatal(err)
			}
			defer dc.Close()
			dp, err := dc.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			cq, err := dc.CreateCQ(64, nil)
			if err != nil {
				t.Fatal(err)
			}
			ds, err := dp.CreateSRQ(driver.SRQInitAttr{MaxWR: 16, MaxSGE: 1, UserCtx: "srq"})
			if err != nil {
				t.Fatal(err)
			}
			newQP := func(name string) driver.QP {
				q, err := dp.CreateQP(driver.QPInitAttr{Type: driver.QPTypeRC, SendCQ: cq, RecvCQ: cq, SRQ: ds, UserCtx: name,
					Cap: driver.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
				if err != nil {
					t.Fatal(err)
				}
				return q
			}
			inited, fresh := newQP("inited"), newQP("fresh")
			a := driver.QPAttr{State: driver.QPSInit, Port: 1, AccessFlags: driver.AccessLocalWrite}
			if err := inited.Modify(&a, driver.QPAttrState|driver.QPAttrPort|driver.QPAttrAccessFlags); err != nil {
				t.Fatal(err)
			}
			mr, err := dp.AllocMR(64, driver.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			wr := []driver.RecvWR{{WRID: 1, SGList: []driver.SGE{{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}}}}
			for range 4 {
				if _, err := ds.PostRecv(wr); err != nil {
					t.Fatalf("post to a sound SRQ: %v", err)
				}
			}
			s := ds.(*srq)
			s.ring.h.head.Store(tc.head(s.ring.tail)) // what a hostile peer may write

			var postErr error
			for range 17 { // the SRQ holds 16: it must have read the head by then
				if _, postErr = ds.PostRecv(wr); postErr != nil {
					break
				}
			}
			if !errors.Is(postErr, driver.ErrInvalidState) || !errors.Is(postErr, errSRQFailed) {
				t.Fatalf("posting to the SRQ with a corrupt head: %v, want the SRQ's failure", postErr)
			}
			if _, err := ds.PostRecv(wr); !errors.Is(err, errSRQFailed) {
				t.Fatalf("a later post to the failed SRQ: %v, want the SRQ's failure", err)
			}
			got := map[driver.EventType][]any{}
			for done := false; !done; {
				select {
				case ev := <-dc.Events():
					got[ev.Type] = append(got[ev.Type], ev.Element)
				default:
					done = true
				}
			}
			if e := got[driver.EventSRQErr]; len(e) != 1 || e[0] != "srq" {
				t.Fatalf("EventSRQErr about %v, want once about the SRQ (events: %v)", e, got)
			}
			if e := got[driver.EventQPFatal]; len(e) != 1 || e[0] != "inited" {
				t.Fatalf("EventQPFatal about %v, want once about the QP in Init (events: %v)", e, got)
			}
			for q, want := range map[driver.QP]driver.QPState{inited: driver.QPSErr, fresh: driver.QPSReset} {
				if a, err := q.Query(); err != nil || a.State != want {
					t.Fatalf("QP %d: state %v (error %v), want %v", q.Num(), a.State, err, want)
				}
			}
			reset := driver.QPAttr{State: driver.QPSReset}
			if err := inited.Modify(&reset, driver.QPAttrState); err != nil {
				t.Fatalf("reset a QP of the failed SRQ: %v", err)
			}
			for _, q := range []driver.QP{inited, fresh} {
				if err := q.Modify(&a, driver.QPAttrState|driver.QPAttrPort|driver.QPAttrAccessFlags); !errors.Is(err, errSRQFailed) {
					t.Fatalf("QP %d of the failed SRQ moved to Init: %v, want the SRQ's failure", q.Num(), err)
				}
			}
			if q, err := dp.CreateQP(driver.QPInitAttr{Type: driver.QPTypeRC, SendCQ: cq, RecvCQ: cq, SRQ: ds,
				Cap: driver.QPCap{MaxSendWR: 4, MaxSendSGE: 1}}); !errors.Is(err, errSRQFailed) {
				if err == nil {
					q.Destroy()
				}
				t.Fatalf("CreateQP on the failed SRQ: %v, want the SRQ's failure", err)
			}
			inited.Destroy()
			fresh.Destroy()
			mr.Dereg()
			ds.Destroy()
			cq.Destroy()
			dp.Dealloc()
		})
	}
}
