// Package cm sets up reliable connections between queue pairs, in the
// manner of librdmacm: a server listens on an address and accepts or
// rejects connection requests, each carrying private data; a client dials
// with private data and a timeout. The QP attributes both sides need are
// exchanged, so a dialled or accepted QP is in RTS without a call to Modify.
//
// Addresses name the provider by their scheme:
//
//	loop://name          in-process (provider/loop)
//	shm:///path/to.sock  two processes on one host (provider/shm)
//	shm://@name          the same, on an abstract Unix socket
//	tcp://host:port      iWARP over TCP (provider/iwarp)
//
// A scheme works when the provider that serves it is imported.
//
// Receives must be posted before a connection is made, because tcp0 and
// other iWARP devices fail a Send that finds none (see "Portability" in
// package verbs): make the QP with NewEndpoint, which moves it to Init,
// post its receives, then Dial or Accept, as rdma_create_ep,
// rdma_post_recv and rdma_connect do in librdmacm. Dial and Accept take a
// QP made by pd.CreateQP too, for a connection that needs no receives
// before its first exchange.
//
// Listeners and connections are safe for concurrent use.
package cm

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Errors of connection setup; test them with errors.Is.
var (
	// ErrRefused: nothing listens at the address.
	ErrRefused = driver.ErrRefused
	// ErrRejected: the listener rejected the request; the *RejectError
	// carries its private data.
	ErrRejected = driver.ErrRejected
	// ErrPrivateData: the private data is longer than the provider carries.
	ErrPrivateData = driver.ErrPrivateData
	// ErrScheme: no imported provider serves the address's scheme.
	ErrScheme = errors.New("cm: no provider serves this address scheme: import the provider (loop://, shm://, tcp://)")
)

// RejectError is returned by Dial when the listener rejected the request;
// its one field, PrivateData []byte, is the rejection's private data.
// errors.Is(err, ErrRejected) holds for it.
type RejectError = driver.RejectError

// Param are the parameters of a connection request or reply (struct
// rdma_conn_param).
type Param struct {
	// PrivateData travels with the request, the acceptance or the
	// rejection. Each provider carries at least 56 bytes; longer data than
	// the provider carries is refused with ErrPrivateData, never truncated.
	PrivateData []byte
	// ResponderResources is how many RDMA Reads and atomics this side
	// serves at once (IRD); InitiatorDepth how many it issues (ORD). Zero
	// means the device maximum.
	ResponderResources uint8
	InitiatorDepth     uint8
	// RetryCount is the transport retry count (0 to 7; default 7). tcp0
	// turns it into the socket's timeout (see provider/iwarp).
	RetryCount uint8
	// RNRRetryCount is how often a Send that meets no posted receive is
	// retried (0 to 7, where 7 is forever; default 7), on devices that
	// retry: loop0 and shm0 wait MinRNRTimer and retry, forever by
	// default. tcp0 and other iWARP devices have no RNR retry and ignore
	// it: such a Send ends the connection, and completes with
	// WCRNRRetryExcErr. Post receives before connecting (NewEndpoint),
	// and no device depends on it.
	RNRRetryCount uint8
	// MinRNRTimer is how long this side asks senders to wait before such
	// a retry (encoded; 0 stands for 655 ms, so the default is 12, 0.64 ms),
	// on devices that retry.
	MinRNRTimer verbs.RNRTimer
	// NoDefaults sends zero RetryCount, RNRRetryCount and MinRNRTimer as
	// zeros; otherwise zeros stand for the defaults above.
	NoDefaults bool
	// HoldRTR, given to Accept, leaves the QP in RTR once connected: it
	// serves the requester's Sends, Writes, Reads and atomics (answering
	// the Reads and atomics), and its PostSend is refused
	// (verbs.ErrInvalidState) until the caller moves it to RTS with
	// Modify (the attributes of the RTR→RTS row of ibv_modify_qp(3)) —
	// as a passive side that manages its own QP does, moving it to RTS
	// when the requester's first message raises verbs.EventCommEst. A
	// held QP whose connection ends moves to the error state as one in
	// RTS does. Devices with verbs.CapCommEstEvent honour it; Dial, and
	// Accept on other devices, refuse it.
	HoldRTR bool
}

func (p *Param) driverParam(qp *verbs.QP) driver.ConnParam {
	a := qp.PD().Context().QueryDevice()
	dp := driver.ConnParam{
		PrivateData:        p.PrivateData,
		ResponderResources: p.ResponderResources,
		InitiatorDepth:     p.InitiatorDepth,
		RetryCount:         p.RetryCount,
		RNRRetryCount:      p.RNRRetryCount,
		MinRNRTimer:        p.MinRNRTimer,
		QPNum:              qp.Num(),
		HoldRTR:            p.HoldRTR,
	}
	if dp.ResponderResources == 0 {
		dp.ResponderResources = uint8(min(a.MaxQPRdAtom, 255))
	}
	if dp.InitiatorDepth == 0 {
		dp.InitiatorDepth = uint8(min(a.MaxQPInitRdAtom, 255))
	}
	if !p.NoDefaults {
		if dp.RetryCount == 0 {
			dp.RetryCount = 7
		}
		if dp.RNRRetryCount == 0 {
			dp.RNRRetryCount = 7
		}
		if dp.MinRNRTimer == 0 {
			dp.MinRNRTimer = 12
		}
	}
	return dp
}

