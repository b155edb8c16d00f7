package rsock

import (
	"slices"
	"sync"

	"github.com/goverbs/goverbs/verbs"
)

// regionsPerConn is the number of memory regions a connection registers:
// its ring, its control messages, its staging buffer and the buffer of
// its last zero-copy Write.
const regionsPerConn = 4

// device is a device context shared by connections of the process on
// that device, opened with the first and closed with the last. A context
// holds at most as many connections as its regions allow (the device's
// MaxMR over regionsPerConn); more connections open further contexts.
// (Each connection has a protection domain of its own: a peer's rkey then
// reaches its own connection's ring and nothing else.)
type device struct {
	name string
	ctx  *verbs.Context
	attr verbs.DeviceAttr
	refs int // under devicesMu
}

// capacity is the number of connections d's context takes.
func (d *device) capacity() int { return max(1, d.attr.MaxMR/regionsPerConn) }

var (
	devicesMu sync.Mutex
	devices   = map[string][]*device{}
)

// openDevice returns a context of the named device with room for one
// more connection, opening one if none has. Each call is matched by one
// release.
func openDevice(name string) (*device, error) {
	devicesMu.Lock()
	defer devicesMu.Unlock()
	for _, d := range devices[name] {
		if d.refs < d.capacity() {
			d.refs++
			return d, nil
		}
	}
	ctx, err := verbs.Open(name)
	if err != nil {
		return nil, err
	}
	d := &device{name: name, ctx: ctx, attr: ctx.QueryDevice(), refs: 1}
	devices[name] = append(devices[name], d)
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
	devices[d.name] = slices.DeleteFunc(devices[d.name], func(x *device) bool { return x == d })
	if len(devices[d.name]) == 0 {
		delete(devices, d.name)
	}
	d.ctx.Close()
}
