package ibverbs

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// postBatch is the most work requests one foreign call posts.
const postBatch = 32

// emptySGE is the one SGE of a receive posted with none.
var emptySGE ibvSGE

// qp is an RC queue pair (struct ibv_qp).
type qp struct {
	pd      *pd
	ctx     *devContext
	p       uintptr // struct ibv_qp *
	num     uint32
	cap     driver.QPCap
	srq     *srq
	cqs     [2]*cq // send, receive: their caches of the QP (cq.last)
	userCtx any
	state   atomic.Uint32 // driver.QPState, as last set or queried
	gone    atomic.Bool   // destroyed; set with sendMu and recvMu held
	destQPN atomic.Uint32 // the connected QP's number, for receive completions
	// resets counts the QP's moves to Reset: a connection made before
	// the last one no longer owns the QP (conn.resets).
	resets atomic.Uint64
	// cmConn is the QP's latest rdma_cm connection, ended before a new
	// one is made once the QP was reset.
	cmConn atomic.Pointer[conn]

	sigAll bool

	// The send and receive queues' occupancy, kept by the provider
	// because devices round their queues up: PostSend and PostRecv
	// refuse with ErrQueueFull beyond the capacities asked for. A send
	// WR is retired by its own completion or, unsignaled, by the next
	// signaled one's; sqMarks holds the send count at each signaled WR.
	sqPosted, sqRetired atomic.Uint64
	rqPosted, rqDone    atomic.Uint64
	sqMu                sync.Mutex
	sqMarks             []uint64 // ring of MaxSendWR
	sqHead, sqLen       int

	sendMu  sync.Mutex
	swr     [postBatch]ibvSendWR
	sendBad uintptr // post_send's bad_wr
	recvMu  sync.Mutex
	rwr     [postBatch]ibvRecvWR
	recvBad uintptr // post_recv's bad_wr
	// sendCall and recvCall are the device's post_send and post_recv
	// with their arguments: the QP, the list (swr, rwr), the bad WR
	// (sendBad, recvBad); prepare sets them.
	sendCall, recvCall cargs
	// plainOps has a bit for each opcode whose send WRs the QP and its
	// device take with no check but their SGE count against MaxSendSGE;
	// inlineOps those of them that may be inline (they read local
	// memory). prepare sets them; checkSend's quick path reads them.
	plainOps, inlineOps uint32
	// inlineLKey and [inlineStart, inlineEnd) are the lkey and bytes of
	// the region the latest inline payload of one SGE lay in, found when
	// the PD's regions counted inlineGen (inlineEnd 0: none). Its bounds,
	// not the region: a deregistered region's memory is not kept alive.
	// sendMu guards them.
	inlineLKey             uint32
	inlineStart, inlineEnd uint64
	inlineGen              uint64

	mu      sync.Mutex // attr, errAttr, dead, granted, grantSet
	attr    driver.QPAttr
	errAttr ibvQPAttr // for errored, on the heap so the poll path allocates nothing
	dead    bool

	// granted are the access flags the user gave the QP by Modify
	// since its last Reset (grantSet): cm keeps them when it connects
	// the QP instead of the ones rdma_init_qp_attr proposes.
	granted  driver.AccessFlags
	grantSet bool

	mwq mwQueue // binds of memory windows (mw.go)
}

// errored records that the QP moved to the error state on its own (a
// failed completion says so) and has the device flush its receive
// queue: rxe's responder flushes posted receives only when it runs, and
// receives are posted without a system call, so nothing would run it.
// Moving the QP to the error state again does.
func (q *qp) errored() {
	q.state.Store(uint32(driver.QPSErr))
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return
	}
	q.attr.State = driver.QPSErr
	q.errAttr = ibvQPAttr{qpState: uint32(driver.QPSErr)}
	callInt(lib.modifyQP, q.p, uintptr(unsafe.Pointer(&q.errAttr)), ibvQPState)
}

func (d *pd) CreateQP(a driver.QPInitAttr) (driver.QP, error) {
	c := d.ctx
	send, recv, s, err := soft.CheckQPInit[*cq, *srq](a, "ibverbs", c.attr.MaxSGE, c.attr.MaxInlineData)
	if err != nil {
		return nil, err
	}
	if s != nil && s.pd != d {
		return nil, fmt.Errorf("%w: the SRQ belongs to another PD", driver.ErrInvalidArg)
	}
	ia := ibvQPInitAttr{sendCQ: send.p, recvCQ: recv.p, qpType: ibvQPTypeRC,
		cap: ibvQPCap{maxSendWR: a.Cap.MaxSendWR, maxRecvWR: a.Cap.MaxRecvWR, maxSendSGE: a.Cap.MaxSendSGE,
			maxRecvSGE: a.Cap.MaxRecvSGE, maxInlineData: a.Cap.MaxInlineData}}
	if s != nil {
		ia.srq = s.p
		ia.cap.maxRecvWR, ia.cap.maxRecvSGE = 0, 0
	}
	if a.SigAll {
		ia.sqSigAll = 1
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, driver.ErrClosed
	}
	p, err := callPtr(lib.createQP, d.p, uintptr(unsafe.Pointer(&ia)))
	if err != nil {
		return nil, errnoErr("ibv_create_qp", err)
	}
	q := &qp{pd: d, ctx: c, p: p, num: *(*uint32)(cptr(p + offQPNum)), cap: a.Cap, srq: s, cqs: [2]*cq{send, recv}, userCtx: a.UserCtx}
	q.attr.Cap = a.Cap
	q.sigAll = a.SigAll
	q.sqMarks = make([]uint64, max(a.Cap.MaxSendWR, 1))
	q.prepare()
	d.qps[q] = struct{}{}
	c.own(p, q)
	c.qpsMu.Lock()
	c.qpByNum[q.num] = q
	c.qpsMu.Unlock()
	return q, nil
}

