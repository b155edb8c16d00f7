package verbs

import (
	"fmt"
	"sync/atomic"

	"github.com/goverbs/goverbs/verbs/driver"
)

// QP is a reliable-connected queue pair.
type QP struct {
	pd        *PD
	d         driver.QP
	num       uint32
	sendCQ    *CQ
	recvCQ    *CQ
	srq       *SRQ
	destroyed atomic.Bool
}

// Num is the QP number.
func (q *QP) Num() uint32 { return q.num }

// PD returns the protection domain of the QP.
func (q *QP) PD() *PD { return q.pd }

// SendCQ returns the CQ of the QP's send completions.
func (q *QP) SendCQ() *CQ { return q.sendCQ }

// RecvCQ returns the CQ of the QP's receive completions.
func (q *QP) RecvCQ() *CQ { return q.recvCQ }

// SRQ returns the QP's shared receive queue, or nil.
func (q *QP) SRQ() *SRQ { return q.srq }

// Driver returns the provider's QP, for helper packages such as cm that
// hand the QP back to its provider.
func (q *QP) Driver() driver.QP { return q.d }

// PostSend posts send work requests in order (ibv_post_send). It returns
// how many were posted; if fewer than len(wrs), err says why wrs[n] was
// refused (a full queue, too many SGEs, an oversize inline payload, a QP in
// a state that does not send) and nothing after it was posted. Errors found
// while executing a request arrive as completions instead. It allocates
// nothing.
func (q *QP) PostSend(wrs []SendWR) (int, error) { return q.d.PostSend(wrs) }

// PostRecv posts receive work requests in order (ibv_post_recv), with the
// same conventions as PostSend. A QP with an SRQ takes no receives of its own.
func (q *QP) PostRecv(wrs []RecvWR) (int, error) { return q.d.PostRecv(wrs) }

// Modify changes the QP's state and attributes (ibv_modify_qp). Only the
// fields named in mask are used; illegal transitions, attributes the
// transition does not take and a Port the device does not have (ports
// are numbered from 1 to DeviceAttr.PhysPortCnt) are refused with
// ErrInvalidState or ErrInvalidArg, and leave the QP as it was. The
// error names the attributes a transition lacks or does not take.
//
// Connecting with package cm makes these moves; a QP that must take
// receives before it connects is made by cm.NewEndpoint.
func (q *QP) Modify(attr *QPAttr, mask QPAttrMask) error {
	if ports := max(q.pd.ctx.attr.PhysPortCnt, 1); mask&QPAttrPort != 0 && (attr.Port < 1 || int(attr.Port) > ports) {
		return fmt.Errorf("verbs: modify QP %d: %w: port %d; device %s has ports 1 to %d", q.num, ErrInvalidArg, attr.Port, q.pd.ctx.info.Name, ports)
	}
	if err := q.d.Modify(attr, mask); err != nil {
		return fmt.Errorf("verbs: modify QP %d: %w", q.num, err)
	}
	return nil
}

// Query returns the QP's current attributes and state (ibv_query_qp).
func (q *QP) Query() (QPAttr, error) { return q.d.Query() }

// State returns the QP's current state.
func (q *QP) State() QPState {
	a, err := q.d.Query()
	if err != nil {
		return QPSErr
	}
	return a.State
}

// Destroy destroys the QP (ibv_destroy_qp). A connected peer sees the
// connection break.
func (q *QP) Destroy() error {
	q.pd.ctx.life.RLock()
	defer q.pd.ctx.life.RUnlock()
	if q.destroyed.Swap(true) {
		return fmt.Errorf("verbs: destroy QP: %w", ErrClosed)
	}
	if err := q.pd.ctx.closedErr("destroy QP"); err != nil {
		q.release()
		return err
	}
	if err := q.d.Destroy(); err != nil {
		q.destroyed.Store(false)
		return fmt.Errorf("verbs: destroy QP %d: %w", q.num, err)
	}
	q.release()
	return nil
}

// release lets go of the PD, CQs and SRQ the destroyed QP held.
func (q *QP) release() {
	q.pd.users.done()
	q.sendCQ.users.done()
	q.recvCQ.users.done()
	if q.srq != nil {
		q.srq.users.done()
	}
}

// SRQ is a shared receive queue: several QPs draw their receives from it.
type SRQ struct {
	pd        *PD
	d         driver.SRQ
	users     users
	destroyed atomic.Bool
}

// PostRecv posts receive work requests to the SRQ (ibv_post_srq_recv).
func (s *SRQ) PostRecv(wrs []RecvWR) (int, error) { return s.d.PostRecv(wrs) }

// Modify changes the SRQ's attributes (ibv_modify_srq); with SRQAttrLimit
// it arms the limit event, which fires once when fewer than Limit receives
// remain posted.
func (s *SRQ) Modify(attr SRQAttr, mask SRQAttrMask) error { return s.d.Modify(attr, mask) }

// Query returns the SRQ's attributes (ibv_query_srq).
func (s *SRQ) Query() (SRQAttr, error) { return s.d.Query() }

// Destroy destroys the SRQ (ibv_destroy_srq). It fails with ErrBusy while a
// QP uses it.
func (s *SRQ) Destroy() error {
	s.pd.ctx.life.RLock()
	defer s.pd.ctx.life.RUnlock()
	if err := s.pd.ctx.closedErr("destroy SRQ"); err != nil {
		if !s.destroyed.Swap(true) {
			s.pd.users.done()
		}
		return err
	}
	if err := s.users.check("SRQ"); err != nil {
		return err
	}
	if s.destroyed.Swap(true) {
		return fmt.Errorf("verbs: destroy SRQ: %w", ErrClosed)
	}
	if err := s.d.Destroy(); err != nil {
		return err
	}
	s.pd.users.done()
	return nil
}
