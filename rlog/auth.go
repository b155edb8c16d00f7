package rlog

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hmacauth"
	"github.com/goverbs/goverbs/verbs"
)

// Membership. The members of a log are the addresses of Config.Members,
// and every member holds the cluster's secret (Config.Secret). A
// connection between members — replicate, fetch, fence — carries nothing
// that changes a member's state or grants memory until both ends have
// proved that they hold the secret:
//
//  1. The dialer's request (connMsg) names the kind, the epoch, its own
//     member id and index, the cluster, and a fresh nonce Nd.
//  2. The acceptor accepts the connection with nothing but a fresh nonce
//     Na and HMAC-SHA256(secret, "acceptor" ‖ request ‖ Na ‖ its index):
//     no member id, no epoch, no ring.
//  3. The dialer checks that MAC (the member it meant to reach holds the
//     secret) and sends AUTH: HMAC-SHA256(secret, "dialer" ‖ request ‖ Na
//     ‖ the acceptor's index ‖ the grant), where the grant is the
//     dialer's ring for a fetch.
//  4. The acceptor checks AUTH; only then does it promise an epoch, step
//     down, register a ring or answer a fence, and it sends ANSWER: its
//     reply (connMsg) and HMAC-SHA256(secret, "answer" ‖ request ‖ Na ‖
//     reply), which the dialer checks before it uses the reply.
//
// Both nonces come from crypto/rand and every MAC covers the whole
// request (kind, epoch, member ids, both indices, the nonces), so a
// response recorded on one connection proves nothing on another. A peer
// that fails is told codeAuth and disconnected. The handshake proves who
// is at each end when the connection is set up; it does not sign the
// session's later messages, so a network that lets an attacker inject
// into an established connection is outside what it defends.
//
// What clients may do and learn is in the package documentation.

const (
	// MinSecret is the shortest cluster secret a member takes.
	MinSecret = hmacauth.MinSecret
	nonceLen  = hmacauth.NonceLen
	macLen    = hmacauth.MACLen

	// authTimeout bounds how long an accepted member connection may
	// take to prove itself, and maxPendingAuth how many may be proving
	// themselves at once; more are refused (codeTooManyConns).
	authTimeout    = time.Second
	maxPendingAuth = 8

	labelAcceptor = "goverbs rlog acceptor\x00"
	labelDialer   = "goverbs rlog dialer\x00"
	labelAnswer   = "goverbs rlog answer\x00"
)

// In a member's connection request, a and b carry the dialer's nonce,
// the status byte the mode and the rkey field the dialer's index.
func (m connMsg) nonce() []byte       { return m[32 : 32+nonceLen] }
func (m connMsg) mode() Mode          { return Mode(m[6]) }
func (m connMsg) setMode(md Mode)     { m[6] = uint8(md) }
func (m connMsg) index() int          { return int(m.rkey()) }
func (m connMsg) setIndex(i int)      { m.setRKey(uint32(i)) }
func (m connMsg) acceptNonce() []byte { return m[8 : 8+nonceLen] }
func (m connMsg) acceptMAC() []byte   { return m[8+nonceLen : 8+nonceLen+macLen] }

// authParts are the parts after the label of a member handshake's MAC
// (internal/hmacauth): req ‖ nonce ‖ index ‖ extra.
func authParts(req connMsg, nonce []byte, index int, extra []byte) [][]byte {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(index))
	return [][]byte{req[:connMsgLen], nonce, b[:], extra}
}

// authMAC computes HMAC-SHA256(secret, label ‖ req ‖ nonce ‖ index ‖ extra).
func authMAC(secret []byte, label string, req connMsg, nonce []byte, index int, extra []byte) []byte {
	return hmacauth.Sum(secret, label, authParts(req, nonce, index, extra)...)
}

// authOK reports, in constant time, whether mac is authMAC(secret, label,
// req, nonce, index, extra).
func authOK(mac, secret []byte, label string, req connMsg, nonce []byte, index int, extra []byte) bool {
	return hmacauth.Check(mac, secret, label, authParts(req, nonce, index, extra)...)
}

// AUTH (dialer to acceptor, first):
//
//	8 MAC [32]   40 ring address u64   48 rkey u32   52 reserved u32
//
// The ring is the dialer's grant (a fetch), zero otherwise.
func (m msg) authMAC() []byte   { return m[8 : 8+macLen] }
func (m msg) authGrant() []byte { return m[40:authLen] }
func (m msg) authRing() (uint64, uint32) {
	return m.u64(40), m.u32(48)
}

