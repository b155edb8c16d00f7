package driver

import "fmt"

// transition is one legal QP state change with the attributes it requires
// and the ones it may set besides them.
type transition struct {
	required QPAttrMask
	optional QPAttrMask
}

// rcTransitions is the RC row of the IB specification's QP state table, as
// Linux's ib_modify_qp_is_ok applies it (without P_Key and address vector
// attributes, which no goverbs provider has).
var rcTransitions = map[[2]QPState]transition{
	{QPSReset, QPSInit}: {required: QPAttrPort | QPAttrAccessFlags},
	{QPSInit, QPSInit}:  {optional: QPAttrPort | QPAttrAccessFlags},
	{QPSInit, QPSRTR}: {
		required: QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN | QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer,
		optional: QPAttrAccessFlags,
	},
	{QPSRTR, QPSRTS}: {
		required: QPAttrSQPSN | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrMaxQPRdAtomic,
		optional: QPAttrCurState | QPAttrAccessFlags | QPAttrMinRNRTimer,
	},
	{QPSRTS, QPSRTS}: {optional: QPAttrCurState | QPAttrAccessFlags | QPAttrMinRNRTimer},
	{QPSRTS, QPSSQD}: {},
	{QPSSQD, QPSRTS}: {optional: QPAttrCurState | QPAttrAccessFlags | QPAttrMinRNRTimer},
	{QPSSQD, QPSSQD}: {
		optional: QPAttrAccessFlags | QPAttrMinRNRTimer | QPAttrMaxQPRdAtomic |
			QPAttrMaxDestRdAtomic | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry,
	},
	{QPSSQE, QPSRTS}: {optional: QPAttrCurState | QPAttrAccessFlags},
}

// CheckModify validates a Modify of a QP in state cur, as ibv_modify_qp does:
// the transition must be legal, every attribute it requires must be in mask,
// and mask may name no attribute the transition does not take. It returns
// the state the QP moves to. Any state may move to Reset or Err.
func CheckModify(cur QPState, attr *QPAttr, mask QPAttrMask) (QPState, error) {
	next := cur
	if mask&QPAttrState != 0 {
		next = attr.State
	}
	if next >= numQPStates {
		return cur, fmt.Errorf("%w: unknown QP state %d", ErrInvalidArg, next)
	}
	if mask&QPAttrCurState != 0 && attr.CurState != cur {
		return cur, fmt.Errorf("%w: CurState says %v but the QP is in %v", ErrInvalidState, attr.CurState, cur)
	}
	rest := mask &^ (QPAttrState | QPAttrCurState)
	if next == QPSReset || next == QPSErr {
		if mask&QPAttrState == 0 {
			return cur, fmt.Errorf("%w: %v to %v needs QPAttrState", ErrInvalidArg, cur, next)
		}
		if rest != 0 {
			return cur, fmt.Errorf("%w: a move to %v takes no attributes besides QPAttrState (the mask has %v)", ErrInvalidArg, next, rest)
		}
		return next, nil
	}
	t, ok := rcTransitions[[2]QPState{cur, next}]
	if !ok {
		return cur, fmt.Errorf("%w: %v to %v is not a legal QP transition", ErrInvalidState, cur, next)
	}
	if missing := t.required &^ mask; missing != 0 {
		hint := "cm's Dial and Accept make these moves"
		if next == QPSInit {
			hint = "cm.NewEndpoint makes a QP in INIT"
		}
		return cur, fmt.Errorf("%w: %v to %v requires the attributes %v; the mask lacks %v (%s)", ErrInvalidArg, cur, next, t.required, missing, hint)
	}
	if extra := rest &^ (t.required | t.optional); extra != 0 {
		return cur, fmt.Errorf("%w: %v to %v does not take the attributes %v", ErrInvalidArg, cur, next, extra)
	}
	if mask&QPAttrAccessFlags != 0 && attr.AccessFlags&^(RemoteAccess|AccessLocalWrite|AccessMWBind) != 0 {
		return cur, fmt.Errorf("%w: unknown QP access flags %v", ErrInvalidArg, attr.AccessFlags)
	}
	if mask&QPAttrPathMTU != 0 && attr.PathMTU.Bytes() == 0 {
		return cur, fmt.Errorf("%w: path MTU %d", ErrInvalidArg, attr.PathMTU)
	}
	if mask&QPAttrRNRRetry != 0 && attr.RNRRetry > 7 {
		return cur, fmt.Errorf("%w: RNRRetry %d is more than 7", ErrInvalidArg, attr.RNRRetry)
	}
	if mask&QPAttrRetryCnt != 0 && attr.RetryCnt > 7 {
		return cur, fmt.Errorf("%w: RetryCnt %d is more than 7", ErrInvalidArg, attr.RetryCnt)
	}
	if mask&QPAttrMinRNRTimer != 0 && attr.MinRNRTimer > 31 {
		return cur, fmt.Errorf("%w: MinRNRTimer %d is more than 31", ErrInvalidArg, attr.MinRNRTimer)
	}
	return next, nil
}

