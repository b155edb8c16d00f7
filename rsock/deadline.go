package rsock

import (
	"sync"
	"time"
)

// deadline is a read or write deadline: a channel closed when it passes,
// which a blocked operation selects on, so that a deadline set while the
// operation waits takes effect at once.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline has passed
}

func (d *deadline) init() { d.cancel = make(chan struct{}) }

// set sets the deadline; the zero time means none.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired: wait until its function has closed cancel
	}
	d.timer = nil
	passed := closed(d.cancel)
	if t.IsZero() {
		if passed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if passed {
			d.cancel = make(chan struct{})
		}
		c := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(c) })
		return
	}
	if !passed {
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
func (d *deadline) passed() bool { return closed(d.wait()) }

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
