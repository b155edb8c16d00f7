package rlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// The wire protocol. Every message is a []byte view with accessors, as
// gVisor's header package does it; a message is validated (valid) before
// any field is used, and a message that fails validation is never
// applied: the connection it came on is closed with ERROR.
//
// Connections are set up with package cm; the request and the reply carry
// a connMsg in their private data (56 bytes, what every provider carries).
// Between members, the reply carries only the acceptor's nonce and proof,
// and the acceptor's real reply travels in an ANSWER once the dialer has
// proved that it is a member (see auth.go).
// The kinds of connection:
//
//	kindReplicate  a primary connects to a replica to push records to it
//	kindFetch      a member being promoted connects to a member to pull
//	               records from it (the roles of replicate, reversed)
//	kindFence      a member being promoted asks a member to adopt its epoch
//	               and to say how long its log is; the answer is the
//	               private data of the connection's rejection, so no queue
//	               pair is made for this one-shot question
//	kindClient     a client connects to the primary to append
//
// On a replicate or fetch connection, after AUTH and ANSWER, the side that receives records (the
// receiver) sends HELLO first; the sender answers START, then pushes DATA;
// the receiver answers STATUS. Either may send ERROR and disconnect.

// connMsg is the private data of a connection request or reply:
//
//	0  magic u32        4 version u8    5 kind u8    6 status u8 (replies)
//	7  buffers u8       8 epoch u64     16 member id u64    24 cluster u64
//	32 a u64            40 b u64        48 buffer size u32  52 rkey u32
//
// a and b depend on the kind: in a member's request, the dialer's nonce
// (with its mode in the status byte and its member index in rkey); the
// receiver's ring address (replicate answer); the client message size and
// MaxRecord (client reply); the member's last sequence number and the
// epoch of its last record (fence answer). A member's accept reply is
// instead: 8 the acceptor's nonce [16], 24 its MAC [32].
type connMsg []byte

const (
	connMsgLen   = 56
	connMagic    = 0x474c5647 // "GVLG"
	protoVersion = 2
)

// Connection kinds.
const (
	kindReplicate = 1
	kindFetch     = 2
	kindFence     = 3
	kindClient    = 4
)

// Status codes, in connection replies, ERROR messages and client replies.
const (
	codeOK           = 0
	codeFenced       = 1  // the peer has promised a higher epoch
	codeNotPrimary   = 2  // a client reached a member that is not the primary
	codeCluster      = 3  // the peer belongs to another cluster
	codeUnavailable  = 4  // the peer cannot serve (closing, broken log, busy)
	codeTooFarBehind = 5  // the receiver needs records the sender no longer keeps
	codeStorage      = 6  // a write or sync of the log failed
	codeProtocol     = 7  // a malformed or unexpected message
	codeTooLarge     = 8  // a record larger than MaxRecord
	codeBadRequest   = 9  // a malformed client request
	codeShutdown     = 10 // the member is closing
	codeTooManyConns = 11 // no room for another connection
	codeUnknown      = 12 // the primary stopped before the append was committed: outcome unknown
	codeAuth         = 13 // the peer did not prove that it is a member
	maxCode          = 13
)

func newConnMsg(kind uint8) connMsg {
	m := make(connMsg, connMsgLen)
	binary.LittleEndian.PutUint32(m[0:], connMagic)
	m[4], m[5] = protoVersion, kind
	return m
}

func (m connMsg) kind() uint8       { return m[5] }
func (m connMsg) status() uint8     { return m[6] }
func (m connMsg) buffers() int      { return int(m[7]) }
func (m connMsg) epoch() uint64     { return binary.LittleEndian.Uint64(m[8:]) }
func (m connMsg) member() uint64    { return binary.LittleEndian.Uint64(m[16:]) }
func (m connMsg) cluster() uint64   { return binary.LittleEndian.Uint64(m[24:]) }
func (m connMsg) a() uint64         { return binary.LittleEndian.Uint64(m[32:]) }
func (m connMsg) b() uint64         { return binary.LittleEndian.Uint64(m[40:]) }
func (m connMsg) bufSize() int      { return int(binary.LittleEndian.Uint32(m[48:])) }
func (m connMsg) rkey() uint32      { return binary.LittleEndian.Uint32(m[52:]) }
func (m connMsg) setStatus(s uint8) { m[6] = s }
func (m connMsg) setBuffers(n int)  { m[7] = uint8(n) }
func (m connMsg) setEpoch(e uint64) { binary.LittleEndian.PutUint64(m[8:], e) }
func (m connMsg) setMember(id uint64) {
	binary.LittleEndian.PutUint64(m[16:], id)
}
func (m connMsg) setCluster(c uint64) { binary.LittleEndian.PutUint64(m[24:], c) }
func (m connMsg) setA(v uint64)       { binary.LittleEndian.PutUint64(m[32:], v) }
func (m connMsg) setB(v uint64)       { binary.LittleEndian.PutUint64(m[40:], v) }
func (m connMsg) setBufSize(n int)    { binary.LittleEndian.PutUint32(m[48:], uint32(n)) }
func (m connMsg) setRKey(k uint32)    { binary.LittleEndian.PutUint32(m[52:], k) }

