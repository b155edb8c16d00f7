package cm

import (
	"context"
	"fmt"

	"github.com/goverbs/goverbs/verbs"
)

// Endpoint is a queue pair that cm has made ready for receives before it
// is connected, as librdmacm's rdma_create_ep makes one: NewEndpoint
// creates the QP and moves it to Init, the application posts its
// receives, and Dial or Accept connect it. Every receive posted before
// the connection is there for the peer's first Send, on every provider,
// so a program written this way does not depend on RNR retry, which
// tcp0 and other iWARP devices lack (see "Portability" in package verbs).
type Endpoint struct {
	qp *verbs.QP
}

// NewEndpoint creates a reliable-connected QP on pd with attr and moves
// it to Init on port 1, ready for PostRecv. Dial or Accept connect it;
// it accepts every remote operation (local write and
// remote read, write and atomics), so the rights of each memory region
// decide what its peer may do. A QP whose peer should reach less of pd
// is made with NewEndpointAccess.
func NewEndpoint(pd *verbs.PD, attr verbs.QPInitAttr) (*Endpoint, error) {
	return NewEndpointAccess(pd, attr, verbs.AccessLocalWrite|verbs.RemoteAccess)
}

// NewEndpointAccess is NewEndpoint with the QP's access flags: the
// remote operations its peer may perform on any memory region of pd,
// whatever the region's own rights (verbs.AccessLocalWrite alone refuses
// every RDMA Read, Write and atomic from the peer). Connecting keeps
// them; QP.Modify in RTS with verbs.QPAttrAccessFlags changes them, for
// example to widen them once the peer has proved who it is.
func NewEndpointAccess(pd *verbs.PD, attr verbs.QPInitAttr, access verbs.AccessFlags) (*Endpoint, error) {
	qp, err := pd.CreateQP(attr)
	if err != nil {
		return nil, fmt.Errorf("cm: endpoint: %w", err)
	}
	init := verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: access}
	if err := qp.Modify(&init, verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
		qp.Destroy()
		return nil, fmt.Errorf("cm: endpoint: %w", err)
	}
	return &Endpoint{qp: qp}, nil
}

// QP returns the endpoint's queue pair: post receives to it (or to its
// SRQ) before Dial or Accept, and work requests of every kind after.
func (e *Endpoint) QP() *verbs.QP { return e.qp }

// Dial connects the endpoint to the listener at addr, as the function
// Dial does; the receives posted to it are kept.
func (e *Endpoint) Dial(ctx context.Context, addr string, p *Param) (*Conn, error) {
	return Dial(ctx, addr, e.qp, p)
}

// Accept connects the endpoint to the requester of r, as Request.Accept
// does; the receives posted to it are kept.
func (e *Endpoint) Accept(r *Request, p *Param) (*Conn, error) {
	return r.Accept(e.qp, p)
}

// Destroy destroys the endpoint's QP (rdma_destroy_ep); close its
// connection first and drain its completions.
func (e *Endpoint) Destroy() error { return e.qp.Destroy() }