// prepare sets what the data path derives from the QP's fields, once
// they are set: its foreign calls, bound to their arguments, and the
// opcodes of checkSend's quick path.
func (q *qp) prepare() {
	q.sendCall = cargs{fn: q.ctx.postSend, a: [6]uintptr{q.p, uintptr(unsafe.Pointer(&q.swr[0])), uintptr(unsafe.Pointer(&q.sendBad))}}
	q.recvCall = cargs{fn: q.ctx.postRecv, a: [6]uintptr{q.p, uintptr(unsafe.Pointer(&q.rwr[0])), uintptr(unsafe.Pointer(&q.recvBad))}}
	caps := q.ctx.attr.Caps
	plain := uint32(1<<driver.OpSend | 1<<driver.OpRDMAWrite)
	if caps&driver.CapImmData != 0 {
		plain |= 1<<driver.OpSendWithImm | 1<<driver.OpRDMAWriteWithImm
	}
	if caps&driver.CapMemoryWindows != 0 {
		plain |= 1 << driver.OpSendWithInv
	}
	if q.ctx.maxSGERd >= int(q.cap.MaxSendSGE) {
		// Within MaxSendSGE, a Read's SGEs are within the device's
		// limit too.
		plain |= 1 << driver.OpRDMARead
	}
	q.plainOps, q.inlineOps = plain, 0
	for op := range driver.Opcode(32) {
		if plain&(1<<op) != 0 && op.ReadsLocal() {
			q.inlineOps |= 1 << op
		}
	}
}

func (q *qp) Num() uint32 { return q.num }

// PostSend converts wrs into struct ibv_send_wr lists of up to postBatch
// and posts each with one call of the device's post_send. The SGE lists
// are passed as they are: driver.SGE has struct ibv_sge's layout. One WR
// that binds no window, to a QP past RTR, goes straight to postOne, the
// latency path; anything else takes the general path (postSendAll).
func (q *qp) PostSend(wrs []driver.SendWR) (int, error) {
	if len(wrs) != 1 || wrs[0].Opcode == driver.OpBindMW || driver.QPState(q.state.Load()) <= driver.QPSRTR {
		return q.postSendAll(wrs)
	}
	q.sendMu.Lock()
	n, err := q.postOne(&wrs[0])
	q.sendMu.Unlock()
	return n, err
}

// postSendAll is PostSend for any WRs, with every check.
func (q *qp) postSendAll(wrs []driver.SendWR) (int, error) {
	switch driver.QPState(q.state.Load()) {
	case driver.QPSReset, driver.QPSInit, driver.QPSRTR:
		if len(wrs) > 0 {
			return 0, fmt.Errorf("%w: PostSend needs RTS (the QP is in %v)", driver.ErrInvalidState, driver.QPState(q.state.Load()))
		}
	}
	var n int
	var err error
	q.sendMu.Lock()
	if len(wrs) == 1 && wrs[0].Opcode != driver.OpBindMW {
		n, err = q.postOne(&wrs[0])
	} else {
		n, err = q.postSendLocked(wrs)
	}
	q.sendMu.Unlock()
	return n, err
}