// ring returns the receiver's ring as a connMsg describes it.
func (m connMsg) ring() ringInfo {
	return ringInfo{addr: m.a(), rkey: m.rkey(), buffers: m.buffers(), bufSize: m.bufSize()}
}

func (m connMsg) setRing(r ringInfo) {
	m.setA(r.addr)
	m.setRKey(r.rkey)
	m.setBuffers(r.buffers)
	m.setBufSize(r.bufSize)
}

// valid checks the fixed part: length, magic, version, a known kind and
// status.
func (m connMsg) valid() bool {
	return len(m) >= connMsgLen && binary.LittleEndian.Uint32(m[0:]) == connMagic && m[4] == protoVersion &&
		m.kind() >= kindReplicate && m.kind() <= kindClient && m.status() <= maxCode
}

// ringInfo describes a receiver's buffers: where the sender writes.
type ringInfo struct {
	addr    uint64
	rkey    uint32
	buffers int
	bufSize int
}

// Control message types.
const (
	msgHello  = 1
	msgStart  = 2
	msgData   = 3
	msgStatus = 4
	msgError  = 5
	msgAppend = 6
	msgReply  = 7
	msgAuth   = 8
	msgAnswer = 9
)

// msg is a control message sent over send/recv. Every message starts
//
//	0 type u8    1 flags u8    2 reserved u16    4 length u32 (the whole message)
//
// and the type fixes what follows (see the lengths below).
type msg []byte

const (
	msgHeader = 8
	// ctrlSize is the size of every control receive buffer: the largest
	// control message (a HELLO with maxHistory entries) fits.
	ctrlSize = 4096
	// maxHistory is how many epochs of its history a receiver sends.
	maxHistory = 128

	helloLen   = 48 // + 16 per history entry
	startLen   = 32
	dataLen    = 48 // + the frames, in send mode
	statusLen  = 40
	errorLen   = 12 // + the text
	maxErrText = 200
	appendLen  = 24 // + the records, each a u32 length and the bytes
	replyLen   = 32 // + the error text
	authLen    = 56
	answerLen  = 8 + connMsgLen + macLen

	flagNack = 1 // STATUS: the batch of generation nackGen failed its checks
)

func (m msg) typ() uint8   { return m[0] }
func (m msg) flags() uint8 { return m[1] }
func (m msg) length() int  { return int(binary.LittleEndian.Uint32(m[4:])) }
func (m msg) u32(off int) uint32 {
	return binary.LittleEndian.Uint32(m[off:])
}
func (m msg) u64(off int) uint64 { return binary.LittleEndian.Uint64(m[off:]) }
func (m msg) put32(off int, v uint32) {
	binary.LittleEndian.PutUint32(m[off:], v)
}
func (m msg) put64(off int, v uint64) { binary.LittleEndian.PutUint64(m[off:], v) }

// newMsg lays out the header of a message of type t and length n in b
// and returns the message.
func newMsg(b []byte, t uint8, n int) msg {
	m := msg(b[:n])
	clear(m[:msgHeader])
	m[0] = t
	m.put32(4, uint32(n))
	return m
}

