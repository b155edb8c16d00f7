package ibverbs

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/verbs/driver"
)

// pollBatch is the most completions one Poll takes from the device.
const pollBatch = 32

// cq is a completion queue (struct ibv_cq) with its own completion
// channel, whose fd the runtime's poller watches.
type cq struct {
	ctx     *devContext
	p       uintptr // struct ibv_cq *
	channel uintptr // struct ibv_comp_channel *
	userCtx any
	notify  chan struct{}
	watcher *fdWatcher
	overrun atomic.Bool

	mu   sync.Mutex // the scratch array, the destroyed flag, last and poll
	dead bool
	wcs  [pollBatch]ibvWC
	// poll is the device's poll_cq with its arguments: the CQ, the
	// number of completions (set for each call), wcs; prepare sets it.
	poll cargs
	// last is the QP of the latest completion polled, looked up by its
	// number without the device's map and its lock; a QP's Destroy
	// clears it (forget), and a destroyed QP is never taken from it
	// (its number may be another's by then).
	last *qp
}

// lookUp returns the QP numbered num, nil if it is no longer, when last
// is not that QP: the device's map, whose answer last keeps. q.mu is
// held.
func (q *cq) lookUp(num uint32) *qp {
	q.ctx.qpsMu.RLock()
	p := q.ctx.qpByNum[num]
	q.ctx.qpsMu.RUnlock()
	q.last = p
	return p
}

// forget drops p from last: p is destroyed, and its number may be the
// kernel's to give to another.
func (q *cq) forget(p *qp) {
	q.mu.Lock()
	if q.last == p {
		q.last = nil
	}
	q.mu.Unlock()
}

func (c *devContext) CreateCQ(cqe int, userCtx any) (driver.CQ, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, driver.ErrClosed
	}
	ch, err := callPtr(lib.createCompChannel, c.p)
	if err != nil {
		return nil, errnoErr("ibv_create_comp_channel", err)
	}
	p, err := callPtr(lib.createCQ, c.p, uintptr(cqe), 0, ch, 0)
	if err != nil {
		call(lib.destroyCompChannel, ch)
		return nil, errnoErr("ibv_create_cq", err)
	}
	q := &cq{ctx: c, p: p, channel: ch, userCtx: userCtx, notify: make(chan struct{}, 1)}
	q.prepare()
	fd := int(*(*int32)(cptr(ch + offCompChannelFD)))
	if q.watcher, err = watchFD(fd, q.event); err != nil {
		call(lib.destroyCQ, p)
		call(lib.destroyCompChannel, ch)
		return nil, fmt.Errorf("ibverbs: watch a completion channel: %w", err)
	}
	c.own(p, q)
	return q, nil
}

// prepare binds the CQ's poll_cq to its arguments, once p is set.
func (q *cq) prepare() {
	q.poll = cargs{fn: q.ctx.pollCQ, a: [6]uintptr{q.p, 0, uintptr(unsafe.Pointer(&q.wcs[0]))}}
}

// event takes one completion event from the channel, acks it and sends
// the token; it reports false when there is none.
func (q *cq) event() bool {
	var evCQ, evCtx uintptr
	if r := int32(call(lib.getCQEvent, q.channel, uintptr(unsafe.Pointer(&evCQ)), uintptr(unsafe.Pointer(&evCtx)))); r != 0 {
		return false
	}
	call(lib.ackCQEvents, evCQ, 1)
	q.wake()
	return true
}

