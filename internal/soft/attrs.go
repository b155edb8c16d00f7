package soft

import (
	"fmt"

	"github.com/goverbs/goverbs/verbs/driver"
)

// QueryQP is Query of a QP whose attributes are attr: attr with
// CurState, or ErrClosed once the QP is destroyed.
func QueryQP(attr driver.QPAttr, destroyed bool) (driver.QPAttr, error) {
	if destroyed {
		return driver.QPAttr{}, driver.ErrClosed
	}
	attr.CurState = attr.State
	return attr, nil
}

// Transition is the state part of Modify of a QP whose attributes are
// cur: it checks the move (CheckModify) and lets veto, if not nil, refuse
// it knowing the state it leads to; then cur takes the attributes mask
// names and the new state. It returns the state the QP leaves; the
// provider does what entering cur.State means.
func Transition(cur, attr *driver.QPAttr, mask driver.QPAttrMask, veto func(next driver.QPState) error) (prev driver.QPState, err error) {
	next, err := driver.CheckModify(cur.State, attr, mask)
	if err != nil {
		return cur.State, err
	}
	if veto != nil {
		if err := veto(next); err != nil {
			return cur.State, err
		}
	}
	driver.ApplyAttr(cur, attr, mask)
	prev, cur.State = cur.State, next
	return prev, nil
}

// SRQLimit checks Modify of an SRQ of entries work requests, which cannot
// be resized, named provider in errors: it returns the new limit when
// mask sets one.
func SRQLimit(a driver.SRQAttr, mask driver.SRQAttrMask, entries uint32, provider string) (limit uint32, set bool, err error) {
	if mask&driver.SRQAttrMaxWR != 0 {
		return 0, false, fmt.Errorf("%w: %s SRQs cannot be resized; create a larger one", driver.ErrUnsupported, provider)
	}
	if mask&driver.SRQAttrLimit == 0 {
		return 0, false, nil
	}
	if a.Limit > entries {
		return 0, false, fmt.Errorf("%w: limit %d above the SRQ's %d entries", driver.ErrInvalidArg, a.Limit, entries)
	}
	return a.Limit, true, nil
}

// CheckQPInit checks the parts of CreateQP that depend only on the
// provider's types and limits: an RC QP, CQs (and an SRQ, if any) of the
// provider's own types C and S, and capacities within maxSGE
// scatter/gather entries and maxInline inline bytes. It returns the CQs
// and the SRQ (the zero S without one); provider names the provider in
// errors.
func CheckQPInit[C, S any](a driver.QPInitAttr, provider string, maxSGE, maxInline int) (send, recv C, srq S, err error) {
	if a.Type != driver.QPTypeRC {
		return send, recv, srq, fmt.Errorf("%w: %s supports only RC QPs", driver.ErrUnsupported, provider)
	}
	var ok1, ok2 bool
	send, ok1 = a.SendCQ.(C)
	recv, ok2 = a.RecvCQ.(C)
	if !ok1 || !ok2 {
		return send, recv, srq, fmt.Errorf("%w: CQs of another provider", driver.ErrInvalidArg)
	}
	if a.SRQ != nil {
		if srq, ok1 = a.SRQ.(S); !ok1 {
			return send, recv, srq, fmt.Errorf("%w: SRQ of another provider", driver.ErrInvalidArg)
		}
	}
	if c := a.Cap; c.MaxSendSGE > uint32(maxSGE) || c.MaxRecvSGE > uint32(maxSGE) || c.MaxInlineData > uint32(maxInline) {
		return send, recv, srq, fmt.Errorf("%w: capacities %+v beyond the device's (%d SGEs, %d inline bytes)", driver.ErrInvalidArg, c, maxSGE, maxInline)
	}
	return send, recv, srq, nil
}