// parseMsg checks the header of a received message of n bytes: it is at
// least as long as its type's fixed part, its length field matches n, and
// its type-specific checks pass. It returns the message cut to its
// length.
func parseMsg(b []byte) (msg, error) {
	if len(b) < msgHeader {
		return nil, errMsg("message of %d bytes is shorter than a header", len(b))
	}
	m := msg(b)
	if m.length() != len(b) {
		return nil, errMsg("message length field %d, but %d bytes arrived", m.length(), len(b))
	}
	min := 0
	switch m.typ() {
	case msgHello:
		min = helloLen
	case msgStart:
		min = startLen
	case msgData:
		min = dataLen
	case msgStatus:
		min = statusLen
	case msgError:
		min = errorLen
	case msgAppend:
		min = appendLen
	case msgReply:
		min = replyLen
	case msgAuth:
		min = authLen
	case msgAnswer:
		min = answerLen
	default:
		return nil, errMsg("unknown message type %d", m.typ())
	}
	if len(m) < min {
		return nil, errMsg("message of type %d has %d bytes, less than its %d", m.typ(), len(m), min)
	}
	switch m.typ() {
	case msgHello:
		if n := m.histLen(); n > maxHistory || len(m) != helloLen+16*n {
			return nil, errMsg("HELLO with %d history entries in %d bytes", n, len(m))
		}
	case msgStart, msgStatus, msgAuth, msgAnswer:
		if len(m) != min {
			return nil, errMsg("message of type %d has %d bytes, not %d", m.typ(), len(m), min)
		}
	case msgData:
		if m.dataCount() == 0 || m.dataLast()-m.dataFirst() != uint64(m.dataCount()-1) || m.dataFirst() == 0 ||
			m.dataLast() < m.dataFirst() || m.dataBytes() < frameHeader*m.dataCount() {
			return nil, errMsg("DATA describes records %d to %d as %d records in %d bytes", m.dataFirst(), m.dataLast(), m.dataCount(), m.dataBytes())
		}
		if len(m) != dataLen && len(m) != dataLen+m.dataBytes() {
			return nil, errMsg("DATA of %d bytes carries neither nothing nor its %d bytes of frames", len(m), m.dataBytes())
		}
	case msgError:
		if int(m.errTextLen()) != len(m)-errorLen {
			return nil, errMsg("ERROR text length %d in %d bytes", m.errTextLen(), len(m))
		}
	case msgReply:
		if int(m.replyTextLen()) != len(m)-replyLen {
			return nil, errMsg("reply text length %d in %d bytes", m.replyTextLen(), len(m))
		}
	}
	return m, nil
}

// ProtocolError is a message from a peer that failed validation.
type ProtocolError struct{ Reason string }

// Error says what the peer did wrong.
func (e *ProtocolError) Error() string { return "rlog: protocol violation: " + e.Reason }

// Is makes errors.Is(err, ErrProtocol) hold.
func (e *ProtocolError) Is(target error) bool { return target == ErrProtocol }

func errMsg(format string, args ...any) error {
	return &ProtocolError{Reason: fmt.Sprintf(format, args...)}
}

// HELLO (receiver to sender, first):
//
//	8 promised epoch u64   16 first kept seq u64   24 last seq u64
//	32 durable seq u64     40 history entries u32  44 reserved u32
//	48 history: (epoch u64, first seq u64) per entry, oldest first
func (m msg) helloEpoch() uint64 { return m.u64(8) }
func (m msg) helloFirst() uint64 { return m.u64(16) }
func (m msg) helloLast() uint64  { return m.u64(24) }
func (m msg) histLen() int       { return int(m.u32(40)) }
func (m msg) hist(i int) epochStart {
	return epochStart{epoch: m.u64(helloLen + 16*i), first: m.u64(helloLen + 16*i + 8)}
}

func putHello(b []byte, promised, first, last, durable uint64, hist []epochStart) msg {
	if len(hist) > maxHistory {
		hist = hist[len(hist)-maxHistory:]
	}
	m := newMsg(b, msgHello, helloLen+16*len(hist))
	m.put64(8, promised)
	m.put64(16, first)
	m.put64(24, last)
	m.put64(32, durable)
	m.put32(40, uint32(len(hist)))
	m.put32(44, 0)
	for i, h := range hist {
		m.put64(helloLen+16*i, h.epoch)
		m.put64(helloLen+16*i+8, h.first)
	}
	return m
}

// helloHistory returns the history a HELLO carries, after checking that
// it is a history: epochs increasing, first seqs increasing, all within
// the log the HELLO describes.
func (m msg) helloHistory() ([]epochStart, error) {
	h := make([]epochStart, m.histLen())
	for i := range h {
		h[i] = m.hist(i)
		if h[i].first == 0 || h[i].first > m.helloLast() || h[i].epoch == 0 {
			return nil, errMsg("HELLO history entry %d (epoch %d from %d) outside the log 1..%d", i, h[i].epoch, h[i].first, m.helloLast())
		}
		if i > 0 && (h[i].epoch <= h[i-1].epoch || h[i].first <= h[i-1].first) {
			return nil, errMsg("HELLO history entries %d and %d out of order", i-1, i)
		}
	}
	if m.helloLast() > 0 && len(h) == 0 {
		return nil, errMsg("HELLO of a log of %d records has no history", m.helloLast())
	}
	if m.helloFirst() > m.helloLast()+1 || m.helloFirst() == 0 {
		return nil, errMsg("HELLO first seq %d after last %d", m.helloFirst(), m.helloLast())
	}
	return h, nil
}

