package loop

import (
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/grant"
	"unsafe"

	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The responder side of a QP: what happens when a peer's request arrives.
// Each function returns the status the requester completes with.

// accepts reports whether the QP's responder takes requests.
func (p *qp) accepts() bool { return soft.Accepts(p.attr.State) }

// nextRecv returns the receive the next incoming message consumes, or nil.
func (p *qp) nextRecv() *rwqe {
	if p.srq != nil {
		return p.srq.PeekLocked()
	}
	return p.rq.Peek()
}

// consumeRecv removes the receive nextRecv returned.
func (p *qp) consumeRecv() {
	if p.srq != nil {
		p.srq.PopLocked()
		return
	}
	p.rq.Pop()
}

// responderErr moves the responder to the error state after a request it
// could not serve, raising ev.
func (p *qp) responderErr(ev driver.EventType) {
	p.ctx.Event(ev, p.userCtx)
	p.toErr()
}

// remote returns the bytes a request names by rkey, if the QP accepts
// the access and the region grants it.
func (p *qp) remote(rkey uint32, addr, n uint64, need driver.AccessFlags) ([]byte, bool) {
	if p.attr.AccessFlags&need != need {
		return nil, false
	}
	return p.ctx.span(rkey, p.pd, p, addr, n, need)
}

// remoteList sets l to the n bytes at the remote address of wr, in the
// region of its rkey, if the QP and the region grant need; otherwise the
// responder fails with an access error, which it returns.
func (p *qp) remoteList(l *sglist.List, wr *driver.SendWR, n uint64, need driver.AccessFlags) driver.WCStatus {
	b, ok := p.remote(wr.RKey, wr.RemoteAddr, n, need)
	if !ok {
		p.responderErr(driver.EventQPAccessErr)
		return driver.WCRemAccessErr
	}
	l.One(b)
	return driver.WCSuccess
}

// recvCompletion starts the completion of a message from requester q.
func recvCompletion(q *qp, wr *driver.SendWR, wrid uint64, op driver.WCOpcode) driver.WorkCompletion {
	wc := driver.WorkCompletion{WRID: wrid, Opcode: op, SrcQP: q.num}
	if wr.Opcode.HasImm() {
		wc.Flags |= driver.WCWithImm
		wc.Imm = wr.Imm
	}
	if wr.Flags&driver.SendSolicited != 0 {
		wc.Flags |= driver.WCSolicited
	}
	return wc
}

// receive places a Send into the next posted receive.
func (p *qp) receive(q *qp, wr *driver.SendWR, src *sglist.List) driver.WCStatus {
	r := p.nextRecv()
	if r == nil {
		return swq.RNRWait
	}
	wc := recvCompletion(q, wr, r.WRID, driver.WCRecv)
	var dst sglist.List
	ok := swq.ResolveSGL(&dst, r.SGE, driver.AccessLocalWrite, p)
	p.consumeRecv()
	switch {
	case !ok:
		wc.Status = driver.WCLocProtErr
		p.CompleteRecv(wc)
		p.responderErr(driver.EventQPAccessErr)
		return driver.WCRemOpErr
	case src.Len() > dst.Len():
		wc.Status = driver.WCLocLenErr
		p.CompleteRecv(wc)
		p.responderErr(driver.EventQPReqErr)
		return driver.WCRemInvReqErr
	}
	if wr.Opcode == driver.OpSendWithInv {
		// The window is invalidated once the receive is known to take
		// the message, and before it is placed: a Send that fails at
		// the receive leaves the window bound, and one that may not
		// invalidate it places nothing.
		if _, isWindow, err := grant.RemoteInvalidate(&p.ctx.mrs, wr.InvalidateRKey, p, p.pd); !isWindow || err != nil {
			wc.Status = driver.WCRemInvReqErr
			p.CompleteRecv(wc)
			p.responderErr(driver.EventQPReqErr)
			return driver.WCRemInvReqErr
		}
		wc.Flags |= driver.WCWithInv
		wc.InvalidatedRKey = wr.InvalidateRKey
	}
	wc.ByteLen = uint32(sglist.Copy(&dst, src))
	p.CompleteRecv(wc)
	return driver.WCSuccess
}

// write places an RDMA Write, and for Write with immediate consumes a
// receive once the data is in place. A zero-length Write checks no rkey.
func (p *qp) write(q *qp, wr *driver.SendWR, src *sglist.List) driver.WCStatus {
	withImm := wr.Opcode == driver.OpRDMAWriteWithImm
	if withImm && p.nextRecv() == nil {
		return swq.RNRWait
	}
	n := src.Len()
	if n > 0 {
		var dst sglist.List
		if st := p.remoteList(&dst, wr, n, driver.AccessRemoteWrite); st != driver.WCSuccess {
			return st
		}
		sglist.Copy(&dst, src)
	}
	if withImm {
		wc := recvCompletion(q, wr, p.nextRecv().WRID, driver.WCRecvRDMAWithImm)
		wc.ByteLen = uint32(n)
		p.consumeRecv()
		p.CompleteRecv(wc)
	}
	return driver.WCSuccess
}

// read serves an RDMA Read into the requester's list dst.
func (p *qp) read(wr *driver.SendWR, dst *sglist.List) driver.WCStatus {
	if p.attr.MaxDestRdAtomic == 0 {
		p.responderErr(driver.EventQPReqErr)
		return driver.WCRemInvReqErr
	}
	n := dst.Len()
	if n == 0 {
		return driver.WCSuccess
	}
	var src sglist.List
	if st := p.remoteList(&src, wr, n, driver.AccessRemoteRead); st != driver.WCSuccess {
		return st
	}
	sglist.Copy(dst, &src)
	return driver.WCSuccess
}

// atomic runs an 8-byte atomic with a CPU atomic instruction on the
// target word and returns the word's previous value.
func (p *qp) atomic(wr *driver.SendWR) (uint64, driver.WCStatus) {
	if p.attr.MaxDestRdAtomic == 0 || wr.RemoteAddr%8 != 0 {
		p.responderErr(driver.EventQPReqErr)
		return 0, driver.WCRemInvReqErr
	}
	b, ok := p.remote(wr.RKey, wr.RemoteAddr, 8, driver.AccessRemoteAtomic)
	if !ok {
		p.responderErr(driver.EventQPAccessErr)
		return 0, driver.WCRemAccessErr
	}
	word := (*uint64)(unsafe.Pointer(&b[0]))
	if wr.Opcode == driver.OpAtomicFetchAndAdd {
		return atomic.AddUint64(word, wr.CompareAdd) - wr.CompareAdd, driver.WCSuccess
	}
	for {
		old := atomic.LoadUint64(word)
		if old != wr.CompareAdd || atomic.CompareAndSwapUint64(word, old, wr.Swap) {
			return old, driver.WCSuccess
		}
	}
}
