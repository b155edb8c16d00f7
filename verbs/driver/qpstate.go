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