// START (sender to receiver): keep records up to truncate, drop the rest;
// DATA follows from truncate+1.
//
//	8 truncate u64   16 generation u32   20 reserved u32   24 sender's last seq u64
func (m msg) startTruncate() uint64 { return m.u64(8) }
func (m msg) startGen() uint32      { return m.u32(16) }
func (m msg) startLast() uint64     { return m.u64(24) }

func putStart(b []byte, truncate uint64, gen uint32, last uint64) msg {
	m := newMsg(b, msgStart, startLen)
	m.put64(8, truncate)
	m.put32(16, gen)
	m.put32(20, 0)
	m.put64(24, last)
	return m
}

// DATA (sender to receiver): a batch of frames, written into buffer buf
// of the receiver's ring before this message (write mode), or carried
// after this header (send mode).
//
//	8 generation u32   12 buffer u32   16 bytes u32   20 records u32
//	24 first seq u64   32 last seq u64  40 commit u64 (the sender's commit index)
func (m msg) dataGen() uint32    { return m.u32(8) }
func (m msg) dataBuf() int       { return int(m.u32(12)) }
func (m msg) dataBytes() int     { return int(m.u32(16)) }
func (m msg) dataCount() int     { return int(m.u32(20)) }
func (m msg) dataFirst() uint64  { return m.u64(24) }
func (m msg) dataLast() uint64   { return m.u64(32) }
func (m msg) dataCommit() uint64 { return m.u64(40) }

// putData lays out the header in b; with inline, its length field counts
// the frames that follow it in the same Send (from another SGE).
func putData(b []byte, gen uint32, buf, bytes, count int, first, last, commit uint64, inline bool) msg {
	m := newMsg(b, msgData, dataLen)
	if inline {
		m.put32(4, uint32(dataLen+bytes))
	}
	m.put32(8, gen)
	m.put32(12, uint32(buf))
	m.put32(16, uint32(bytes))
	m.put32(20, uint32(count))
	m.put64(24, first)
	m.put64(32, last)
	m.put64(40, commit)
	return m
}

// STATUS (receiver to sender):
//
//	8 released u64 (DATA messages consumed, their buffers free again)
//	16 durable seq u64   24 expected seq u64 (with flagNack)   32 nack generation u32   36 reserved u32
func (m msg) statusReleased() uint64 { return m.u64(8) }
func (m msg) statusDurable() uint64  { return m.u64(16) }
func (m msg) statusExpect() uint64   { return m.u64(24) }
func (m msg) statusNackGen() uint32  { return m.u32(32) }
func (m msg) statusNack() bool       { return m.flags()&flagNack != 0 }

func putStatus(b []byte, released, durable uint64, nack bool, expect uint64, nackGen uint32) msg {
	m := newMsg(b, msgStatus, statusLen)
	if nack {
		m[1] = flagNack
	}
	m.put64(8, released)
	m.put64(16, durable)
	m.put64(24, expect)
	m.put32(32, nackGen)
	m.put32(36, 0)
	return m
}

// ERROR (either way): 8 code u16   10 text length u16   12 text.
func (m msg) errCode() uint8     { return uint8(binary.LittleEndian.Uint16(m[8:])) }
func (m msg) errTextLen() uint16 { return binary.LittleEndian.Uint16(m[10:]) }
func (m msg) errText() string    { return string(m[errorLen:]) }
func putError(b []byte, code uint8, text string) msg {
	if len(text) > maxErrText {
		text = text[:maxErrText]
	}
	m := newMsg(b, msgError, errorLen+len(text))
	binary.LittleEndian.PutUint16(m[8:], uint16(code))
	binary.LittleEndian.PutUint16(m[10:], uint16(len(text)))
	copy(m[errorLen:], text)
	return m
}

// APPEND (client to primary): records to append, in order.
//
//	8 request id u64   16 records u32   20 reserved u32
//	24 records: each a length u32 and that many bytes
func (m msg) appendID() uint64 { return m.u64(8) }
func (m msg) appendCount() int { return int(m.u32(16)) }

// appendRecords calls fn with each record of an APPEND, after checking the
// whole request: the count matches, no record exceeds max, nothing is
// left over. It returns codeOK, codeTooLarge or codeBadRequest.
func (m msg) appendRecords(max int, fn func(rec []byte)) uint8 {
	code := m.walkAppend(max, nil)
	if code == codeOK && fn != nil {
		m.walkAppend(max, fn)
	}
	return code
}

