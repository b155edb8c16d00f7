package perftest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The bench protocol rides on cm: the client's connection request carries
// a request (what to run, and where the client's buffer is), the server's
// acceptance a reply (where its buffer is), and a rejection a line of text
// that says why. After the measured loop the client Sends a done message
// and the server answers with a report of its CPU time. Every message is
// a []byte view, big-endian, and fits the 56 bytes of private data every
// provider carries.

const (
	wireMagic   = 0x4756424e // "GVBN"
	wireVersion = 1
)

// request is the client's connection request:
//
//	0 magic u32   4 version u8   5 test u8   6 flags u8 (1: events, 2: credits)   7 reserved
//	8 size u32   12 iters u32   16 warmup u32
//	20 rx depth u16   22 inline u16   24 cq-mod u16   26 tx depth u16
//	28 rkey u32   32 addr u64 (the client's target area)
type request []byte

const requestLen = 40

func (r request) test() Test    { return Test(r[5]) }
func (r request) rkey() uint32  { return binary.BigEndian.Uint32(r[28:]) }
func (r request) addr() uint64  { return binary.BigEndian.Uint64(r[32:]) }
func (r request) event() bool   { return r[6]&1 != 0 }
func (r request) credits() bool { return r[6]&2 != 0 }
func (r request) u32(o int) int { return int(binary.BigEndian.Uint32(r[o:])) }
func (r request) u16(o int) int { return int(binary.BigEndian.Uint16(r[o:])) }

// encodeRequest makes the request for a run of p, with the client's
// target area rb; with credits, the server of send_bw sends credits.
func encodeRequest(p Params, rb remoteBuf, credits bool) request {
	r := make(request, requestLen)
	binary.BigEndian.PutUint32(r[0:], wireMagic)
	r[4] = wireVersion
	r[5] = byte(p.Test)
	if p.Event {
		r[6] |= 1
	}
	if credits {
		r[6] |= 2
	}
	binary.BigEndian.PutUint32(r[8:], uint32(p.Size))
	binary.BigEndian.PutUint32(r[12:], uint32(p.Iters))
	binary.BigEndian.PutUint32(r[16:], uint32(p.Warmup))
	binary.BigEndian.PutUint16(r[20:], uint16(p.RxDepth))
	binary.BigEndian.PutUint16(r[22:], uint16(p.Inline))
	binary.BigEndian.PutUint16(r[24:], uint16(p.CQMod))
	binary.BigEndian.PutUint16(r[26:], uint16(p.TxDepth))
	binary.BigEndian.PutUint32(r[28:], rb.rkey)
	binary.BigEndian.PutUint64(r[32:], rb.addr)
	return r
}

var errNotBench = errors.New("the peer does not speak the goverbs bench protocol (or another version of it)")

// decodeRequest returns the parameters, the client's buffer and the
// credits flag a request names.
func decodeRequest(b []byte) (Params, remoteBuf, bool, error) {
	r := request(b)
	if len(r) < requestLen || binary.BigEndian.Uint32(r) != wireMagic || r[4] != wireVersion {
		return Params{}, remoteBuf{}, false, errNotBench
	}
	p := Params{Test: r.test(), Size: r.u32(8), Iters: r.u32(12), Warmup: r.u32(16),
		RxDepth: r.u16(20), Inline: r.u16(22), CQMod: r.u16(24), TxDepth: r.u16(26), Event: r.event(),
		PostList: 1} // the client's alone: not on the wire
	return p, remoteBuf{addr: r.addr(), rkey: r.rkey()}, r.credits(), nil
}

// reply is the server's acceptance: 0 magic u32, 4 version u8, 5-7
// reserved, 8 addr u64, 16 rkey u32 — the server's target area.
const replyLen = 20

func encodeReply(rb remoteBuf) []byte {
	b := make([]byte, replyLen)
	binary.BigEndian.PutUint32(b[0:], wireMagic)
	b[4] = wireVersion
	binary.BigEndian.PutUint64(b[8:], rb.addr)
	binary.BigEndian.PutUint32(b[16:], rb.rkey)
	return b
}

func decodeReply(b []byte) (remoteBuf, error) {
	if len(b) < replyLen || binary.BigEndian.Uint32(b) != wireMagic || b[4] != wireVersion {
		return remoteBuf{}, errNotBench
	}
	return remoteBuf{addr: binary.BigEndian.Uint64(b[8:]), rkey: binary.BigEndian.Uint32(b[16:])}, nil
}

// A control message (done, report) is ctrlLen bytes: 0 magic u32,
// 4 kind u8, 5-7 reserved, 8 CPU time in ns i64 (-1: not measured),
// 16 process ID u32, 20 reserved.
const (
	ctrlLen    = 24
	ctrlDone   = 1
	ctrlReport = 2
)

// ctrlMsg is what a control message carries.
type ctrlMsg struct {
	cpu time.Duration // -1: not measured
	pid int
}

func encodeCtrl(b []byte, kind byte, m ctrlMsg) {
	clear(b[:ctrlLen])
	binary.BigEndian.PutUint32(b[0:], wireMagic)
	b[4] = kind
	binary.BigEndian.PutUint64(b[8:], uint64(m.cpu))
	binary.BigEndian.PutUint32(b[16:], uint32(m.pid))
}

func decodeCtrl(b []byte, kind byte) (ctrlMsg, error) {
	if len(b) < ctrlLen || binary.BigEndian.Uint32(b) != wireMagic {
		return ctrlMsg{}, errNotBench
	}
	if b[4] != kind {
		return ctrlMsg{}, fmt.Errorf("control message of kind %d, want %d: %w", b[4], kind, errNotBench)
	}
	return ctrlMsg{cpu: time.Duration(binary.BigEndian.Uint64(b[8:])), pid: int(binary.BigEndian.Uint32(b[16:]))}, nil
}

// RejectedError is returned by Run when the server refused the run; Reason
// says why and what to do.
type RejectedError struct {
	Reason string
}

// Error says that the server refused, and why.
func (e *RejectedError) Error() string { return "the bench server refused: " + e.Reason }

// rejectReason cuts a rejection's reason to what the provider carries.
func rejectReason(err error, max int) []byte {
	b := []byte(err.Error())
	if len(b) > max {
		b = b[:max]
	}
	return b
}
