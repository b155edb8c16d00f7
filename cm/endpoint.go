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
// like every QP cm connects, it then accepts the remote operations its
// peer's keys allow (the rights of each memory region decide what a peer
// may do).
func NewEndpoint(pd *verbs.PD, attr verbs.QPInitAttr) (*Endpoint, error) {
	qp, err := pd.CreateQP(attr)
	if err != nil {
		return nil, fmt.Errorf("cm: endpoint: %w", err)
	}
	init := verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite | verbs.RemoteAccess}
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
