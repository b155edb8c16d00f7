package kv

import (
	"crypto/sha256"
	"errors"

	"github.com/goverbs/goverbs/internal/hmacauth"
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
//
// An Authorizer that also implements Keyring has its clients prove who
// they are: it is asked only about the requests of a client that proved
// it holds the secret of an identity (the PUTs and DELETEs of the others
// are refused), with that identity. An Authorizer that does not is asked
// about every client's requests, with a nil identity: no client has
// proved anything to it.
type Authorizer interface {
	// Authorize is called for each PUT and DELETE, on the server's
	// serving loop, so it must be quick and must not block. id is the
	// identity the client proved (DialConfig.Identity), op the
	// operation and key its key, valid only during the call (copy what
	// is kept). An error refuses the request: the client's call fails
	// with ErrDenied and the table is unchanged.
	Authorize(id []byte, op Op, key []byte) error
}

// Keyring holds the secrets of the identities clients prove. A client
// dialled with DialConfig{Identity: id, Credential: secret} proves that
// it holds secret by a challenge and response when it connects: the
// secret itself never crosses the network, and a recorded handshake is
// refused on any other connection.
type Keyring interface {
	// Secret returns the secret of identity id, or false if there is
	// no such identity. It is called on the server's serving loop, once
	// per connection that tries to prove an identity, so it must be
	// quick and must not block. Secrets shorter than MinCredential are
	// refused.
	Secret(id []byte) ([]byte, bool)
}

// MaxIdentity is the longest identity a client names: it travels, with
// the client's nonce, in the connection request, whose private data
// every provider carries 56 bytes of.
const MaxIdentity = maxHelloLen - helloHeader

// MinCredential is the shortest credential (secret) a client proves.
const MinCredential = hmacauth.MinSecret

// The labels of the connection proof's MACs (internal/hmacauth): the
// client's proof, and the server's answer that it holds the secret too.
const (
	labelClient = "goverbs kv client\x00"
	labelServer = "goverbs kv server\x00"
)

// proof is the MAC that proves to the other end that this end holds
// secret, for the connection whose request is h and acceptance i (each in
// its canonical length: what the MAC covers is what both ends decoded).
func proof(secret []byte, label string, h hello, i info) []byte {
	return hmacauth.Sum(secret, label, h, i)
}

// proofOK reports, in constant time, whether mac is proof(secret, label,
// h, i).
func proofOK(mac, secret []byte, label string, h hello, i info) bool {
	return len(secret) >= MinCredential && hmacauth.Check(mac, secret, label, h, i)
}

// allowAll is the default Authorizer.
type allowAll struct{}

func (allowAll) Authorize([]byte, Op, []byte) error { return nil }

// errNoProof refuses the changes of a client that proved no identity to a
// server whose Authorizer is a Keyring.
var errNoProof = errors.New("kv: the client proved no identity")

type tokenAuthorizer struct{ secret [sha256.Size]byte }

// TokenAuthorizer returns an Authorizer that allows the PUTs and DELETEs
// of clients that prove they hold TokenCredential(token), under any
// identity, and refuses all others. The token does not cross the
// network: a client proves it by a challenge and response when it
// connects, so that watching an honest client's traffic yields nothing
// that connects as it.
func TokenAuthorizer(token []byte) Authorizer {
	return tokenAuthorizer{secret: sha256.Sum256(token)}
}

// Authorize allows every request: the server asks only about clients
// that proved they hold the token.
func (a tokenAuthorizer) Authorize([]byte, Op, []byte) error { return nil }

// Secret returns the token's credential, whatever the identity.
func (a tokenAuthorizer) Secret([]byte) ([]byte, bool) { return a.secret[:], true }

// TokenCredential returns the credential a client proves to a server that
// takes TokenAuthorizer(token): the token's SHA-256, so that a token of
// any length gives a credential of MinCredential bytes or more.
func TokenCredential(token []byte) []byte {
	h := sha256.Sum256(token)
	return h[:]
}
