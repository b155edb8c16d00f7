package soft

import (
	"fmt"

	"github.com/goverbs/goverbs/verbs/driver"
)

// ConnectRC moves qp from Reset or Init to RTS, connected to the remote QP
// described by remote, with the local parameters local: ConnectRTR, then
// ConnectRTS. A QP already in Init keeps the receives posted to it.
// Connection managers of providers whose QPs are connected by attributes
// (loop, shm) use these.
func ConnectRC(qp driver.QP, local, remote driver.ConnParam) error {
	if err := ConnectRTR(qp, local, remote); err != nil {
		return err
	}
	return ConnectRTS(qp, local, remote)
}

// ConnAccess is the access a QP that a connection manager moves out of
// Reset accepts from its peer: every remote right, as rdma_cm grants. A
// QP the user moved to Init first keeps the access flags it was given
// there: connecting never widens them.
const ConnAccess = driver.RemoteAccess | driver.AccessLocalWrite

// ConnectRTR moves qp from Reset or Init to RTR: it may receive from the
// remote QP but not yet send. A QP in Reset is moved to Init with
// ConnAccess; one in Init keeps its access flags.
func ConnectRTR(qp driver.QP, local, remote driver.ConnParam) error {
	cur, err := qp.Query()
	if err != nil {
		return err
	}
	if cur.State != driver.QPSReset && cur.State != driver.QPSInit {
		return fmt.Errorf("%w: connecting needs a QP in Reset or Init, this one is %v", driver.ErrInvalidState, cur.State)
	}
	if cur.State == driver.QPSReset {
		attr := driver.QPAttr{State: driver.QPSInit, Port: 1, AccessFlags: ConnAccess}
		if err := qp.Modify(&attr, driver.QPAttrState|driver.QPAttrPort|driver.QPAttrAccessFlags); err != nil {
			return err
		}
	}
	attr := driver.QPAttr{
		State: driver.QPSRTR, PathMTU: driver.MTU4096, DestQPNum: remote.QPNum,
		MaxDestRdAtomic: local.ResponderResources, MinRNRTimer: local.MinRNRTimer,
	}
	return qp.Modify(&attr, driver.QPAttrState|driver.QPAttrPathMTU|driver.QPAttrDestQPN|driver.QPAttrRQPSN|driver.QPAttrMaxDestRdAtomic|driver.QPAttrMinRNRTimer)
}

// ConnectRTS moves qp from RTR to RTS; the effective ORD is the smaller of
// the local initiator depth and the remote responder resources.
func ConnectRTS(qp driver.QP, local, remote driver.ConnParam) error {
	attr := driver.QPAttr{
		State: driver.QPSRTS, Timeout: 14, RetryCnt: local.RetryCount, RNRRetry: local.RNRRetryCount,
		MaxRdAtomic: min(local.InitiatorDepth, remote.ResponderResources),
	}
	return qp.Modify(&attr, driver.QPAttrState|driver.QPAttrSQPSN|driver.QPAttrTimeout|driver.QPAttrRetryCnt|driver.QPAttrRNRRetry|driver.QPAttrMaxQPRdAtomic)
}

// FinishAccept ends the connection setup of an accepting side whose QP
// ConnectRTR moved to RTR: ConnectRTS, unless local.HoldRTR asks that the
// QP stay in RTR, for the caller to move to RTS with Modify.
func FinishAccept(qp driver.QP, local, remote driver.ConnParam) error {
	if local.HoldRTR {
		return nil
	}
	return ConnectRTS(qp, local, remote)
}

// ErrRecvOnSRQ refuses a receive posted to a QP that takes its receives
// from a shared receive queue.
var ErrRecvOnSRQ = fmt.Errorf("%w: the QP takes its receives from an SRQ: post them to the SRQ", driver.ErrInvalidArg)

// PostSendStateErr reports why a QP in state s refuses send work requests
// (ErrInvalidState before RTS), or nil: RTS, SQD and SQE take them, and
// so does the error state, which completes them flushed. Every provider
// gives these answers.
func PostSendStateErr(s driver.QPState) error {
	switch s {
	case driver.QPSReset, driver.QPSInit, driver.QPSRTR:
		return fmt.Errorf("%w: the QP is in %v; posting sends needs RTS (connect it with cm, or modify it to RTS)", driver.ErrInvalidState, s)
	}
	return nil
}

// PostRecvStateErr reports why a QP in state s refuses receive work
// requests (ErrInvalidState in Reset), or nil: every later state takes
// them, the error state completing them flushed.
func PostRecvStateErr(s driver.QPState) error {
	if s == driver.QPSReset {
		return fmt.Errorf("%w: the QP is in RESET; posting receives needs INIT or later (modify it to INIT first)", driver.ErrInvalidState)
	}
	return nil
}
