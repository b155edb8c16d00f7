package recvq

import (
	"errors"
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

func TestQueue(t *testing.T) {
	q := New(3, 2)
	sge := []driver.SGE{{Addr: 1, Length: 8, LKey: 9}}
	if err := q.Post(&driver.RecvWR{WRID: 1, SGList: []driver.SGE{{}, {}, {}}}); err == nil {
		t.Fatal("a WR with more SGEs than the queue takes was posted")
	}
	for i := range 3 {
		if err := q.Post(&driver.RecvWR{WRID: uint64(10 + i), SGList: sge}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Post(&driver.RecvWR{WRID: 13, SGList: sge}); !errors.Is(err, driver.ErrQueueFull) {
		t.Fatalf("a fourth receive in a queue of 3: %v, want ErrQueueFull", err)
	}
	sge[0].Addr = 2 // the queue keeps its own copy
	q.Limit = 2
	var w WR
	if ok, fire := q.Take(&w); !ok || fire || w.WRID != 10 || w.SGE[0].Addr != 1 {
		t.Fatalf("Take: %v %v %+v; want WR 10 with its own SGE, no limit event (2 left)", ok, fire, w)
	}
	if r := q.Peek(); r == nil || r.WRID != 11 {
		t.Fatalf("Peek: %+v, want WR 11", r)
	}
	if !q.Pop() || q.Limit != 0 {
		t.Fatal("Pop leaving 1 of a limit of 2 does not report the limit once and disarm")
	}
	if q.Pop() {
		t.Fatal("the limit event fired again without being rearmed")
	}
	if q.Peek() != nil {
		t.Fatal("Peek of an empty queue")
	}
	if ok, _ := q.Take(&w); ok {
		t.Fatal("Take of an empty queue")
	}
	q.Post(&driver.RecvWR{WRID: 20})
	q.Reset()
	if q.Peek() != nil {
		t.Fatal("Reset left a receive")
	}
}
