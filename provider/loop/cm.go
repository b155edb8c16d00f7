package loop

import (
	"context"
	"fmt"
	"sync"

	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The loop provider's connection manager: listeners are names in the
// in-process fabric, and accepting a request connects both QPs at once.

func (*provider) Schemes() []string { return []string{"loop"} }

func (*provider) MaxPrivateData() int { return deviceAttr.MaxPrivateData }

// listener is a named point requests are delivered to.
type listener struct {
	name   string
	reqs   chan *request
	closed chan struct{}
	once   sync.Once
}

func (*provider) Listen(name string) (driver.Listener, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty loop address: use loop://name", driver.ErrInvalidArg)
	}
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if fab.listeners[name] != nil {
		return nil, fmt.Errorf("%w: loop://%s is already listening", driver.ErrBusy, name)
	}
	l := &listener{name: name, reqs: make(chan *request, 16), closed: make(chan struct{})}
	fab.listeners[name] = l
	return l, nil
}

func (l *listener) Addr() string { return l.name }

func (l *listener) Accept(ctx context.Context) (driver.ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.closed:
		return nil, driver.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close stops listening and refuses the requests not yet accepted.
func (l *listener) Close() error {
	l.once.Do(func() {
		fab.mu.Lock()
		delete(fab.listeners, l.name)
		fab.mu.Unlock()
		close(l.closed)
		for {
			select {
			case r := <-l.reqs:
				r.Reject(nil)
			default:
				return
			}
		}
	})
	return nil
}

// Request states.
const (
	reqPending = iota
	reqAnswered
	reqAbandoned
)

// request is a connection request in flight. state is guarded by fab.mu.
type request struct {
	param  driver.ConnParam
	dialer *qp
	state  int
	reply  chan reply
}

type reply struct {
	conn *conn
	err  error
}

func (r *request) Param() driver.ConnParam { return r.param }

// answer claims the request for an answer; false if the dialler gave up.
func (r *request) answer() bool {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if r.state != reqPending {
		return false
	}
	r.state = reqAnswered
	return true
}

func (r *request) Reject(privateData []byte) error {
	if !r.answer() {
		return fmt.Errorf("%w: the requester gave up", driver.ErrClosed)
	}
	r.reply <- reply{err: &driver.RejectError{PrivateData: clone(privateData)}}
	return nil
}

func (r *request) Accept(dq driver.QP, p driver.ConnParam) (driver.Conn, error) {
	q, err := soft.Own[*qp](dq)
	if err != nil {
		return nil, err
	}
	if !r.answer() {
		return nil, fmt.Errorf("%w: the requester gave up", driver.ErrClosed)
	}
	p.PrivateData = clone(p.PrivateData)
	p.QPNum = q.num
	err = soft.ConnectRTR(q, p, r.param)
	if err == nil {
		err = soft.FinishAccept(q, p, r.param)
	}
	if err == nil {
		err = soft.ConnectRC(r.dialer, r.param, p)
	}
	if err != nil {
		r.reply <- reply{err: err}
		return nil, err
	}
	l := &link{done: make(chan struct{})}
	fab.mu.Lock()
	l.qps = [2]*qp{q, r.dialer}
	q.link, r.dialer.link = l, l
	if q.destroyed || r.dialer.destroyed {
		l.breakLocked()
	}
	fab.mu.Unlock()
	r.reply <- reply{conn: &conn{link: l, remote: p}}
	return &conn{link: l, remote: r.param}, nil
}

func (*provider) Dial(ctx context.Context, name string, dq driver.QP, p driver.ConnParam) (driver.Conn, error) {
	q, err := soft.Own[*qp](dq)
	if err != nil {
		return nil, err
	}
	fab.mu.Lock()
	l := fab.listeners[name]
	state := q.attr.State
	fab.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("%w: nothing listens at loop://%s", driver.ErrRefused, name)
	}
	if state != driver.QPSReset && state != driver.QPSInit {
		return nil, fmt.Errorf("%w: dial needs a QP in Reset or Init, this one is %v", driver.ErrInvalidState, state)
	}
	p.PrivateData = clone(p.PrivateData)
	p.QPNum = q.num
	r := &request{param: p, dialer: q, reply: make(chan reply, 1)}
	select {
	case l.reqs <- r:
	case <-l.closed:
		return nil, fmt.Errorf("%w: loop://%s closed", driver.ErrRefused, name)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case rep := <-r.reply:
		return rep.conn, rep.err
	case <-ctx.Done():
		fab.mu.Lock()
		gaveUp := r.state == reqPending
		if gaveUp {
			r.state = reqAbandoned
		}
		fab.mu.Unlock()
		if gaveUp {
			return nil, ctx.Err()
		}
		// The listener is answering right now: take its answer.
		rep := <-r.reply
		return rep.conn, rep.err
	}
}

// link is an established connection between two loop QPs. Breaking it —
// a disconnect, a QP destroyed, a context closed — moves both QPs to the
// error state, flushing their work requests, and closes done.
type link struct {
	qps    [2]*qp
	done   chan struct{}
	broken bool
}

// breakLocked breaks the link; fab.mu is held.
func (l *link) breakLocked() {
	if l.broken {
		return
	}
	l.broken = true
	for _, q := range l.qps {
		if q != nil && !q.destroyed {
			q.toErr()
		}
	}
	close(l.done)
}

// conn is one side's view of a link.
type conn struct {
	link   *link
	remote driver.ConnParam
}

func (c *conn) RemoteParam() driver.ConnParam { return c.remote }
func (c *conn) Done() <-chan struct{}         { return c.link.done }

func (c *conn) Close() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	c.link.breakLocked()
	return nil
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
