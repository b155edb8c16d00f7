package rsock

import (
	"sync"

	"github.com/goverbs/goverbs/verbs"
)

// device is a device context shared by every connection of the process
// on that device, opened with the first and closed with the last. (Each
// connection has a protection domain of its own: a peer's rkey then
// reaches its own connection's ring and nothing else.)
type device struct {
	name string
	ctx  *verbs.Context
	attr verbs.DeviceAttr
	refs int // under devicesMu
}

var (
	devicesMu sync.Mutex
	devices   = map[string]*device{}
)

// openDevice returns the shared context of the named device, opening it
// if no connection holds it. Each call is matched by one release.
func openDevice(name string) (*device, error) {
	devicesMu.Lock()
	defer devicesMu.Unlock()
	if d := devices[name]; d != nil {
		d.refs++
		return d, nil
	}
	ctx, err := verbs.Open(name)
	if err != nil {
		return nil, err
	}
	d := &device{name: name, ctx: ctx, attr: ctx.QueryDevice(), refs: 1}
	devices[name] = d
	return d, nil
}

// release drops one reference; the last closes the context.
func (d *device) release() {
	devicesMu.Lock()
	defer devicesMu.Unlock()
	d.refs--
	if d.refs > 0 {
		return
	}
	delete(devices, d.name)
	d.ctx.Close()
}
