package verbs

import (
	"fmt"
	"sort"
	"sync"

	"github.com/goverbs/goverbs/verbs/driver"
)

var (
	driversMu sync.RWMutex
	drivers   = map[string]driver.Driver{}
)

// Register makes a provider available under name. Providers call it from
// their init function. It panics if name is registered twice or d is nil,
// as database/sql.Register does.
func Register(name string, d driver.Driver) {
	driversMu.Lock()
	defer driversMu.Unlock()
	if d == nil {
		panic("verbs: Register driver is nil")
	}
	if _, dup := drivers[name]; dup {
		panic("verbs: Register called twice for driver " + name)
	}
	drivers[name] = d
}

// Drivers returns the names of the registered providers, sorted.
func Drivers() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	names := make([]string, 0, len(drivers))
	for n := range drivers {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// LookupDriver returns the provider registered under name. It is meant for
// helper packages such as cm; applications use Open.
func LookupDriver(name string) (driver.Driver, bool) {
	driversMu.RLock()
	defer driversMu.RUnlock()
	d, ok := drivers[name]
	return d, ok
}

// Devices lists the devices of every registered provider (ibv_get_device_list).
func Devices() []DeviceInfo {
	var out []DeviceInfo
	for _, n := range Drivers() {
		d, _ := LookupDriver(n)
		out = append(out, d.Devices()...)
	}
	return out
}

// Open opens the device called name (ibv_open_device), for example "loop0".
func Open(name string) (*Context, error) {
	for _, n := range Drivers() {
		d, _ := LookupDriver(n)
		for _, info := range d.Devices() {
			if info.Name != name {
				continue
			}
			dc, err := d.Open(name)
			if err != nil {
				return nil, fmt.Errorf("verbs: open %s: %w", name, err)
			}
			return &Context{d: dc, info: info, attr: dc.QueryDevice(), closed: make(chan struct{})}, nil
		}
	}
	return nil, fmt.Errorf("verbs: open %q: %w (is its provider imported?)", name, ErrNoDevice)
}

// Context is an open device.
type Context struct {
	d         driver.Context
	info      DeviceInfo
	attr      DeviceAttr
	closed    chan struct{} // closed by Close, for the goroutines in CQ.Wait
	closeOnce sync.Once
	// life is held shared by each destroy of an object made on the
	// context, exclusively by Close while it marks the context closed:
	// a destroy is over before Close destroys everything, or finds the
	// context closed.
	life sync.RWMutex
}

// Device describes the device the context was opened on.
func (c *Context) Device() DeviceInfo { return c.info }

// QueryDevice returns the device's limits and capabilities (ibv_query_device).
func (c *Context) QueryDevice() DeviceAttr { return c.attr }

// Events delivers the device's asynchronous events (ibv_get_async_event):
// QP fatal errors, CQ overruns, SRQ limit events. Read it if you care; it
// drops events when nobody does.
func (c *Context) Events() <-chan AsyncEvent { return c.d.Events() }

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (c *Context) AllocPD() (*PD, error) {
	d, err := c.d.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("verbs: alloc PD: %w", err)
	}
	return &PD{ctx: c, d: d}, nil
}

// CreateCQ creates a completion queue with room for at least cqe
// completions (ibv_create_cq).
func (c *Context) CreateCQ(cqe int) (*CQ, error) {
	if cqe < 1 || cqe > c.attr.MaxCQE {
		return nil, fmt.Errorf("verbs: create CQ of %d entries: %w (the device allows 1 to %d)", cqe, ErrInvalidArg, c.attr.MaxCQE)
	}
	cq := &CQ{ctx: c, done: make(chan struct{}), pass: make(chan struct{}, 1)}
	d, err := c.d.CreateCQ(cqe, cq)
	if err != nil {
		return nil, fmt.Errorf("verbs: create CQ: %w", err)
	}
	cq.d = d
	cq.sleeper, _ = d.(driver.Sleeper)
	cq.cqe = cqe
	if s, ok := d.(driver.Sizer); ok {
		cq.cqe = s.CQE()
	}
	return cq, nil
}

// Close closes the device and releases every resource created on it; the
// peers of its connected QPs see their connections break, and goroutines
// in CQ.Wait on its CQs return ErrClosed. Destroying one of those objects
// afterwards or while Close runs, in any order, returns ErrClosed; a
// destroy already under way when Close is called completes first.
func (c *Context) Close() error {
	c.life.Lock()
	c.closeOnce.Do(func() { close(c.closed) })
	c.life.Unlock()
	return c.d.Close()
}

// closedErr is the error of destroying obj once the context is closed:
// its Close destroyed everything made on it. It is nil while the
// context is open. The destroy holds c.life shared.
func (c *Context) closedErr(obj string) error {
	select {
	case <-c.closed:
		return fmt.Errorf("verbs: %s: %w: the context was closed, which destroyed it", obj, ErrClosed)
	default:
		return nil
	}
}
