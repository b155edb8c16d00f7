// Package acceptq accepts connections for a provider's listener and runs
// their connection-setup handshakes concurrently, so that a client that
// connects and says nothing holds up no other: Accept hands over the
// requests whose handshakes completed, in the order they did.
package acceptq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/goverbs/goverbs/verbs/driver"
)

// MaxHandshakes bounds the connections accepted and not yet handed to
// Accept; the rest wait in the kernel's backlog.
const MaxHandshakes = 64

// Queue accepts connections of type C and turns them into requests of
// type R. Nothing runs until the first Accept.
type Queue[C net.Conn, R any] struct {
	accept  func() (C, error)
	closeL  func() error
	shake   func(C) (R, bool)
	discard func(R)

	start sync.Once
	reqs  chan R
	slots chan struct{} // one per handshake under way or request not taken
	done  chan struct{} // closed by Close
	ended chan struct{} // closed when accepting ends; err says why
	err   error
	errs  chan error // a failed accept, for the next Accept to report
	wg    sync.WaitGroup

	mu      sync.Mutex
	shaking map[net.Conn]bool // handshakes under way, closed by Close
	closed  bool
}

// New makes a queue: accept takes the next connection (closeL, the
// listener's Close, makes it fail), shake runs its handshake (false: the
// connection is not a request, and shake has closed it, or is to be
// closed), and discard disposes of a request that Close leaves untaken.
func New[C net.Conn, R any](accept func() (C, error), closeL func() error, shake func(C) (R, bool), discard func(R)) *Queue[C, R] {
	return &Queue[C, R]{accept: accept, closeL: closeL, shake: shake, discard: discard,
		reqs: make(chan R), slots: make(chan struct{}, MaxHandshakes),
		done: make(chan struct{}), ended: make(chan struct{}), errs: make(chan error, 1), shaking: map[net.Conn]bool{}}
}

// Accept waits for a request, the end of ctx, or the end of accepting
// (an error wrapping driver.ErrClosed once the queue is closed). A
// failed accept (out of descriptors, say) is reported to one Accept, and
// accepting goes on after a pause.
func (q *Queue[C, R]) Accept(ctx context.Context) (R, error) {
	q.start.Do(func() {
		q.wg.Add(1)
		go q.loop()
	})
	var none R
	select {
	case r := <-q.reqs:
		<-q.slots
		return r, nil
	case err := <-q.errs:
		return none, err
	case <-ctx.Done():
		return none, ctx.Err()
	case <-q.ended:
		return none, q.err
	}
}

// Close stops accepting, ends the handshakes under way, waits for them,
// and returns what closing the listener returned.
func (q *Queue[C, R]) Close() error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	q.closed = true
	close(q.done)
	err := q.closeL()
	for c := range q.shaking {
		c.Close()
	}
	q.mu.Unlock()
	q.wg.Wait()
	return err
}

// errClosed is Accept's error once the queue is closed.
var errClosed = fmt.Errorf("%w: the listener is closed", driver.ErrClosed)

// loop accepts connections while handshake slots are free.
func (q *Queue[C, R]) loop() {
	defer q.wg.Done()
	defer close(q.ended)
	pause := time.Duration(0)
	for {
		select {
		case q.slots <- struct{}{}:
		case <-q.done:
			q.err = errClosed
			return
		}
		c, err := q.accept()
		if err != nil {
			<-q.slots
			if errors.Is(err, net.ErrClosed) {
				q.err = errClosed
				return
			}
			select {
			case q.errs <- err:
			default: // an error not reported yet is there already
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-q.done:
				t.Stop()
				q.err = errClosed
				return
			}
			continue
		}
		pause = 0
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			c.Close()
			<-q.slots
			continue
		}
		q.shaking[c] = true
		q.wg.Add(1)
		q.mu.Unlock()
		go q.handshake(c)
	}
}

// handshake runs shake on c and hands the request to Accept.
func (q *Queue[C, R]) handshake(c C) {
	defer q.wg.Done()
	r, ok := q.shake(c)
	q.mu.Lock()
	delete(q.shaking, c)
	closed := q.closed // and Close has closed c
	q.mu.Unlock()
	if !ok || closed {
		if ok {
			q.discard(r)
		} else {
			c.Close()
		}
		<-q.slots
		return
	}
	select {
	case q.reqs <- r:
		return // Accept frees the slot
	case <-q.done:
		q.discard(r)
	}
	<-q.slots
}
