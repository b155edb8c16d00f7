package kv

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/goverbs/goverbs/internal/hmacauth"
)

// The RPC protocol over send/recv, and the server's description of its
// index carried in the connection's private data. Messages are []byte
// views.

// Operations.
const (
	opPut = 1
	opDel = 2
	opGet = 3 // the fallback GET, after too many torn reads
	// opAuth proves the client's identity: the value is the client's
	// proof; the reply's value the server's (see Keyring). A connection
	// makes one attempt.
	opAuth = 4
	// opGrant asks for the keys the connection's GETs read with: the
	// reply's value is a grant. It is the second half of the handshake,
	// a connection's first request, and made once.
	opGrant = 5
)

// Reply statuses.
const (
	statusOK       = 0
	statusNotFound = 1
	statusFull     = 2 // the key's bucket or the value heap is full
	statusTooLarge = 3
	statusBad      = 4 // malformed request
	statusDenied   = 5 // the Authorizer refused it, or the proof was wrong
	statusReplayed = 6 // the request's id is not above the connection's last one
	statusNoGrant  = 7 // opGrant refused: not the first request, or the windows could not be bound
)

// request: op u8, reserved u8, key length u16, value length u32, id u64,
// then key and value.
type request []byte

const requestHeader = 16

func (r request) op() uint8   { return r[0] }
func (r request) keyLen() int { return int(binary.LittleEndian.Uint16(r[2:])) }
func (r request) valLen() int { return int(binary.LittleEndian.Uint32(r[4:])) }
func (r request) id() uint64  { return binary.LittleEndian.Uint64(r[8:]) }

// valid checks a request of n bytes received.
func (r request) valid() bool {
	return len(r) >= requestHeader && r.keyLen() <= MaxKey && requestHeader+r.keyLen()+r.valLen() == len(r)
}
func (r request) key() []byte { return r[requestHeader : requestHeader+r.keyLen()] }
func (r request) val() []byte { return r[requestHeader+r.keyLen():] }

// putRequest lays out a request in b and returns its length.
func putRequest(b []byte, op uint8, id uint64, key, val []byte) int {
	b[0], b[1] = op, 0
	binary.LittleEndian.PutUint16(b[2:], uint16(len(key)))
	binary.LittleEndian.PutUint32(b[4:], uint32(len(val)))
	binary.LittleEndian.PutUint64(b[8:], id)
	n := copy(b[requestHeader:], key)
	return requestHeader + n + copy(b[requestHeader+n:], val)
}

// reply: status u8, reserved 3 bytes, value length u32, id u64, then the
// value (fallback GET).
type reply []byte

const replyHeader = 16

func (r reply) status() uint8 { return r[0] }
func (r reply) valLen() int   { return int(binary.LittleEndian.Uint32(r[4:])) }
func (r reply) id() uint64    { return binary.LittleEndian.Uint64(r[8:]) }
func (r reply) valid() bool   { return len(r) >= replyHeader && replyHeader+r.valLen() == len(r) }
func (r reply) val() []byte   { return r[replyHeader:] }

func putReply(b []byte, status uint8, id uint64, val []byte) int {
	clear(b[:replyHeader])
	b[0] = status
	binary.LittleEndian.PutUint32(b[4:], uint32(len(val)))
	binary.LittleEndian.PutUint64(b[8:], id)
	return replyHeader + copy(b[replyHeader:], val)
}

// info is the server's description of its index, sent as the private
// data of its acceptance, with the server's half of the connection's
// proof (see Keyring). It carries no key: the keys GETs read with come
// in the grant, once the connection stands (see opGrant).
//
//	0 magic u32   4 version u16   6 slots per bucket u16   8 buckets u32
//	12 max message u32   16 index address u64   24 reserved u32
//	28 server QP number u32   32 server nonce [16]
type info []byte

const (
	infoLen     = 48
	infoMagic   = 0x6b76676f // "ogvk"
	infoVersion = 3
)

type indexInfo struct {
	slotsPerBucket int
	buckets        int
	maxMsg         int
	addr           uint64
}

// encode lays out the acceptance of the connection to the server's QP
// qpn, with the server's nonce.
func (i indexInfo) encode(qpn uint32, nonce []byte) info {
	b := make(info, infoLen)
	binary.LittleEndian.PutUint32(b[0:], infoMagic)
	binary.LittleEndian.PutUint16(b[4:], infoVersion)
	binary.LittleEndian.PutUint16(b[6:], uint16(i.slotsPerBucket))
	binary.LittleEndian.PutUint32(b[8:], uint32(i.buckets))
	binary.LittleEndian.PutUint32(b[12:], uint32(i.maxMsg))
	binary.LittleEndian.PutUint64(b[16:], i.addr)
	binary.LittleEndian.PutUint32(b[28:], qpn)
	copy(b[32:infoLen], nonce)
	return b
}

var errInfo = errors.New("kv: the server's connection data is not a goverbs kv index description")