// postSendLocked is PostSend past its state check, for any number of WRs;
// sendMu is held.
func (q *qp) postSendLocked(wrs []driver.SendWR) (int, error) {
	if q.gone.Load() {
		return 0, driver.ErrClosed
	}
	if q.ctx.removed.Load() {
		return 0, q.ctx.removedErr()
	}
	posted := 0
	for posted < len(wrs) {
		free := q.sendRoom()
		batch := wrs[posted:min(len(wrs), posted+postBatch)]
		var refused error
		n, binds := 0, false
		for i := range batch {
			wr := &batch[i]
			if i >= free {
				refused = q.sendQueueFull()
				break
			}
			if err := q.checkSend(wr); err != nil {
				refused = err
				break
			}
			var bw *mw
			var bm *mr
			if wr.Opcode == driver.OpBindMW {
				binds = true
				var err error
				if bw, bm, err = q.bindTarget(wr); err != nil {
					refused = err
					break
				}
				if bw.typ == driver.MWType1 {
					// Bound by bind_mw, alone: the batch so far is
					// posted first.
					if n == 0 {
						if err := q.bindType1(batch[:1], bw, bm); err != nil {
							return posted, err
						}
						posted++
					}
					break
				}
			}
			toIBVSend(&q.swr[i], wr)
			if bw != nil {
				q.stageBind(i, &q.swr[i], wr, bw, bm)
			}
			q.swr[i].next = 0
			if i > 0 {
				q.swr[i-1].next = uintptr(unsafe.Pointer(&q.swr[i]))
			}
			n++
		}
		if n > 0 {
			// Counted before the call: their completions may be polled
			// before it returns.
			first := q.sqPosted.Load()
			q.sentWRs(batch[:n])
			if binds {
				q.bindPosted(batch[:n], first)
			}
			q.sendBad = 0
			r := int32(ccall(&q.sendCall))
			runtime.KeepAlive(batch)
			k := n
			if r != 0 && q.sendBad != 0 {
				k = int((q.sendBad - uintptr(unsafe.Pointer(&q.swr[0]))) / unsafe.Sizeof(q.swr[0]))
			}
			q.unsent(batch[k:n])
			if r != 0 {
				return posted + k, postErr("post_send", r)
			}
			posted += n
		}
		if refused != nil {
			return posted, refused
		}
	}
	return posted, nil
}

// postOne is postSendLocked for one WR that binds no window, the
// latency path: the batch's bookkeeping left out.
func (q *qp) postOne(wr *driver.SendWR) (int, error) {
	if q.gone.Load() {
		return 0, driver.ErrClosed
	}
	if q.ctx.removed.Load() {
		return 0, q.ctx.removedErr()
	}
	if q.sendRoom() <= 0 {
		return 0, q.sendQueueFull()
	}
	if !q.sendQuick(wr) {
		if err := q.checkSendAll(wr); err != nil {
			return 0, err
		}
	}
	c := &q.swr[0]
	toIBVSend(c, wr)
	c.next = 0
	// Counted before the call, as postSendLocked does.
	if !q.sigAll && wr.Flags&driver.SendSignaled == 0 {
		q.sqPosted.Add(1)
	} else {
		q.sentSignaled()
	}
	q.sendBad = 0
	r := int32(ccall(&q.sendCall))
	runtime.KeepAlive(wr)
	if r == 0 {
		return 1, nil
	}
	return q.sendFailed(wr, r)
}

// sendFailed is the answer to post_send's failure r of the one WR wr:
// its count is taken back if post_send names it as the bad WR. sendMu
// is held.
func (q *qp) sendFailed(wr *driver.SendWR, r int32) (int, error) {
	k := 1
	if q.sendBad != 0 {
		k = 0
		q.unsent(unsafe.Slice(wr, 1))
	}
	return k, postErr("post_send", r)
}

// sendRoom is how many more send WRs the QP takes; sendMu is held.
func (q *qp) sendRoom() int {
	return int(uint64(q.cap.MaxSendWR) - (q.sqPosted.Load() - q.sqRetired.Load()))
}

// sendQueueFull is the error of a post beyond sendRoom.
func (q *qp) sendQueueFull() error {
	return fmt.Errorf("%w: %d send WRs outstanding", driver.ErrQueueFull, q.cap.MaxSendWR)
}

// checkSend refuses a send WR the QP or its device cannot take, before
// the device sees it; sendMu is held. Its quick path takes the WRs of
// the opcodes prepare found needing no more than an SGE count (and,
// inline, a payload of one SGE within MaxInlineData in the region of the
// QP's cache), which checkSendAll takes too; checkSendAll checks the
// rest.
func (q *qp) checkSend(wr *driver.SendWR) error {
	if q.sendQuick(wr) {
		return nil
	}
	return q.checkSendAll(wr)
}

// sendQuick is checkSend's quick path: it reports whether wr passes it.
func (q *qp) sendQuick(wr *driver.SendWR) bool {
	op := wr.Opcode
	if q.plainOps&(1<<op) == 0 || len(wr.SGList) > int(q.cap.MaxSendSGE) {
		return false
	}
	return wr.Flags&driver.SendInline == 0 ||
		q.inlineOps&(1<<op) != 0 && len(wr.SGList) == 1 && wr.SGList[0].Length <= q.cap.MaxInlineData && q.inlineCached(&wr.SGList[0])
}

// inlineCached reports whether g lies in the region the QP keeps the
// bounds of, with its lkey, and the PD's regions are unchanged since it
// was found; sendMu is held.
func (q *qp) inlineCached(g *driver.SGE) bool {
	end := g.Addr + uint64(g.Length)
	return q.inlineEnd != 0 && q.inlineLKey == g.LKey && q.inlineGen == q.pd.regions.Load() &&
		g.Addr >= q.inlineStart && end <= q.inlineEnd && end >= g.Addr
}

