package grant

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestRebindUnderConcurrentChecks: while a type 1 window is rebound over
// and over, alternately to two ranges, concurrent checks never find a
// key granting a range other than the one it was bound with, and the key
// of a binding fails as soon as the rebind that replaced it returns (run
// under -race).
func TestRebindUnderConcurrentChecks(t *testing.T) {
	f := newFixture(t, all)
	w, err := AllocMW(&f.tab, driver.MWType1, f.pd)
	if err != nil {
		t.Fatal(err)
	}
	ranges := [2]uint64{0x1000, 0x1800}
	var (
		bound   sync.Map // key → the range it was bound to
		stop    atomic.Bool
		wg      sync.WaitGroup
		badMsg  atomic.Pointer[string]
		checked atomic.Int64
	)
	fail := func(s string) { badMsg.CompareAndSwap(nil, &s) }
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				k := w.RKey()
				var okAt []uint64
				for _, a := range ranges {
					if _, fl := Check(&f.tab, k, f.pd, f.qp, a, 16, driver.AccessRemoteRead); fl == OK {
						okAt = append(okAt, a)
					}
				}
				if len(okAt) > 1 {
					fail("one key granted both ranges")
					return
				}
				if len(okAt) == 1 {
					if want, known := bound.Load(k); known && want.(uint64) != okAt[0] {
						fail("a key granted a range it was not bound to")
						return
					}
					checked.Add(1)
				}
			}
		}()
	}
	for i := range 2000 {
		a := ranges[i%2]
		old := w.RKey()
		wr := driver.SendWR{Opcode: driver.OpBindMW, Bind: driver.MWBind{RKey: old, LKey: f.mr.key, Addr: a, Length: 16, Access: driver.AccessRemoteRead}}
		if st, _, _ := ExecuteBind(&f.tab, &wr, f.qp, f.pd, nil); st != driver.WCSuccess {
			t.Fatalf("bind %d: %v", i, st)
		}
		bound.Store(w.RKey(), a)
		if i > 0 {
			if _, fl := Check(&f.tab, old, f.pd, f.qp, ranges[(i+1)%2], 16, driver.AccessRemoteRead); fl == OK {
				t.Fatalf("bind %d: the previous binding's key still grants", i)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	if p := badMsg.Load(); p != nil {
		t.Fatal(*p)
	}
	if checked.Load() == 0 {
		t.Log("no concurrent check found the window bound")
	}
}