func putAuth(b []byte, mac []byte, addr uint64, rkey uint32) msg {
	m := newMsg(b, msgAuth, authLen)
	m.put64(40, addr)
	m.put32(48, rkey)
	m.put32(52, 0)
	copy(m[8:], mac)
	return m
}

// ANSWER (acceptor to dialer, once the dialer proved itself):
//
//	8 reply (a connMsg) [56]   64 MAC [32]
func (m msg) answer() connMsg   { return connMsg(m[8 : 8+connMsgLen]) }
func (m msg) answerMAC() []byte { return m[8+connMsgLen : answerLen] }
func putAnswer(b []byte, reply connMsg, mac []byte) msg {
	m := newMsg(b, msgAnswer, answerLen)
	copy(m[8:], reply[:connMsgLen])
	copy(m[8+connMsgLen:], mac)
	return m
}

// newNonce fills b from crypto/rand.
func newNonce(b []byte) { hmacauth.NewNonce(b) }

// hsWRID marks the handshake's work requests on a link; the session's
// never have this bit.
const (
	hsWRID = 1 << 62
	hsSlot = 128 // the handshake buffer: a receive slot, then a send slot
	// maxStash bounds the session's completions a handshake keeps (a
	// well-behaved peer sends at most its first message, HELLO, before
	// the handshake is done; a hostile shm0 peer may write more).
	maxStash = 16
)

// hsSend sends b from the link's handshake send slot.
func (k *link) hsSend(b msg) error {
	n := copy(k.hs.Bytes()[hsSlot:], b)
	wr := []verbs.SendWR{{WRID: hsWRID | 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{k.hs.SGE(hsSlot, n)}}}
	if _, err := k.qp.PostSend(wr); err != nil {
		return fmt.Errorf("%w: %w", errPeerGone, err)
	}
	return nil
}

// hsBuf is where a handshake message is laid out before hsSend.
func (k *link) hsBuf() []byte { return make([]byte, hsSlot) }

// hsWait waits for the handshake's own completions — its send's, if
// send, and its one receive's, if recv — and returns the message
// received. Completions of the session's work requests that arrive
// meanwhile are kept for the session (stash).
func (k *link) hsWait(ctx context.Context, send, recv bool) (msg, error) {
	var got msg
	wc := make([]verbs.WorkCompletion, 1)
	for send || recv {
		n, err := waitCQ(ctx, k.cq, wc, nil, nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			continue
		}
		c := wc[0]
		if c.WRID&hsWRID == 0 {
			if len(k.stash) == maxStash {
				return nil, errMsg("%d completions of the session before the handshake's own", maxStash)
			}
			k.stash = append(k.stash, c)
			continue
		}
		if c.Status != verbs.WCSuccess {
			return nil, wcError(c)
		}
		if c.Opcode != verbs.WCRecv {
			send = false
			continue
		}
		b, err := verbs.Received(&c, k.hs.Bytes()[:hsSlot])
		if err != nil {
			return nil, &ProtocolError{Reason: err.Error()}
		}
		if got, err = parseMsg(append([]byte(nil), b...)); err != nil {
			return nil, err
		}
		recv = false
	}
	return got, nil
}

// takeStash returns the session's completions that the handshake polled.
func (k *link) takeStash() []verbs.WorkCompletion {
	s := k.stash
	k.stash = nil
	return s
}

