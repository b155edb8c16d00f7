package soft

import (
	"fmt"
	"sync"

	"github.com/goverbs/goverbs/verbs/driver"
)

// errAnswered is what a second answer to a connection request gets.
var errAnswered = fmt.Errorf("%w: the request was already answered", driver.ErrClosed)

// Answer is a connection request's answer, given once: by its Accept
// or by its Reject; a later answer fails with an error that wraps
// driver.ErrClosed.
type Answer struct{ once sync.Once }

// Reject answers the request with reject, unless it was answered.
func (a *Answer) Reject(reject func() error) error {
	err := errAnswered
	a.once.Do(func() { err = reject() })
	return err
}

// Accept answers the request of a by accept on dq, which must be a QP of
// the provider (T, see Own), unless it was answered.
func Accept[T driver.QP](a *Answer, dq driver.QP, accept func(T) (driver.Conn, error)) (driver.Conn, error) {
	q, err := Own[T](dq)
	if err != nil {
		return nil, err
	}
	var out driver.Conn
	err = errAnswered
	a.once.Do(func() { out, err = accept(q) })
	return out, err
}

// Accepted is a listener's Accept of r: r as a driver.ConnRequest, or
// nil (not a nil *R) with err.
func Accepted[R driver.ConnRequest](r R, err error) (driver.ConnRequest, error) {
	if err != nil {
		return nil, err
	}
	return r, nil
}