func fromDriver(dp driver.ConnParam) Param {
	return Param{
		PrivateData:        dp.PrivateData,
		ResponderResources: dp.ResponderResources,
		InitiatorDepth:     dp.InitiatorDepth,
		RetryCount:         dp.RetryCount,
		RNRRetryCount:      dp.RNRRetryCount,
		MinRNRTimer:        dp.MinRNRTimer,
		NoDefaults:         true,
	}
}

// lookupScheme finds the imported provider that serves scheme.
func lookupScheme(scheme string) (driver.Driver, driver.ConnManager, bool) {
	for _, n := range verbs.Drivers() {
		d, _ := verbs.LookupDriver(n)
		if m, ok := d.(driver.ConnManager); ok {
			for _, s := range m.Schemes() {
				if s == scheme {
					return d, m, true
				}
			}
		}
	}
	return nil, nil, false
}

// resolve finds the provider serving addr and returns it with the address
// less its scheme.
func resolve(addr string) (driver.ConnManager, string, error) {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		return nil, "", fmt.Errorf("cm: address %q has no scheme: write it as loop://name, shm:///path.sock or tcp://host:port", addr)
	}
	if _, m, ok := lookupScheme(scheme); ok {
		return m, rest, nil
	}
	return nil, "", fmt.Errorf("%w (address %q)", ErrScheme, addr)
}

// Device returns the name of the device that serves addr's scheme — the
// device to open for a QP that will connect to or listen on addr: loop0
// for loop://, shm0 for shm://, tcp0 for tcp://, and for rdma://host:port
// the device the kernel routes host to (rxe0, siw0, mlx5_0, ...).
func Device(addr string) (string, error) {
	scheme, rest, _ := strings.Cut(addr, "://")
	if d, _, ok := lookupScheme(scheme); ok {
		if r, ok := d.(deviceRouter); ok {
			return r.DeviceFor(rest)
		}
		if devs := d.Devices(); len(devs) > 0 {
			return devs[0].Name, nil
		}
	}
	return "", fmt.Errorf("%w (address %q)", ErrScheme, addr)
}

// deviceRouter is a provider whose addresses are reached through one of
// several devices, as the kernel routes them (rdma://).
type deviceRouter interface {
	DeviceFor(addr string) (string, error)
}

func checkPrivateData(m driver.ConnManager, pd []byte) error {
	if max := m.MaxPrivateData(); len(pd) > max {
		return fmt.Errorf("%w: %d bytes, this provider carries at most %d", ErrPrivateData, len(pd), max)
	}
	return nil
}

// Listener accepts connection requests on an address.
type Listener struct {
	m    driver.ConnManager
	l    driver.Listener
	addr string
}

// ListenConfig configures a listener: the back-off of peers that fail
// remote accesses, and, on shm0, the users and groups it trusts besides
// its own. The zero value is the default of every field.
type ListenConfig = driver.ListenConfig

// Listen starts listening on addr (rdma_listen), with the default
// ListenConfig.
func Listen(addr string) (*Listener, error) { return ListenWith(addr, ListenConfig{}) }

// ListenWith starts listening on addr with cfg. A provider that has
// nothing to configure ignores cfg.
func ListenWith(addr string, cfg ListenConfig) (*Listener, error) {
	m, rest, err := resolve(addr)
	if err != nil {
		return nil, err
	}
	var l driver.Listener
	if cl, ok := m.(driver.ConfigListener); ok {
		l, err = cl.ListenConfig(rest, cfg)
	} else {
		l, err = m.Listen(rest)
	}
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", addr, err)
	}
	return &Listener{m: m, l: l, addr: addr}, nil
}

// Addr returns the address the listener serves, with its scheme.
func (l *Listener) Addr() string {
	scheme, _, _ := strings.Cut(l.addr, "://")
	return scheme + "://" + l.l.Addr()
}

// Accept waits for the next connection request, or for ctx to end.
func (l *Listener) Accept(ctx context.Context) (*Request, error) {
	r, err := l.l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return &Request{m: l.m, r: r}, nil
}

// Close stops listening. Requests already accepted are not affected.
func (l *Listener) Close() error { return l.l.Close() }

// Request is a connection request waiting for Accept or Reject.
type Request struct {
	m driver.ConnManager
	r driver.ConnRequest
}

// Param is what the requester sent, private data included.
func (r *Request) Param() Param { return fromDriver(r.r.Param()) }

// PrivateData is the requester's private data.
func (r *Request) PrivateData() []byte { return r.r.Param().PrivateData }

// Peer names the requester's side, for limits on what one peer may hold:
// on tcp:// its IP address ("tcp 192.0.2.7"), on shm:// its process as the
// kernel knows it ("shm uid 1000 pid 4242"). It is "" where the provider
// does not tell peers apart (loop://, in one process).
func (r *Request) Peer() string {
	if p, ok := r.r.(driver.PeerNamer); ok {
		return p.Peer()
	}
	return ""
}

