package shm

import (
	"sync/atomic"
	"testing"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/internal/spin"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The floor of a verbs-shaped RDMA Write and its Poll on shm0's memory
// layout: the least any implementation behind driver.QP's PostSend and
// driver.CQ's Poll can execute for one 8-byte Write and its completion.
// floorQP's PostSend is one interface call, one spin lock, one 8-byte
// copy into a shared segment and one completion written into a ring and
// published with a release store; floorCQ's Poll is one interface call,
// the lock, one completion loaded and handed over, and the slot freed. It
// checks nothing: no key, rights, bounds, state or queue depth, which is
// what shm0's PostSend adds (BenchmarkPostSendPoll/Write8). Counted by
// scripts/instructions.sh beside it, the difference is what the checks
// and the send queue's accounting cost.

type floorQP struct {
	mu     spin.Lock
	remote []byte // the peer's memory: a shared segment mapped here
	local  []byte
	cq     *floorCQ
	num    uint32
}

type floorCQ struct {
	mu    spin.Lock
	tail  uint64 // the producer's, under its QP's lock
	head  uint64 // the poller's, under mu
	slots [16]floorSlot
}

type floorSlot struct {
	seq atomic.Uint64 // pos+1 once the completion at pos is published
	wc  driver.WorkCompletion
}

func (q *floorQP) PostSend(wrs []driver.SendWR) (int, error) {
	q.mu.Lock()
	for i := range wrs {
		wr := &wrs[i]
		copySmall(q.remote[:8], q.local[:8])
		c := q.cq
		pos := c.tail
		s := &c.slots[pos%uint64(len(c.slots))]
		s.wc.WRID, s.wc.Opcode, s.wc.QPNum = wr.WRID, driver.WCRDMAWrite, q.num
		c.tail = pos + 1
		atomicrel.StoreUint64(&s.seq, pos+1)
	}
	q.mu.Unlock()
	return len(wrs), nil
}

func (c *floorCQ) Poll(wc []driver.WorkCompletion) int {
	c.mu.Lock()
	n := 0
	for n < len(wc) {
		pos := c.head
		s := &c.slots[pos%uint64(len(c.slots))]
		if s.seq.Load() != pos+1 {
			break
		}
		wc[n] = s.wc
		c.head = pos + 1
		n++
	}
	c.mu.Unlock()
	return n
}

// BenchmarkFloorWritePoll is BenchmarkPostSendPoll/Write8's loop on
// floorQP and floorCQ, called through the driver interfaces' methods.
func BenchmarkFloorWritePoll(b *testing.B) {
	seg, err := newSegment("floor", 4096)
	if err != nil {
		b.Fatal(err)
	}
	defer seg.close()
	var (
		qp interface {
			PostSend([]driver.SendWR) (int, error)
		}
		cq interface {
			Poll([]driver.WorkCompletion) int
		}
	)
	fcq := &floorCQ{}
	qp, cq = &floorQP{remote: seg.mem, local: make([]byte, 8), cq: fcq, num: 1}, fcq
	wr := []driver.SendWR{{Opcode: driver.OpRDMAWrite, Flags: driver.SendSignaled, SGList: []driver.SGE{{Length: 8}}}}
	wc := make([]driver.WorkCompletion, 4)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for cq.Poll(wc) == 0 {
		}
		if wc[0].Status != driver.WCSuccess {
			b.Fatal(wc[0].Status)
		}
	}
}