// wake sends the notification token, unless one is pending.
func (q *cq) wake() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// Poll is one call of the device's poll_cq for up to pollBatch
// completions.
func (q *cq) Poll(wc []driver.WorkCompletion) int {
	n := min(len(wc), pollBatch)
	if n == 0 {
		return 0
	}
	q.mu.Lock()
	if q.dead {
		q.mu.Unlock()
		return 0
	}
	q.poll.a[1] = uintptr(n)
	got := int(int32(ccall(&q.poll)))
	if got <= 0 {
		if got < 0 {
			q.overrun.Store(true)
		}
		q.mu.Unlock()
		return 0
	}
	cs := q.wcs[:got]
	wc = wc[:len(cs)]
	for i := range cs {
		w, c := &wc[i], &cs[i]
		// Read before fromIBVPlain's stores into w, after which the compiler
		// would read them again.
		status, opcode, num, src := driver.WCStatus(c.status), driver.WCOpcode(c.opcode), c.qpNum, c.srcQP
		fromIBVPlain(w, c)
		if c.wcFlags&(ibvWCWithImm|ibvWCWithInv|kernelWCWithInv) != 0 {
			q.flags(w, c)
		}
		p := q.last
		if p == nil || p.num != num || p.gone.Load() {
			// A destroyed QP is never taken from last: its number may be
			// another's by then.
			if p = q.lookUp(num); p == nil {
				continue
			}
		}
		// The opcode of a failed completion is not defined by the verbs; rxe
		// and siw set it, and the queue accounting relies on that.
		if opcode >= driver.WCRecv {
			if p.srq == nil && p.rqDone.Load() < p.rqPosted.Load() {
				// (Not a flush of a receive posted before a reset.)
				p.rqDone.Add(1)
			}
			if src == 0 && status == driver.WCSuccess {
				// RC devices (rxe) leave src_qp to UD; the QP knows its peer.
				w.SrcQP = p.destQPN.Load()
			}
		} else {
			p.sendDone(status == driver.WCSuccess)
		}
		if status != driver.WCSuccess && status != driver.WCWRFlushErr {
			// The QP is in the error state now.
			p.errored()
		}
	}
	q.mu.Unlock()
	return got
}

// fromIBV converts a struct ibv_wc.
func fromIBV(w *driver.WorkCompletion, c *ibvWC) {
	fromIBVPlain(w, c)
	if c.wcFlags&(ibvWCWithImm|ibvWCWithInv) != 0 {
		fromIBVFlags(w, c)
	}
}

// fromIBVPlain converts c but its flags, which it leaves 0 in w, with
// the immediate data and the invalidated rkey. It writes w's fields one
// by one (a struct literal is built aside and copied), and inlines.
func fromIBVPlain(w *driver.WorkCompletion, c *ibvWC) {
	// Every field read before the first store, which might be into c as
	// far as the compiler knows: Poll's own reads of c are the same.
	wrID, status, opcode, vendorErr, byteLen, num, src := c.wrID, c.status, c.opcode, c.vendorErr, c.byteLen, c.qpNum, c.srcQP
	w.WRID = wrID
	w.Status = driver.WCStatus(status)
	w.Opcode = driver.WCOpcode(opcode)
	w.Flags = 0
	w.VendorErr = vendorErr
	w.ByteLen = byteLen
	w.Imm, w.InvalidatedRKey = 0, 0
	w.QPNum = num
	w.SrcQP = src
}

// fromIBVFlags converts the immediate data and the invalidated rkey that
// the flags of c announce into w, which fromIBVPlain filled.
func fromIBVFlags(w *driver.WorkCompletion, c *ibvWC) {
	if c.wcFlags&ibvWCWithImm != 0 {
		w.Flags |= driver.WCWithImm
		w.Imm = netOrder(&c.immData)
	}
	if c.wcFlags&ibvWCWithInv != 0 {
		w.Flags |= driver.WCWithInv
		w.InvalidatedRKey = c.immData
	}
}

// flags is Poll's conversion of a completion with flags, out of line:
// fromIBVFlags, and the device's own flag of an invalidation.
func (q *cq) flags(w *driver.WorkCompletion, c *ibvWC) {
	fromIBVFlags(w, c)
	q.ctx.invalidated(w, c)
}

func (q *cq) ReqNotify(solicitedOnly bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return driver.ErrClosed
	}
	if q.ctx.removed.Load() {
		return q.ctx.removedErr()
	}
	s := uintptr(0)
	if solicitedOnly {
		s = 1
	}
	if err := callInt(q.ctx.reqNotifyCQ, q.p, s); err != nil {
		return errnoErr("ibv_req_notify_cq", err)
	}
	return nil
}

func (q *cq) Notify() <-chan struct{} { return q.notify }

// Err reports an overrun, or that the device is gone (Poll still takes
// the completions the CQ holds).
func (q *cq) Err() error {
	if q.overrun.Load() {
		return driver.ErrCQOverrun
	}
	if q.ctx.removed.Load() {
		return q.ctx.removedErr()
	}
	return nil
}

func (q *cq) Destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return driver.ErrClosed
	}
	if err := callInt(lib.destroyCQ, q.p); err != nil {
		return errnoErr("ibv_destroy_cq", err)
	}
	q.dead = true
	q.ctx.disown(q.p)
	q.watcher.stop()
	call(lib.destroyCompChannel, q.channel)
	return nil
}