// inlineOK is pd.inlineOK, which an inline payload of one SGE that is
// not empty passes with inlineCached, or else keeps the bounds of the
// region it lies in; sendMu is held.
func (q *qp) inlineOK(sg []driver.SGE) bool {
	if len(sg) != 1 || sg[0].Length == 0 {
		return q.pd.inlineOK(sg)
	}
	g := &sg[0]
	if q.inlineCached(g) {
		return true
	}
	d := q.pd
	d.mu.RLock()
	defer d.mu.RUnlock()
	m := d.byLKey[g.LKey]
	if m == nil || !m.holds(g) {
		return false
	}
	start := uint64(uintptr(unsafe.Pointer(&m.buf[0])))
	q.inlineLKey, q.inlineStart, q.inlineEnd, q.inlineGen = m.lkey, start, start+uint64(len(m.buf)), d.regions.Load()
	return true
}

// checkSendAll is checkSend without its quick path.
func (q *qp) checkSendAll(wr *driver.SendWR) error {
	caps := q.ctx.attr.Caps
	if err := driver.CheckSendWR(wr, &q.cap, caps&driver.CapMemoryWindows != 0); err != nil {
		return err
	}
	if wr.Opcode.IsAtomic() && caps&driver.CapAtomics == 0 {
		return fmt.Errorf("%w: %s has no atomics", driver.ErrUnsupported, q.ctx.name)
	}
	if wr.Opcode == driver.OpRDMARead && len(wr.SGList) > q.ctx.maxSGERd {
		return fmt.Errorf("%w: %s scatters an RDMA Read into at most %d SGEs", driver.ErrUnsupported, q.ctx.name, q.ctx.maxSGERd)
	}
	if wr.Flags&driver.SendInline != 0 && !q.inlineOK(wr.SGList) {
		return fmt.Errorf("%w: an inline payload must lie in a registered region of the QP's PD, with its lkey", driver.ErrInvalidArg)
	}
	if wr.Opcode.HasImm() && caps&driver.CapImmData == 0 {
		return fmt.Errorf("%w: %s has no immediate data (%v)", driver.ErrUnsupported, q.ctx.name, wr.Opcode)
	}
	return nil
}

// toIBVRecv fills a struct ibv_recv_wr, the last of its list, from w.
func toIBVRecv(c *ibvRecvWR, w *driver.RecvWR) {
	c.wrID = w.WRID
	c.sgList = uintptr(unsafe.Pointer(unsafe.SliceData(w.SGList)))
	c.numSGE = int32(len(w.SGList))
	if c.numSGE == 0 {
		// A receive of no SGEs takes only empty messages, as one of a
		// single empty SGE does; siw refuses the former.
		c.sgList, c.numSGE = uintptr(unsafe.Pointer(&emptySGE)), 1
	}
	c.next = 0
}

// toIBVSend fills a struct ibv_send_wr from w.
func toIBVSend(c *ibvSendWR, w *driver.SendWR) {
	c.wrID = w.WRID
	c.sgList = uintptr(unsafe.Pointer(unsafe.SliceData(w.SGList)))
	c.numSGE = int32(len(w.SGList))
	c.opcode = uint32(w.Opcode)
	c.sendFlags = uint32(w.Flags)
	c.immData = 0
	c.remoteAddr = w.RemoteAddr
	c.compareAdd, c.swap, c.atomicRKey = uint64(w.RKey), 0, 0
	if sendExtraOps&(1<<w.Opcode) != 0 {
		toIBVSendExtra(c, w)
	}
}

// sendExtraOps are the opcodes whose WRs carry more than toIBVSend
// converts for every WR: immediate data, an rkey to invalidate, an
// atomic's operands.
const sendExtraOps = 1<<driver.OpSendWithImm | 1<<driver.OpRDMAWriteWithImm | 1<<driver.OpSendWithInv |
	1<<driver.OpLocalInv | 1<<driver.OpAtomicCmpAndSwp | 1<<driver.OpAtomicFetchAndAdd

// toIBVSendExtra converts what the WRs of sendExtraOps carry.
func toIBVSendExtra(c *ibvSendWR, w *driver.SendWR) {
	switch {
	case w.Opcode.HasImm():
		putNetOrder(&c.immData, w.Imm)
	case w.Opcode == driver.OpSendWithInv || w.Opcode == driver.OpLocalInv:
		c.immData = w.InvalidateRKey
	case w.Opcode.IsAtomic():
		c.compareAdd, c.swap, c.atomicRKey = w.CompareAdd, w.Swap, w.RKey
	}
}

// postErr turns the errno a post returned into an error.
func postErr(op string, r int32) error {
	if r < 0 {
		r = -r
	}
	e := syscall.Errno(r)
	if e == syscall.ENOMEM {
		return fmt.Errorf("%w (%s: %v)", driver.ErrQueueFull, op, e)
	}
	return errnoErr(op, e)
}