// Accept connects qp, which must be in Reset or Init (receives posted in
// Init are kept; a QP in another state is refused with
// verbs.ErrInvalidState, and the request stays pending), to the requester,
// replies with p, and returns the connection with qp in RTS. The
// effective ORD and IRD are negotiated down to what each side allows.
// Like rdma_accept, it does not wait long for the requester beyond its
// reply: on tcp0 in iWARP's peer-to-peer mode it waits 100 ms at most for
// the requester's ready-to-receive message (which tells qp's DestQPNum
// when the requester is goverbs); the QP sends nothing before it, and the
// connection ends (Done) if it does not come within 1 s. On shm0 it waits
// 1 s at most for the requester's confirmation. So a requester that
// stalls holds no server that accepts requests one after another. A
// listener closes a connection that sends no request within 1 s, and
// holds at most 8 connections of one peer (see Peer) not yet handed to
// Accept: one peer's silent connections hold up no other peer's Dial.
// A requester that does not ask for peer-to-peer mode (Linux siw's) may
// wait for the server to speak first: the QP sends 100 ms after the reply
// if nothing has come from it by then.
func (r *Request) Accept(qp *verbs.QP, p *Param) (*Conn, error) {
	if p == nil {
		p = &Param{}
	}
	if err := checkPrivateData(r.m, p.PrivateData); err != nil {
		return nil, fmt.Errorf("cm: accept: %w", err)
	}
	if p.HoldRTR && !qp.PD().Context().QueryDevice().Has(verbs.CapCommEstEvent) {
		return nil, fmt.Errorf("cm: accept: %w: HoldRTR needs a device with CapCommEstEvent", verbs.ErrInvalidArg)
	}
	if err := checkConnectable(qp); err != nil {
		return nil, fmt.Errorf("cm: accept: %w (the request stays pending: accept it with another QP, or reject it)", err)
	}
	c, err := r.r.Accept(qp.Driver(), p.driverParam(qp))
	if err != nil {
		return nil, fmt.Errorf("cm: accept: %w", err)
	}
	return &Conn{c: c, qp: qp}, nil
}

// Reject refuses the request; the requester's Dial fails with a
// *RejectError that carries privateData.
func (r *Request) Reject(privateData []byte) error {
	if err := checkPrivateData(r.m, privateData); err != nil {
		return fmt.Errorf("cm: reject: %w", err)
	}
	return r.r.Reject(privateData)
}

// Dial connects qp, which must be in Reset or Init (receives posted in Init
// are kept; a QP in another state is refused with verbs.ErrInvalidState),
// to the listener at
// addr (rdma_connect), sending p. It returns when the listener accepts,
// rejects, or ctx ends; use context.WithTimeout for a timeout. On success
// qp is in RTS.
func Dial(ctx context.Context, addr string, qp *verbs.QP, p *Param) (*Conn, error) {
	if p == nil {
		p = &Param{}
	}
	m, rest, err := resolve(addr)
	if err != nil {
		return nil, err
	}
	if err := checkPrivateData(m, p.PrivateData); err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
	}
	if p.HoldRTR {
		return nil, fmt.Errorf("cm: dial %s: %w: HoldRTR is for Accept; a dialled QP is in RTS once connected", addr, verbs.ErrInvalidArg)
	}
	if err := checkConnectable(qp); err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
	}
	c, err := m.Dial(ctx, rest, qp.Driver(), p.driverParam(qp))
	if err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
	}
	return &Conn{c: c, qp: qp}, nil
}

// checkConnectable reports an error unless qp is in Reset or Init, the
// states a connection starts from, so that no provider (and no kernel) is
// asked to connect a QP in another.
func checkConnectable(qp *verbs.QP) error {
	a, err := qp.Query()
	if err != nil {
		return err
	}
	if a.State != verbs.QPSReset && a.State != verbs.QPSInit {
		return fmt.Errorf("%w: connecting needs a QP in Reset or Init, QP %d is in %v: move it to Reset first, or create a new QP", verbs.ErrInvalidState, qp.Num(), a.State)
	}
	return nil
}

// Conn is an established connection.
type Conn struct {
	c  driver.Conn
	qp *verbs.QP
}

// QP returns the connected queue pair.
func (c *Conn) QP() *verbs.QP { return c.qp }

// RemoteParam is what the peer sent: its acceptance for a dialled
// connection, its request for an accepted one.
func (c *Conn) RemoteParam() Param { return fromDriver(c.c.RemoteParam()) }

// PrivateData is the peer's private data.
func (c *Conn) PrivateData() []byte { return c.c.RemoteParam().PrivateData }

// Done is closed when the connection ends — closed by either side, or the
// peer gone — and the QP has moved to the error state (RDMA_CM_EVENT_DISCONNECTED).
func (c *Conn) Done() <-chan struct{} { return c.c.Done() }

// Close disconnects (rdma_disconnect): the QP moves to the error state,
// flushing outstanding work requests, and the peer is told. The QP itself
// remains; destroy it when its completions are drained.
func (c *Conn) Close() error { return c.c.Close() }
