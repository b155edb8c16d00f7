package shm

import (
	"runtime"
	"sync"
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestLocalRingSecondSender: a CQ's first sending QP produces into its
// ring of send completions with plain stores; a second QP that comes
// while the first produces makes every produce take a compare-and-swap
// (cq.addSender). Each QP produces under its own lock, as qp.Complete
// does, while the consumer takes them: every completion arrives once, in
// each QP's order. (Under -race, two producers filling one slot race.)
func TestLocalRingSecondSender(t *testing.T) {
	c := &cq{local: newLocalRing(64)}
	q1, q2 := &qp{qpCold: &qpCold{}}, &qp{qpCold: &qpCold{}}
	c.addSender(q1)
	const per = 20000
	produce := func(q *qp, base uint64) {
		for i := uint64(0); i < per; {
			q.mu.Lock()
			ok := c.local.produce(q, 0, base+i, driver.WCSuccess, driver.WCSend, 0, c.shared.Load())
			q.mu.Unlock()
			if ok {
				i++
			} else {
				runtime.Gosched() // full: the consumer drains it
			}
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); produce(q1, 0) }()
	go func() { defer wg.Done(); c.addSender(q2); produce(q2, 1<<32) }()
	next := map[*qp]uint64{q1: 0, q2: 1 << 32}
	var wc driver.WorkCompletion
	for got := 0; got < 2*per; {
		c.mu.Lock()
		q, _, ok := c.local.take(&wc)
		if !ok {
			c.mu.Unlock()
			runtime.Gosched()
			continue
		}
		if q == nil {
			q = c.firstSender
		}
		c.mu.Unlock()
		want, ok := next[q]
		if !ok {
			t.Fatalf("completion %#x names no sending QP", wc.WRID)
		}
		if wc.WRID != want {
			t.Fatalf("completion %#x, want %#x next from its QP", wc.WRID, want)
		}
		next[q] = want + 1
		got++
	}
	wg.Wait()
	if !c.shared.Load() {
		t.Fatal("a CQ with two sending QPs is not shared")
	}
}

// TestLocalRingQPNumbers: a completion names the QP whose WR it
// completes, while the CQ's first sending QP is its only one (produceOwn
// leaves the number the slots hold since addSender) and after a second
// came, in every slot of the ring.
func TestLocalRingQPNumbers(t *testing.T) {
	c := &cq{local: newLocalRing(4)}
	q1, q2 := &qp{qpCold: &qpCold{num: 0x101}}, &qp{qpCold: &qpCold{num: 0x202}}
	c.addSender(q1)
	var wc driver.WorkCompletion
	take := func(want *qp) {
		t.Helper()
		c.mu.Lock()
		q, _, ok := c.local.take(&wc)
		c.mu.Unlock()
		if !ok {
			t.Fatal("no completion to take")
		}
		if q == nil {
			q = c.firstSender
		}
		if q != want || wc.QPNum != want.num {
			t.Fatalf("completion of QP %#x names QP %#x (%p)", want.num, wc.QPNum, q)
		}
	}
	for i := range 6 { // past the ring's end
		if !c.local.produce(q1, 0, uint64(i), driver.WCSuccess, driver.WCRDMAWrite, 0, c.shared.Load()) {
			t.Fatal("ring full")
		}
		take(q1)
	}
	c.addSender(q2)
	for i := range 8 {
		q := q1
		if i%3 != 0 {
			q = q2
		}
		if !c.local.produce(q, 0, uint64(i), driver.WCSuccess, driver.WCRDMAWrite, 0, c.shared.Load()) {
			t.Fatal("ring full")
		}
		take(q)
	}
}