// PostRecv posts receives in batches of postBatch, one call of the
// device's post_recv each. One receive to a QP past Reset, with room for
// it, takes the latency path, the checks that the general path
// (postRecvAll) makes in line; anything else, or a check failed, takes
// the general path, which makes them all again.
func (q *qp) PostRecv(wrs []driver.RecvWR) (int, error) {
	if len(wrs) != 1 || q.srq != nil || driver.QPState(q.state.Load()) == driver.QPSReset {
		return q.postRecvAll(wrs)
	}
	wr := &wrs[0]
	q.recvMu.Lock()
	if q.gone.Load() || q.ctx.removed.Load() || q.rqPosted.Load()-q.rqDone.Load() >= uint64(q.cap.MaxRecvWR) ||
		len(wr.SGList) > int(q.cap.MaxRecvSGE) {
		q.recvMu.Unlock()
		return q.postRecvAll(wrs)
	}
	toIBVRecv(&q.rwr[0], wr)
	q.recvBad = 0
	// Counted before the call: Poll may take its completion before the
	// call returns, and counts no more completions than receives posted.
	q.rqPosted.Add(1)
	r := int32(ccall(&q.recvCall))
	runtime.KeepAlive(wr)
	if r != 0 {
		return q.recvFailed(r)
	}
	q.recvMu.Unlock()
	if driver.QPState(q.state.Load()) == driver.QPSErr {
		q.errored() // flush what was just posted
	}
	return 1, nil
}

// recvFailed ends PostRecv's latency path after post_recv's failure r:
// the receive is not counted if post_recv names it as the bad WR.
// recvMu is held; recvFailed releases it.
func (q *qp) recvFailed(r int32) (int, error) {
	n := 1
	if q.recvBad != 0 {
		n = 0
		q.rqPosted.Add(^uint64(0))
	}
	q.recvMu.Unlock()
	if n > 0 && driver.QPState(q.state.Load()) == driver.QPSErr {
		q.errored()
	}
	return n, postErr("post_recv", r)
}

// postRecvAll is PostRecv for any receives, with every check.
func (q *qp) postRecvAll(wrs []driver.RecvWR) (int, error) {
	if q.srq != nil {
		return 0, fmt.Errorf("%w: the QP takes its receives from an SRQ", driver.ErrInvalidArg)
	}
	if driver.QPState(q.state.Load()) == driver.QPSReset && len(wrs) > 0 {
		return 0, fmt.Errorf("%w: PostRecv needs Init or later (the QP is in RESET)", driver.ErrInvalidState)
	}
	q.recvMu.Lock()
	if q.gone.Load() {
		q.recvMu.Unlock()
		return 0, driver.ErrClosed
	}
	if q.ctx.removed.Load() {
		q.recvMu.Unlock()
		return 0, q.ctx.removedErr()
	}
	take := wrs
	var full error
	if free := int(uint64(q.cap.MaxRecvWR) - (q.rqPosted.Load() - q.rqDone.Load())); len(take) > free {
		take = wrs[:max(free, 0)]
		full = fmt.Errorf("%w: %d receives outstanding", driver.ErrQueueFull, q.cap.MaxRecvWR)
	}
	// Counted before the call: Poll may take their completions before
	// the call returns, and counts no more completions than receives
	// posted; less what was not posted after it.
	q.rqPosted.Add(uint64(len(take)))
	n, err := postRecvs(&q.recvCall, &q.rwr, &q.recvBad, take, q.cap.MaxRecvSGE, "post_recv")
	q.rqPosted.Add(-uint64(len(take) - n))
	if err == nil {
		err = full
	}
	q.recvMu.Unlock()
	if n > 0 && driver.QPState(q.state.Load()) == driver.QPSErr {
		q.errored() // flush what was just posted
	}
	return n, err
}

// postRecvs posts receives to a QP or an SRQ through post, whose
// arguments are scratch's first WR and bad, in batches of postBatch, one
// call each.
func postRecvs(post *cargs, scratch *[postBatch]ibvRecvWR, bad *uintptr, wrs []driver.RecvWR, maxSGE uint32, op string) (int, error) {
	if len(wrs) == 1 {
		return postRecv(post, &scratch[0], bad, &wrs[0], maxSGE, op)
	}
	posted := 0
	for posted < len(wrs) {
		batch := wrs[posted:min(len(wrs), posted+postBatch)]
		var refused error
		n := 0
		for i := range batch {
			wr := &batch[i]
			if err := driver.CheckRecvWR(wr, maxSGE); err != nil {
				refused = err
				break
			}
			c := &scratch[i]
			toIBVRecv(c, wr)
			if i > 0 {
				scratch[i-1].next = uintptr(unsafe.Pointer(c))
			}
			n++
		}
		if n > 0 {
			*bad = 0
			r := int32(ccall(post))
			runtime.KeepAlive(batch)
			if r != 0 {
				k := n
				if *bad != 0 {
					k = int((*bad - uintptr(unsafe.Pointer(&scratch[0]))) / unsafe.Sizeof(scratch[0]))
				}
				return posted + k, postErr(op, r)
			}
			posted += n
		}
		if refused != nil {
			return posted, refused
		}
	}
	return posted, nil
}