// ApplyAttr copies the fields mask names from attr into dst.
func ApplyAttr(dst *QPAttr, attr *QPAttr, mask QPAttrMask) {
	if mask&QPAttrAccessFlags != 0 {
		dst.AccessFlags = attr.AccessFlags
	}
	if mask&QPAttrPort != 0 {
		dst.Port = attr.Port
	}
	if mask&QPAttrPathMTU != 0 {
		dst.PathMTU = attr.PathMTU
	}
	if mask&QPAttrDestQPN != 0 {
		dst.DestQPNum = attr.DestQPNum
	}
	if mask&QPAttrRQPSN != 0 {
		dst.RQPSN = attr.RQPSN
	}
	if mask&QPAttrSQPSN != 0 {
		dst.SQPSN = attr.SQPSN
	}
	if mask&QPAttrMaxQPRdAtomic != 0 {
		dst.MaxRdAtomic = attr.MaxRdAtomic
	}
	if mask&QPAttrMaxDestRdAtomic != 0 {
		dst.MaxDestRdAtomic = attr.MaxDestRdAtomic
	}
	if mask&QPAttrMinRNRTimer != 0 {
		dst.MinRNRTimer = attr.MinRNRTimer
	}
	if mask&QPAttrTimeout != 0 {
		dst.Timeout = attr.Timeout
	}
	if mask&QPAttrRetryCnt != 0 {
		dst.RetryCnt = attr.RetryCnt
	}
	if mask&QPAttrRNRRetry != 0 {
		dst.RNRRetry = attr.RNRRetry
	}
}

// ConnectRC moves qp from Reset or Init to RTS, connected to the remote QP
// described by remote, with the local parameters local: ConnectRTR, then
// ConnectRTS. A QP already in Init keeps the receives posted to it.
// Connection managers of providers whose QPs are connected by attributes
// (loop, shm) use these.
func ConnectRC(qp QP, local, remote ConnParam) error {
	if err := ConnectRTR(qp, local, remote); err != nil {
		return err
	}
	return ConnectRTS(qp, local, remote)
}

// ConnAccess is the access a QP that a connection manager moves out of
// Reset accepts from its peer: every remote right, as rdma_cm grants. A
// QP the user moved to Init first keeps the access flags it was given
// there: connecting never widens them.
const ConnAccess = RemoteAccess | AccessLocalWrite

// ConnectRTR moves qp from Reset or Init to RTR: it may receive from the
// remote QP but not yet send. A QP in Reset is moved to Init with
// ConnAccess; one in Init keeps its access flags.
func ConnectRTR(qp QP, local, remote ConnParam) error {
	cur, err := qp.Query()
	if err != nil {
		return err
	}
	if cur.State != QPSReset && cur.State != QPSInit {
		return fmt.Errorf("%w: connecting needs a QP in Reset or Init, this one is %v", ErrInvalidState, cur.State)
	}
	if cur.State == QPSReset {
		attr := QPAttr{State: QPSInit, Port: 1, AccessFlags: ConnAccess}
		if err := qp.Modify(&attr, QPAttrState|QPAttrPort|QPAttrAccessFlags); err != nil {
			return err
		}
	}
	attr := QPAttr{
		State: QPSRTR, PathMTU: MTU4096, DestQPNum: remote.QPNum,
		MaxDestRdAtomic: local.ResponderResources, MinRNRTimer: local.MinRNRTimer,
	}
	return qp.Modify(&attr, QPAttrState|QPAttrPathMTU|QPAttrDestQPN|QPAttrRQPSN|QPAttrMaxDestRdAtomic|QPAttrMinRNRTimer)
}

// ConnectRTS moves qp from RTR to RTS; the effective ORD is the smaller of
// the local initiator depth and the remote responder resources.
func ConnectRTS(qp QP, local, remote ConnParam) error {
	attr := QPAttr{
		State: QPSRTS, Timeout: 14, RetryCnt: local.RetryCount, RNRRetry: local.RNRRetryCount,
		MaxRdAtomic: min(local.InitiatorDepth, remote.ResponderResources),
	}
	return qp.Modify(&attr, QPAttrState|QPAttrSQPSN|QPAttrTimeout|QPAttrRetryCnt|QPAttrRNRRetry|QPAttrMaxQPRdAtomic)
}

// ErrRecvOnSRQ refuses a receive posted to a QP that takes its receives
// from a shared receive queue.
var ErrRecvOnSRQ = fmt.Errorf("%w: the QP takes its receives from an SRQ: post them to the SRQ", ErrInvalidArg)

// PostSendStateErr reports why a QP in state s refuses send work requests
// (ErrInvalidState before RTS), or nil: RTS, SQD and SQE take them, and
// so does the error state, which completes them flushed. Every provider
// gives these answers.
func PostSendStateErr(s QPState) error {
	switch s {
	case QPSReset, QPSInit, QPSRTR:
		return fmt.Errorf("%w: the QP is in %v; posting sends needs RTS (connect it with cm, or modify it to RTS)", ErrInvalidState, s)
	}
	return nil
}

// PostRecvStateErr reports why a QP in state s refuses receive work
// requests (ErrInvalidState in Reset), or nil: every later state takes
// them, the error state completing them flushed.
func PostRecvStateErr(s QPState) error {
	if s == QPSReset {
		return fmt.Errorf("%w: the QP is in RESET; posting receives needs INIT or later (modify it to INIT first)", ErrInvalidState)
	}
	return nil
}
