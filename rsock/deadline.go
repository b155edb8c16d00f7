package rsock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadline is a read or write deadline: a channel closed when it passes,
// which a blocked operation selects on, so that a deadline set while the
// operation waits takes effect at once.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline has passed
	gone   atomic.Bool   // cancel is closed: the hot path reads this, not cancel
	at     atomic.Int64  // the deadline in Unix nanoseconds; 0: none
	sealed bool          // the connection is closed: the deadline stays passed
}

func (d *deadline) init() { d.cancel = make(chan struct{}) }

// set sets the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sealed {
		return
	}
	if t.IsZero() {
		d.at.Store(0)
	} else {
		d.at.Store(t.UnixNano())
	}
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait until its function has closed cancel
	}
	d.timer = nil
	passed := closed(d.cancel)
	if t.IsZero() {
		if passed {
			d.cancel = make(chan struct{})
			d.gone.Store(false)
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if passed {
			d.cancel = make(chan struct{})
			d.gone.Store(false)
		}
		c := d.cancel
		d.timer = time.AfterFunc(dur, func() {
			d.gone.Store(true)
			close(c)
		})
		return
	}
	if !passed {
		d.gone.Store(true)
		close(d.cancel)
	}
}

// wait returns the channel closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

// passed reports whether the deadline has passed.
func (d *deadline) passed() bool { return d.gone.Load() }

// seal makes the deadline pass for good: it wakes the calls that wait
// when the connection closes.
func (d *deadline) seal() {
	d.set(time.Unix(0, 1))
	d.mu.Lock()
	d.sealed = true
	d.mu.Unlock()
}

// stop stops the timer, so that no goroutine outlives the connection.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel
	}
	d.timer = nil
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// waitCtx is the context.Context of a completion queue wait (verbs.CQ.Wait)
// bounded by a deadline, and what the waits of one direction (Read, or
// Write) have learnt of how long the peer takes. It lives in the
// connection, so a wait allocates no context; the call that holds the
// direction's lock (readMu, writeMu) uses it.
type waitCtx struct {
	dl *deadline
	// gap is the moving average of how long the last waits took until
	// a completion came, in nanoseconds.
	gap time.Duration
}

// spinGrowth bounds how far a wait's spin grows past Config.Spin, on a
// device whose poll costs no system call; iwarpSpinGrowth on iWARP, where
// it costs one.
const (
	spinGrowth      = 10
	iwarpSpinGrowth = 4
)

// spinFor is how long a wait polls before it parks: twice the recent
// waits' average, when that exceeds base and the average stays within
// growth×base, at most that; base otherwise. A peer that answers
// within a few times base, as a request/response protocol over a busy
// connection does, is then caught without a wake-up; an idle connection
// spins base and parks.
func (w *waitCtx) spinFor(base time.Duration, growth int) time.Duration {
	if base <= 0 {
		return 0
	}
	limit := time.Duration(growth) * base
	if w.gap > limit {
		return base
	}
	return min(max(2*w.gap, base), limit)
}

// learn takes in a wait that ended with a completion after d.
func (w *waitCtx) learn(d time.Duration) { w.gap = (3*w.gap + d) / 4 }

func (w *waitCtx) Deadline() (time.Time, bool) {
	if t := w.dl.at.Load(); t != 0 {
		return time.Unix(0, t), true
	}
	return time.Time{}, false
}

func (w *waitCtx) Done() <-chan struct{} { return w.dl.wait() }

func (w *waitCtx) Err() error {
	if w.dl.passed() {
		return context.DeadlineExceeded
	}
	return nil
}

func (w *waitCtx) Value(any) any { return nil }