// postRecv is postRecvs for one receive, the latency path: the batch's
// bookkeeping left out. c is the first WR of the scratch list.
func postRecv(post *cargs, c *ibvRecvWR, bad *uintptr, wr *driver.RecvWR, maxSGE uint32, op string) (int, error) {
	if err := driver.CheckRecvWR(wr, maxSGE); err != nil {
		return 0, err
	}
	toIBVRecv(c, wr)
	*bad = 0
	r := int32(ccall(post))
	runtime.KeepAlive(wr)
	switch {
	case r == 0:
		return 1, nil
	case *bad != 0:
		return 0, postErr(op, r)
	}
	return 1, postErr(op, r) // as postRecvs counts a failure that names no WR
}

// Modify checks the transition as every provider does, then makes it on
// the device. A move to RTR by hand needs an address vector, which
// QPAttr does not carry: the provider gives the device's own port, so a
// QP can be connected by hand to another QP of the same device only (cm
// connects any two). iWARP QPs are connected by cm alone.
func (q *qp) Modify(attr *driver.QPAttr, mask driver.QPAttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return driver.ErrClosed
	}
	cur, err := q.queryState()
	if err != nil {
		return err
	}
	next, err := driver.CheckModify(cur, attr, mask)
	if err != nil {
		return err
	}
	if q.ctx.iwarp && (next == driver.QPSRTR || next == driver.QPSRTS) && cur != next {
		return fmt.Errorf("%w: an iWARP QP reaches %v only through a connection: use cm with an rdma:// address", driver.ErrUnsupported, next)
	}
	if q.ctx.noReset && next == driver.QPSReset && cur != driver.QPSReset && cur != driver.QPSInit {
		// siw takes the move and leaves the QP where it was; connecting
		// it again would then reach the kernel with a QP in ERR.
		return fmt.Errorf("%w: %s keeps a QP that was connected in its state for good (Linux siw leaves RTS and ERR only for ERR): destroy this QP and create a new one to connect again", driver.ErrUnsupported, q.ctx.name)
	}
	a, m, err := q.toIBVAttr(attr, mask, cur, next)
	if err != nil {
		return err
	}
	if cur == driver.QPSReset && next == driver.QPSErr {
		// Linux refuses Reset to Err, which the verbs allow: go
		// through Init, where nothing can have been posted either.
		init := &ibvQPAttr{qpState: uint32(driver.QPSInit), portNum: 1}
		if err := callInt(lib.modifyQP, q.p, uintptr(unsafe.Pointer(init)), ibvQPState|ibvQPPkeyIndex|ibvQPPort|ibvQPAccessFlags); err != nil {
			return errnoErr("ibv_modify_qp RESET to INIT (on the way to ERR)", err)
		}
	}
	if next == driver.QPSReset {
		// Counted before the move: a disconnect that ends the QP's
		// connection meanwhile leaves it as the reset makes it.
		q.resets.Add(1)
	}
	if err := callInt(lib.modifyQP, q.p, uintptr(unsafe.Pointer(a)), uintptr(m)); err != nil {
		return errnoErr(fmt.Sprintf("ibv_modify_qp %v to %v", cur, next), err)
	}
	if next == driver.QPSReset {
		q.resetQueues()
	}
	driver.ApplyAttr(&q.attr, attr, mask)
	q.attr.State = next
	switch {
	case next == driver.QPSReset:
		q.granted, q.grantSet = 0, false
	case mask&driver.QPAttrAccessFlags != 0:
		q.granted, q.grantSet = attr.AccessFlags, true
	}
	q.destQPN.Store(q.attr.DestQPNum)
	q.state.Store(uint32(next))
	return nil
}

// modifyRaw makes a transition with attributes rdma_init_qp_attr gave.
func (q *qp) modifyRaw(a *ibvQPAttr, mask int32) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return driver.ErrClosed
	}
	if err := callInt(lib.modifyQP, q.p, uintptr(unsafe.Pointer(a)), uintptr(mask)); err != nil {
		return errnoErr(fmt.Sprintf("ibv_modify_qp to %v", driver.QPState(a.qpState)), err)
	}
	q.fromIBVAttr(a, mask)
	return nil
}

