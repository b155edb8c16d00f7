package shm

import (
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestSRQLimitEventOncePerArming: a peer's reports that the SRQ fell
// below its limit raise the limit event once per arming, and only once
// the shared limit word is disarmed: a peer sending report after report
// filled the context's event queue, pushing out the events after them.
func TestSRQLimitEventOncePerArming(t *testing.T) {
	dc, err := (&provider{}).Open(DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	dp, err := dc.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := dp.CreateSRQ(driver.SRQInitAttr{MaxWR: 16, MaxSGE: 1, Limit: 4})
	if err != nil {
		t.Fatal(err)
	}
	s := ds.(*srq)
	events := func() (n int) {
		for {
			select {
			case ev := <-dc.Events():
				if ev.Type == driver.EventSRQLimitReached {
					n++
				}
			default:
				return n
			}
		}
	}
	for range 100 {
		s.limitReached() // armed, but the word not disarmed: forged
	}
	if n := events(); n != 0 {
		t.Fatalf("%d limit events from reports the limit word does not bear out, want none", n)
	}
	s.ring.h.state.Store(0) // a consumer disarms it, and reports
	for range 100 {
		s.limitReached()
	}
	if n := events(); n != 1 {
		t.Fatalf("%d limit events from one arming, want 1", n)
	}
	if err := ds.Modify(driver.SRQAttr{Limit: 2}, driver.SRQAttrLimit); err != nil {
		t.Fatal(err)
	}
	s.ring.h.state.Store(0)
	s.limitReached()
	if n := events(); n != 1 {
		t.Fatalf("%d limit events after arming again, want 1", n)
	}
	ds.Destroy()
	dp.Dealloc()
}