// dialMember connects link k to member target for req (whose kind,
// epoch and kind-specific fields are set), proves that this member
// belongs, checks that the peer does, sends grant (a ring the peer may
// write, for a fetch in ModeWrite; nil for none) and returns the peer's
// answer. k's QP lets the peer write only once the peer has proved that
// it is a member, and only if there is a grant. A refusal is an
// error naming the status; an answer with a status other than codeOK is
// returned as it is.
func (m *Member) dialMember(ctx context.Context, k *link, target int, req connMsg, grant *ringInfo) (connMsg, error) {
	addr := m.cfg.Members[target]
	req.setMember(m.ID())
	req.setCluster(m.cluster)
	req.setIndex(m.self)
	newNonce(req.nonce())
	ctx, cancel := context.WithTimeout(ctx, m.cfg.DialTimeout)
	defer cancel()
	conn, err := cm.Dial(ctx, addr, k.qp, &cm.Param{PrivateData: req})
	if err != nil {
		return nil, rejectError(err)
	}
	k.conn = conn
	r := connMsg(conn.PrivateData())
	if len(r) < connMsgLen || !r.valid() || r.kind() != req.kind() ||
		!authOK(r.acceptMAC(), m.cfg.Secret, labelAcceptor, req, r.acceptNonce(), target, nil) {
		return nil, fmt.Errorf("%w: %s did not prove that it is a member", ErrAuth, addr)
	}
	na := append([]byte(nil), r.acceptNonce()...)
	var grantAddr uint64
	var grantKey uint32
	if grant != nil {
		if err := k.allowRemoteWrite(); err != nil {
			return nil, err
		}
		grantAddr, grantKey = grant.addr, grant.rkey
	}
	b := k.hsBuf()
	a := putAuth(b, nil, grantAddr, grantKey)
	copy(a.authMAC(), authMAC(m.cfg.Secret, labelDialer, req, na, target, a.authGrant()))
	if err := k.hsSend(a); err != nil {
		return nil, err
	}
	ans, err := k.hsWait(ctx, true, true)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %s did not answer: %w", ErrUnavailable, addr, err)
		}
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, addr, err)
	}
	if ans.typ() != msgAnswer {
		return nil, fmt.Errorf("%w: %s sent message type %d instead of its answer", ErrProtocol, addr, ans.typ())
	}
	reply := ans.answer()
	if !authOK(ans.answerMAC(), m.cfg.Secret, labelAnswer, req, na, target, reply) {
		return nil, fmt.Errorf("%w: %s sent an answer that it did not sign", ErrAuth, addr)
	}
	if !reply.valid() || reply.kind() != req.kind() {
		return nil, fmt.Errorf("%w: %s answered with a reply that is not one", ErrProtocol, addr)
	}
	return append(connMsg(nil), reply...), nil
}

// pendingMember is an accepted member connection that has yet to prove
// itself: the request, the nonce this member chose, the link.
type pendingMember struct {
	req connMsg
	na  []byte
	k   *link
}

// acceptMember accepts a member connection on k, answering only with a
// nonce and this member's proof.
func (m *Member) acceptMember(req *cm.Request, cmsg connMsg, k *link) (*pendingMember, error) {
	p := &pendingMember{req: append(connMsg(nil), cmsg...), k: k}
	reply := newConnMsg(cmsg.kind())
	newNonce(reply.acceptNonce())
	p.na = append([]byte(nil), reply.acceptNonce()...)
	copy(reply.acceptMAC(), authMAC(m.cfg.Secret, labelAcceptor, p.req, p.na, m.self, nil))
	conn, err := req.Accept(k.qp, &cm.Param{PrivateData: reply})
	if err != nil {
		return nil, err
	}
	k.conn = conn
	return p, nil
}

// authTimeout is how long a member connection may take to prove itself.
func (m *Member) authTimeout() time.Duration {
	if m.cfg.hooks != nil && m.cfg.hooks.authTimeout != 0 {
		return m.cfg.hooks.authTimeout
	}
	return authTimeout
}

// verify waits for the dialer's AUTH and checks it; it returns the AUTH.
func (p *pendingMember) verify(ctx context.Context, timeout time.Duration, secret []byte, self int) (msg, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	a, err := p.k.hsWait(ctx, false, true)
	if err != nil {
		return nil, fmt.Errorf("%w: no proof of membership: %w", ErrAuth, err)
	}
	if a.typ() != msgAuth {
		return nil, fmt.Errorf("%w: message type %d instead of a proof of membership", ErrAuth, a.typ())
	}
	if !authOK(a.authMAC(), secret, labelDialer, p.req, p.na, self, a.authGrant()) {
		return nil, fmt.Errorf("%w: a wrong proof of membership", ErrAuth)
	}
	return a, nil
}

// answer sends the dialer reply, signed, and waits until it is sent.
func (p *pendingMember) answer(ctx context.Context, secret []byte, self int, reply connMsg) error {
	ctx, cancel := context.WithTimeout(ctx, authTimeout)
	defer cancel()
	if err := p.k.hsSend(putAnswer(p.k.hsBuf(), reply, authMAC(secret, labelAnswer, p.req, p.na, self, reply))); err != nil {
		return err
	}
	_, err := p.k.hsWait(ctx, true, false)
	return err
}