// qpAttrMasks pairs each QPAttrMask bit with its ibv_qp_attr_mask bit.
var qpAttrMasks = [...]struct {
	g driver.QPAttrMask
	c int32
}{
	{driver.QPAttrState, ibvQPState}, {driver.QPAttrCurState, ibvQPCurState},
	{driver.QPAttrAccessFlags, ibvQPAccessFlags}, {driver.QPAttrPort, ibvQPPort},
	{driver.QPAttrPathMTU, ibvQPPathMTU}, {driver.QPAttrDestQPN, ibvQPDestQPN},
	{driver.QPAttrRQPSN, ibvQPRQPSN}, {driver.QPAttrSQPSN, ibvQPSQPSN},
	{driver.QPAttrMaxQPRdAtomic, ibvQPMaxQPRdAtomic}, {driver.QPAttrMaxDestRdAtomic, ibvQPMaxDestRdAtomic},
	{driver.QPAttrMinRNRTimer, ibvQPMinRNRTimer}, {driver.QPAttrTimeout, ibvQPTimeout},
	{driver.QPAttrRetryCnt, ibvQPRetryCnt}, {driver.QPAttrRNRRetry, ibvQPRNRRetry},
}

// fromIBVAttr records what a raw Modify set; q.mu is held.
func (q *qp) fromIBVAttr(a *ibvQPAttr, mask int32) {
	var m driver.QPAttrMask
	for _, b := range qpAttrMasks {
		if mask&b.c != 0 {
			m |= b.g
		}
	}
	attr := driver.QPAttr{AccessFlags: driver.AccessFlags(a.qpAccessFlags), Port: a.portNum,
		PathMTU: driver.MTU(a.pathMTU), DestQPNum: a.destQPNum, RQPSN: a.rqPSN, SQPSN: a.sqPSN,
		MaxRdAtomic: a.maxRdAtomic, MaxDestRdAtomic: a.maxDestRdAtomic,
		MinRNRTimer: driver.RNRTimer(a.minRNRTimer), Timeout: a.timeout, RetryCnt: a.retryCnt, RNRRetry: a.rnrRetry}
	driver.ApplyAttr(&q.attr, &attr, m)
	if m&driver.QPAttrState != 0 {
		q.attr.State = driver.QPState(a.qpState)
		q.state.Store(a.qpState)
	}
	if m&driver.QPAttrDestQPN != 0 {
		q.destQPN.Store(a.destQPNum)
	}
}

// toIBVAttr translates a Modify for the device; q.mu is held.
func (q *qp) toIBVAttr(attr *driver.QPAttr, mask driver.QPAttrMask, cur, next driver.QPState) (*ibvQPAttr, int32, error) {
	a := &ibvQPAttr{qpState: uint32(next), curQPState: uint32(attr.CurState),
		qpAccessFlags: uint32(attr.AccessFlags), portNum: attr.Port, pathMTU: uint32(attr.PathMTU),
		destQPNum: attr.DestQPNum, rqPSN: attr.RQPSN, sqPSN: attr.SQPSN,
		maxRdAtomic: attr.MaxRdAtomic, maxDestRdAtomic: attr.MaxDestRdAtomic,
		minRNRTimer: uint8(attr.MinRNRTimer), timeout: attr.Timeout, retryCnt: attr.RetryCnt, rnrRetry: attr.RNRRetry}
	var m int32
	for _, b := range qpAttrMasks {
		if mask&b.g != 0 {
			m |= b.c
		}
	}
	if mask&driver.QPAttrState == 0 {
		m |= ibvQPState
	}
	if cur == driver.QPSReset && next == driver.QPSInit {
		m |= ibvQPPkeyIndex
	}
	if mask&driver.QPAttrPathMTU != 0 && int(attr.PathMTU) > int(q.ctx.port.activeMTU) {
		return nil, 0, fmt.Errorf("%w: path MTU %d bytes above the port's active MTU of %d", driver.ErrInvalidArg, attr.PathMTU.Bytes(), driver.MTU(q.ctx.port.activeMTU).Bytes())
	}
	if cur == driver.QPSInit && next == driver.QPSRTR {
		av, err := q.ctx.loopbackAV()
		if err != nil {
			return nil, 0, err
		}
		a.ahAttr = av
		m |= ibvQPAV
	}
	return a, m, nil
}

// queryState asks the device for the QP's state, which may have moved to
// the error state on its own; q.mu is held.
func (q *qp) queryState() (driver.QPState, error) {
	if q.ctx.iwarp {
		// siw's ibv_query_qp leaves the state out (it reads RESET
		// always): the provider's own record stands, kept from the
		// moves it makes, the connection's events, failed completions
		// and the device's asynchronous errors.
		s := driver.QPState(q.state.Load())
		q.attr.State = s
		return s, nil
	}
	var a ibvQPAttr
	var ia ibvQPInitAttr
	if err := callInt(lib.queryQP, q.p, uintptr(unsafe.Pointer(&a)), ibvQPState, uintptr(unsafe.Pointer(&ia))); err != nil {
		return 0, errnoErr("ibv_query_qp", err)
	}
	s := driver.QPState(a.qpState)
	q.attr.State = s
	q.state.Store(uint32(s))
	return s, nil
}

func (q *qp) Query() (driver.QPAttr, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return driver.QPAttr{}, driver.ErrClosed
	}
	if _, err := q.queryState(); err != nil {
		return driver.QPAttr{}, err
	}
	return soft.QueryQP(q.attr, false)
}

