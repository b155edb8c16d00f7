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

// MaxPeerHandshakes bounds, in a queue that knows its peers (PerPeer), the
// connections of one peer whose handshake is under way: a connection
// beyond it is closed at once, so that one peer's silent connections
// leave the other slots to other peers. A request whose handshake is over
// waits for Accept in a slot of the queue's, no longer of its peer's.
const MaxPeerHandshakes = 32

// Queue accepts connections of type C and turns them into requests of
// type R. Nothing runs until the first Accept.
type Queue[C net.Conn, R any] struct {
	accept  func() (C, error)
	closeL  func() error
	shake   func(C) (R, bool)
	discard func(R)

	start sync.Once
	reqs  chan taken[R]
	slots chan struct{} // one per handshake under way or request not taken
	done  chan struct{} // closed by Close
	ended chan struct{} // closed when accepting ends; err says why
	err   error
	errs  chan error // a failed accept, for the next Accept to report
	wg    sync.WaitGroup

	peer   func(C) string // names a connection's peer; nil: peers are not told apart
	screen func(C) bool   // false: turn the connection away at once; nil: admit all

	mu      sync.Mutex
	shaking map[net.Conn]bool // handshakes under way, closed by Close
	closed  bool
	perPeer map[string]int // slots held by each peer's connections
}

// New makes a queue: accept takes the next connection (closeL, the
// listener's Close, makes it fail), shake runs its handshake (false: the
// connection is not a request, and shake has closed it, or is to be
// closed), and discard disposes of a request that Close leaves untaken.
func New[C net.Conn, R any](accept func() (C, error), closeL func() error, shake func(C) (R, bool), discard func(R)) *Queue[C, R] {
	return &Queue[C, R]{accept: accept, closeL: closeL, shake: shake, discard: discard,
		reqs: make(chan taken[R]), slots: make(chan struct{}, MaxHandshakes),
		done: make(chan struct{}), ended: make(chan struct{}), errs: make(chan error, 1), shaking: map[net.Conn]bool{}}
}

// PerPeer makes the queue count its slots per peer, as peer names the
// peer of a connection (its address, its process; "" for one it cannot
// name, which is not limited): a peer holds at most MaxPeerHandshakes of
// them, and its connections beyond are closed at once. Call it before the
// first Accept; it returns q.
func (q *Queue[C, R]) PerPeer(peer func(C) string) *Queue[C, R] {
	q.peer = peer
	q.perPeer = map[string]int{}
	return q
}

// Screen makes the queue ask screen about each connection as soon as it
// is accepted, before it takes a handshake slot: one screen refuses
// (false) is closed at once and holds no slot, so that connections of
// peers the listener turns away anyway (an untrusted user, say) cannot
// crowd out others. screen runs in the accepting goroutine: it must not
// block (it may write a short refusal to a fresh connection). Call it
// before the first Accept; it returns q.
func (q *Queue[C, R]) Screen(screen func(C) bool) *Queue[C, R] {
	q.screen = screen
	return q
}

// Accept waits for a request, the end of ctx, or the end of accepting
// (an error wrapping driver.ErrClosed once the queue is closed). A
// failed accept (out of descriptors, say) is reported to one Accept, and
// accepting goes on after a pause.
func (q *Queue[C, R]) Accept(ctx context.Context) (R, error) {
	q.start.Do(func() {
		// Under mu, so that the loop is counted before Close waits for
		// it, or not started at all once Close has begun.
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.closed {
			q.err = errClosed
			close(q.ended)
			return
		}
		q.wg.Add(1)
		go q.loop()
	})
	var none R
	select {
	case t := <-q.reqs:
		q.release(t.peer)
		return t.r, nil
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

// taken is a request with the peer whose slot it holds.
type taken[R any] struct {
	r    R
	peer string
}

// admit takes a slot of peer's, if it has one left; the queue's own slot
// is held.
func (q *Queue[C, R]) admit(peer string) bool {
	if peer == "" {
		return true
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.perPeer[peer] >= MaxPeerHandshakes {
		return false
	}
	q.perPeer[peer]++
	return true
}

// release gives back a slot of peer's and the queue's.
func (q *Queue[C, R]) release(peer string) {
	q.releasePeer(peer)
	<-q.slots
}

// releasePeer gives back a slot of peer's.
func (q *Queue[C, R]) releasePeer(peer string) {
	if peer == "" {
		return
	}
	q.mu.Lock()
	if q.perPeer[peer]--; q.perPeer[peer] <= 0 {
		delete(q.perPeer, peer)
	}
	q.mu.Unlock()
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
		if q.screen != nil && !q.screen(c) {
			c.Close()
			<-q.slots
			continue
		}
		var peer string
		if q.peer != nil {
			peer = q.peer(c)
		}
		if !q.admit(peer) {
			c.Close() // a peer that holds its share of slots already
			<-q.slots
			continue
		}
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			c.Close()
			q.release(peer)
			continue
		}
		q.shaking[c] = true
		q.wg.Add(1)
		q.mu.Unlock()
		go q.handshake(c, peer)
	}
}

// handshake runs shake on c and hands the request to Accept.
func (q *Queue[C, R]) handshake(c C, peer string) {
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
		q.release(peer)
		return
	}
	// The handshake is over: the peer's share counts handshakes under
	// way, not requests waiting for Accept, so that a peer that opens
	// connections faster than Accept takes them is not turned away.
	q.releasePeer(peer)
	select {
	case q.reqs <- taken[R]{r, ""}:
		return // Accept frees the slot
	case <-q.done:
		q.discard(r)
	}
	q.release("")
}
