// Package hmacauth is the proof of a shared secret that kv's and rlog's
// handshakes use: each end draws a fresh nonce, and an end proves that it
// holds the secret with HMAC-SHA256(secret, label ‖ …), where the parts
// after the label are both nonces and whatever names the connection (the
// request, the queue pair numbers). The other end computes the same MAC
// and compares it in constant time.
//
// Because the MAC covers a nonce the verifier chose for this connection,
// a proof recorded on one connection proves nothing on another, and the
// secret itself never crosses the network. The label keeps a MAC made for
// one purpose (a client's proof) from passing for another (a server's
// answer): every label a protocol uses must differ from its others and
// should name the protocol.
package hmacauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
)

const (
	// NonceLen is the length of a handshake nonce.
	NonceLen = 16
	// MACLen is the length of a proof.
	MACLen = sha256.Size
	// MinSecret is the shortest secret worth proving: shorter ones are
	// refused by the protocols that use this package.
	MinSecret = 16
)

// NewNonce fills b with bytes from crypto/rand, whose Read never fails
// (it ends the program if the system's source does).
func NewNonce(b []byte) { rand.Read(b) }

// Sum returns HMAC-SHA256(secret, label ‖ parts[0] ‖ parts[1] ‖ …). The
// parts are concatenated as they are, with no lengths between them: give
// parts of fixed length, or parts whose lengths an earlier fixed-length
// part states, so that two different lists of parts never concatenate to
// the same bytes.
func Sum(secret []byte, label string, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(label))
	for _, p := range parts {
		h.Write(p)
	}
	return h.Sum(nil)
}

// Check reports whether mac is Sum(secret, label, parts...). The
// comparison takes the same time wherever the first difference lies
// (hmac.Equal), so that a peer cannot find a valid MAC byte by byte.
func Check(mac, secret []byte, label string, parts ...[]byte) bool {
	return hmac.Equal(mac, Sum(secret, label, parts...))
}