func (q *qp) Destroy() error {
	if err := q.destroy(); err != nil {
		return err
	}
	// Once q.mu is released (Poll takes it, in errored, with its CQ's
	// lock held) and q is out of the device's map (a Poll that looks it
	// up again finds nothing).
	for _, c := range q.cqs {
		c.forget(q)
	}
	return nil
}

// destroy is Destroy but for the CQs' caches of the QP.
func (q *qp) destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return driver.ErrClosed
	}
	// The post paths hold these while they use the QP.
	q.sendMu.Lock()
	q.recvMu.Lock()
	err := callInt(lib.destroyQP, q.p)
	if err == nil {
		q.dead = true
		q.gone.Store(true)
	}
	q.recvMu.Unlock()
	q.sendMu.Unlock()
	if err != nil {
		return errnoErr("ibv_destroy_qp", err)
	}
	q.ctx.disown(q.p)
	q.ctx.qpsMu.Lock()
	if q.ctx.qpByNum[q.num] == q {
		// (A QP created since may have the number already.)
		delete(q.ctx.qpByNum, q.num)
	}
	q.ctx.qpsMu.Unlock()
	q.pd.mu.Lock()
	delete(q.pd.qps, q)
	q.pd.mu.Unlock()
	return nil
}

// sentWRs records WRs handed to the device.
func (q *qp) sentWRs(wrs []driver.SendWR) {
	for i := range wrs {
		if !q.sigAll && wrs[i].Flags&driver.SendSignaled == 0 {
			// No mark: sqMu, which orders the marks with sendDone's
			// reading of them, is not needed (sendMu orders the count).
			q.sqPosted.Add(1)
			continue
		}
		q.sentSignaled()
	}
}

// sentSignaled records a signaled WR handed to the device, and its mark.
func (q *qp) sentSignaled() {
	q.sqMu.Lock()
	n := q.sqPosted.Add(1)
	if q.sqLen < len(q.sqMarks) {
		i := q.sqHead + q.sqLen
		if i >= len(q.sqMarks) {
			i -= len(q.sqMarks)
		}
		q.sqMarks[i] = n
		q.sqLen++
	}
	q.sqMu.Unlock()
}

// unsent takes back the count of WRs the device refused, the last ones
// sentWRs counted (PostSend is serialised by sendMu).
func (q *qp) unsent(wrs []driver.SendWR) {
	if len(wrs) == 0 {
		return
	}
	q.sqMu.Lock()
	for i := len(wrs) - 1; i >= 0; i-- {
		n := q.sqPosted.Add(^uint64(0))
		if q.sqLen > 0 && q.sqMarks[(q.sqHead+q.sqLen-1)%len(q.sqMarks)] == n+1 {
			q.sqLen--
		}
	}
	q.bindUnsent()
	q.sqMu.Unlock()
}

// sendDone retires send WRs for a completion of the send queue: a
// successful one retires every WR up to its own (the unsignaled before
// it); a failed or flushed one retires its own WR, which completes
// whether signaled or not.
func (q *qp) sendDone(ok bool) {
	q.sqMu.Lock()
	switch {
	case ok && q.sqLen > 0:
		q.sqRetired.Store(q.sqMarks[q.sqHead])
		q.dropMark()
	case !ok && q.sqRetired.Load() < q.sqPosted.Load():
		// (A flush of a WR posted before the QP was reset, which the
		// device leaves in the CQ, finds the queue counted empty: it
		// retires nothing.)
		r := q.sqRetired.Add(1)
		if q.sqLen > 0 && q.sqMarks[q.sqHead] <= r {
			q.dropMark()
		}
	}
	if q.mwq.size > 0 {
		q.bindsRetired(ok)
	}
	q.sqMu.Unlock()
}

// dropMark drops the oldest of the marks, sqLen > 0; sqMu is held.
func (q *qp) dropMark() {
	if q.sqHead++; q.sqHead == len(q.sqMarks) {
		q.sqHead = 0
	}
	q.sqLen--
}

// resetQueues empties the occupancy: a QP moved to Reset has empty
// queues.
func (q *qp) resetQueues() {
	q.sqMu.Lock()
	q.sqPosted.Store(0)
	q.sqRetired.Store(0)
	q.sqHead, q.sqLen = 0, 0
	q.mwq.head, q.mwq.size = 0, 0
	q.sqMu.Unlock()
	q.rqPosted.Store(q.rqDone.Load())
}

// setState records a state the QP reached without a Modify of the
// provider's: the connection established (RTS) or broken (ERR).
func (q *qp) setState(s driver.QPState) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ctx.iwarp {
		q.attr.State = s
		q.state.Store(uint32(s))
		return
	}
	q.queryState()
}

// userGrant returns the access flags the user gave the QP since its last
// Reset, if any.
func (q *qp) userGrant() (driver.AccessFlags, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.granted, q.grantSet
}