func (m msg) walkAppend(max int, fn func([]byte)) uint8 {
	off, n := appendLen, m.appendCount()
	if n == 0 {
		return codeBadRequest
	}
	tooLarge := false
	for range n {
		if len(m)-off < 4 {
			return codeBadRequest
		}
		l := int(m.u32(off))
		off += 4
		if l > len(m)-off {
			return codeBadRequest
		}
		if l > max {
			tooLarge = true
		} else if fn != nil {
			fn(m[off : off+l])
		}
		off += l
	}
	if off != len(m) {
		return codeBadRequest
	}
	if tooLarge {
		return codeTooLarge
	}
	return codeOK
}

// startAppend lays out an APPEND header in b; addAppend adds records.
func startAppend(b []byte, id uint64) msg {
	m := newMsg(b, msgAppend, appendLen)
	m.put64(8, id)
	m.put32(16, 0)
	m.put32(20, 0)
	return m
}

// addAppend appends rec to the APPEND m laid out in b (whose capacity
// bounds the message) and returns the longer message, or false if it does
// not fit.
func addAppend(b []byte, m msg, rec []byte) (msg, bool) {
	n := len(m) + 4 + len(rec)
	if n > len(b) {
		return m, false
	}
	m = msg(b[:n])
	m.put32(n-len(rec)-4, uint32(len(rec)))
	copy(m[n-len(rec):], rec)
	m.put32(4, uint32(n))
	m.put32(16, m.u32(16)+1)
	return m, true
}

// appendSize is the bytes rec adds to an APPEND.
func appendSize(rec []byte) int { return 4 + len(rec) }

// REPLY (primary to client):
//
//	8 request id u64   16 first seq u64   24 records u32   28 status u8
//	29 reserved u8     30 text length u16  32 text (why, when status is not OK)
func (m msg) replyID() uint64      { return m.u64(8) }
func (m msg) replyFirst() uint64   { return m.u64(16) }
func (m msg) replyCount() int      { return int(m.u32(24)) }
func (m msg) replyStatus() uint8   { return m[28] }
func (m msg) replyTextLen() uint16 { return binary.LittleEndian.Uint16(m[30:]) }
func (m msg) replyText() string    { return string(m[replyLen:]) }

func putReply(b []byte, id, first uint64, count int, status uint8, text string) msg {
	if len(text) > maxErrText {
		text = text[:maxErrText]
	}
	m := newMsg(b, msgReply, replyLen+len(text))
	m.put64(8, id)
	m.put64(16, first)
	m.put32(24, uint32(count))
	m[28], m[29] = status, 0
	binary.LittleEndian.PutUint16(m[30:], uint16(len(text)))
	copy(m[replyLen:], text)
	return m
}

// replySize is the size of a client's reply buffers.
const replySize = replyLen + maxErrText

// codeError turns a status code and its text into an error.
func codeError(code uint8, text string) error {
	var base error
	switch code {
	case codeOK:
		return nil
	case codeFenced:
		base = ErrFenced
	case codeNotPrimary:
		base = ErrNotPrimary
	case codeCluster:
		base = ErrCluster
	case codeUnavailable, codeShutdown, codeTooManyConns:
		base = ErrUnavailable
	case codeTooFarBehind:
		base = ErrTooFarBehind
	case codeStorage:
		base = ErrStorage
	case codeTooLarge:
		base = ErrTooLarge
	case codeUnknown:
		base = ErrOutcomeUnknown
	case codeAuth:
		base = ErrAuth
	case codeBadRequest, codeProtocol:
		base = ErrProtocol
	default:
		base = ErrProtocol
	}
	if text = strings.TrimPrefix(text, base.Error()+": "); text == "" {
		return base
	}
	return fmt.Errorf("%w: %s", base, text)
}

// errorCode is the status code that reports err to a peer.
func errorCode(err error) uint8 {
	switch {
	case errors.Is(err, ErrFenced):
		return codeFenced
	case errors.Is(err, ErrTooFarBehind):
		return codeTooFarBehind
	case errors.Is(err, ErrStorage):
		return codeStorage
	case errors.Is(err, ErrProtocol):
		return codeProtocol
	case errors.Is(err, ErrClosed):
		return codeShutdown
	case errors.Is(err, ErrCluster):
		return codeCluster
	case errors.Is(err, ErrAuth):
		return codeAuth
	}
	return codeUnavailable
}