// decodeInfo reads the server's acceptance; it also returns the
// acceptance in its canonical length, which the connection's proof
// covers.
func decodeInfo(b []byte) (indexInfo, info, error) {
	if len(b) < 6 || binary.LittleEndian.Uint32(b[0:]) != infoMagic {
		return indexInfo{}, nil, errInfo
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != infoVersion {
		return indexInfo{}, nil, fmt.Errorf("%w: the server speaks version %d of the kv handshake, this client version %d: run the same goverbs release on both", errInfo, v, infoVersion)
	}
	if len(b) < infoLen {
		return indexInfo{}, nil, errInfo
	}
	i := indexInfo{
		slotsPerBucket: int(binary.LittleEndian.Uint16(b[6:])),
		buckets:        int(binary.LittleEndian.Uint32(b[8:])),
		maxMsg:         int(binary.LittleEndian.Uint32(b[12:])),
		addr:           binary.LittleEndian.Uint64(b[16:]),
	}
	if i.slotsPerBucket < 1 || i.slotsPerBucket > 64 || i.buckets < 1 || i.maxMsg < requestHeader+MaxKey {
		return indexInfo{}, nil, errInfo
	}
	if v := i.maxMsg - requestHeader - MaxKey; v > MaxValueLimit {
		return indexInfo{}, nil, fmt.Errorf("%w: it takes values of up to %d bytes, more than MaxValueLimit (%d): serve them with a smaller MaxValue", errInfo, v, MaxValueLimit)
	}
	return i, append(info(nil), b[:infoLen]...), nil
}

// hello is the client's connection request private data: the identity
// it may prove, and its half of the connection's proof (see Keyring).
//
//	0 magic u32   4 version u16   6 identity length u8   7 reserved u8
//	8 client QP number u32   12 client nonce [16]   28 identity
type hello []byte

const (
	helloHeader  = 28
	maxHelloLen  = 56         // the private data every provider carries
	helloMagic   = 0x636b766f // "ovkc"
	helloVersion = 3
)

// encodeHello lays out the connection request of a client whose QP is
// qpn, naming identity id (at most MaxIdentity bytes), with a fresh
// nonce.
func encodeHello(qpn uint32, id []byte) hello {
	b := make(hello, helloHeader+len(id))
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	binary.LittleEndian.PutUint16(b[4:], helloVersion)
	b[6] = uint8(len(id))
	binary.LittleEndian.PutUint32(b[8:], qpn)
	hmacauth.NewNonce(b[12:helloHeader])
	copy(b[helloHeader:], id)
	return b
}

// canonical returns the connection request as a kv client of this
// version laid it out, which the connection's proof covers, or nil for
// one that is not: a client of another version, or not a kv client,
// which may read but proves nothing.
func (h hello) canonical() hello {
	if len(h) < helloHeader || binary.LittleEndian.Uint32(h[0:]) != helloMagic || binary.LittleEndian.Uint16(h[4:]) != helloVersion {
		return nil
	}
	n := int(h[6])
	if n > MaxIdentity || helloHeader+n > len(h) {
		return nil
	}
	return append(hello(nil), h[:helloHeader+n]...)
}

// identity returns the identity a canonical request names.
func (h hello) identity() []byte { return h[helloHeader:] }

// grant is the value of the reply to opGrant: the keys a client's GETs
// read the index and the value heap with.
//
//	0 flags u32 (grantWindows)   4 index key u32
//	8 one key u32 per heap region, in region order (a slot names the
//	  region of its record by number)
type grant []byte

const (
	grantHeader = 8
	// grantWindows says the keys are windows bound to the connection's
	// QP, revoked when it ends; clear, they are the regions' own keys
	// (a device without memory windows).
	grantWindows = 1
	// maxHeapRegions bounds the heap regions a grant names: the size
	// classes from 64 bytes to the largest record of MaxValueLimit.
	maxHeapRegions = 16
)

// putGrant lays out a grant in b and returns its length.
func putGrant(b []byte, windows bool, index uint32, heap []uint32) int {
	var flags uint32
	if windows {
		flags = grantWindows
	}
	binary.LittleEndian.PutUint32(b[0:], flags)
	binary.LittleEndian.PutUint32(b[4:], index)
	for i, k := range heap {
		binary.LittleEndian.PutUint32(b[grantHeader+4*i:], k)
	}
	return grantHeader + 4*len(heap)
}

var errGrant = errors.New("kv: the server's grant of keys is malformed: it is not a goverbs kv server of this release")

// valid checks a grant received.
func (g grant) valid() bool {
	n := len(g) - grantHeader
	return n >= 4 && n%4 == 0 && n/4 <= maxHeapRegions
}
func (g grant) windows() bool    { return binary.LittleEndian.Uint32(g[0:])&grantWindows != 0 }
func (g grant) indexKey() uint32 { return binary.LittleEndian.Uint32(g[4:]) }
func (g grant) heapRegions() int { return (len(g) - grantHeader) / 4 }
func (g grant) heapKey(i int) uint32 {
	return binary.LittleEndian.Uint32(g[grantHeader+4*i:])
}
