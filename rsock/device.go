package rsock

import (
	"sync"

	"github.com/goverbs/goverbs/verbs"
)

// device is a device context and protection domain shared by every
// connection of the process on that device, opened with the first and
// closed with the last.
type device struct {
	name string
	ctx  *verbs.Context
	pd   *verbs.PD
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
	pd, err := ctx.AllocPD()
	if err != nil {
		ctx.Close()
		return nil, err
	}
	d := &device{name: name, ctx: ctx, pd: pd, attr: ctx.QueryDevice(), refs: 1}
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
	d.pd.Dealloc()
	d.ctx.Close()
}
