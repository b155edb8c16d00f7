package kv

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
)

// Op is an operation that changes the table, as an Authorizer sees it.
type Op uint8

// The operations an Authorizer decides on.
const (
	OpPut    Op = opPut
	OpDelete Op = opDel
)

func (o Op) String() string {
	switch o {
	case OpPut:
		return "PUT"
	case OpDelete:
		return "DELETE"
	}
	return "unknown operation"
}

// Authorizer decides which PUTs and DELETEs a server applies. GETs are
// not asked about: they are one-sided reads of memory every client may
// read (see the package doc).
type Authorizer interface {
	// Authorize is called for each PUT and DELETE, on the server's
	// serving loop, so it must be quick and must not block. cred is the
	// credential the client dialled with (DialConfig.Credential; empty
	// if it gave none), op the operation and key its key, valid only
	// during the call (copy what is kept). An error refuses the
	// request: the client's call fails with ErrDenied and the table is
	// unchanged.
	Authorize(cred []byte, op Op, key []byte) error
}

// MaxCredential is the longest credential a client presents: it travels
// in the connection request, whose private data every provider carries
// 56 bytes of.
const MaxCredential = 48

// allowAll is the default Authorizer.
type allowAll struct{}

func (allowAll) Authorize([]byte, Op, []byte) error { return nil }

// errWrongToken is TokenAuthorizer's refusal.
var errWrongToken = errors.New("kv: the client's credential is not the server's token")

type tokenAuthorizer struct{ want [sha256.Size]byte }

// TokenAuthorizer returns an Authorizer that allows the PUTs and DELETEs
// of clients that dialled with TokenCredential(token) as their credential
// and refuses all others. The comparison takes the same time whatever
// the credential, so that a client cannot find the token byte by byte.
// The credential crosses the network as it is (tcp0 does not encrypt):
// the token keeps out clients that do not know it, not those that can
// watch the traffic of one that does.
func TokenAuthorizer(token []byte) Authorizer {
	return tokenAuthorizer{want: sha256.Sum256(token)}
}

func (a tokenAuthorizer) Authorize(cred []byte, _ Op, _ []byte) error {
	if subtle.ConstantTimeCompare(cred, a.want[:]) != 1 {
		return errWrongToken
	}
	return nil
}

// TokenCredential returns the credential a client presents to a server
// that takes TokenAuthorizer(token): the token's SHA-256, so that a
// token of any length fits the connection request.
func TokenCredential(token []byte) []byte {
	h := sha256.Sum256(token)
	return h[:]
}
