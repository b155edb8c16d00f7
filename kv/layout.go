// Package kv is a key-value store whose GET is one-sided: the client reads
// the server's hash table and value records with RDMA Reads, and the
// server's CPU does nothing for it. PUT and DELETE are RPCs over
// send/recv. It is section 4.4 of the seed document made real, on the
// pre-registered pool of section 4.2 (package mempool).
//
// # Layout
//
// The index is an array of buckets of SlotsPerBucket slots, 128 bytes
// each, in one registered region. A key hashes (FNV-1a, 64 bits) to one
// bucket. A slot holds the key's hash, a version, and either the key and
// value themselves (inline, when they fit in 80 bytes) or the address,
// length and region number of a record in the value heap, a pool of
// registered buffers (one region per size class). Each slot carries a CRC32-C over its contents, and each record
// its version, the key and a CRC32-C over them; so a GET that races a PUT
// sees a slot or record that fails its check (a torn read), and reads
// again. After a bounded number of torn reads it asks the server by RPC.
//
// Updates are out of place: a PUT writes the new record into free heap
// space, then rewrites the slot (new version, new CRC). A replaced record
// returns to the heap only after a grace period, so that readers still
// holding its address usually finish first; one that does not fails the
// version check and retries.
//
// A client remembers where it last found each key's record, and reads
// that record directly next time: one Read instead of two. A word of the
// record's header, outside its CRC, says whether the record is the key's
// current one: a new record is written not current, becomes current only
// once the slot points at it, and stops being current before the slot
// moves away from it (to the record of a PUT that replaces it, or to
// nothing for a DELETE). A record that reads back intact, for the key,
// with the version the client found it with, and current, was the key's
// value at the moment its current word was read (the Read copies forward,
// and the version ties the word and the bytes after it to one record) —
// so GETs of either kind linearize with the slot's switch, and space
// reused for another record of the key is never taken for current. The
// argument takes the loads of one Read to be performed in order, as x86
// performs them; where loads may pass each other (arm64) a mixed read is
// still caught by the CRC and the version in all but contrived timings.
//
// # What a client can reach
//
// A client reads through keys granted to its connection alone. On a
// device with memory windows (verbs.CapMemoryWindows: loop0, shm0, tcp0,
// and ibverbs devices that have them, such as rxe)
// the server binds, for each client, read-only type 2 windows over the
// index and over each heap region, to that client's QP, and hands their
// keys in the second half of the handshake (the client's first request:
// a type 2 window is bound by a work request, on a QP that is connected).
// The regions' own keys never leave the server; a slot names its
// record's region by number, and each client reads it with its own key
// for that region. A window's key used from any other connection ends in
// a remote access error; when the client goes — it hangs up, its
// connection breaks, or its QP fails on an access it was refused — the
// server deallocates its windows, and their keys reach nothing from then
// on. On a device without memory windows (siw, for one) the server
// hands every client the regions' own keys instead, and they stay good
// until the server closes.
//
// What a window does not limit is which keys a client reads: each
// client's windows cover the whole index and the whole heap, so every
// client, while it is connected, can read every key and every value,
// whether or not it ever asked for them. Store in a server only what all
// its clients may read, or serve different readers from different
// servers.
//
// A client can write nothing of the server's by RDMA: its windows (and,
// without windows, the regions) grant remote Read only, and a Write or
// atomic through them ends in a remote access error. Its requests land in receive buffers
// that are a region of its own, with no remote rights, holding no other
// client's requests; a Send larger than a receive buffer is an error.
// How far a peer can reach past the verbs (on shm0, the memory mapped
// into it) is its provider's trust boundary: see provider/shm.
//
// A server applies a PUT or DELETE only if its Config.Authorizer allows
// it (by default it allows all). A client proves an identity when it
// connects (DialConfig.Identity and Credential) by a challenge and
// response that keeps its secret off the network and binds the proof to
// the connection, and the server proves it holds the secret too (see
// Keyring); TokenAuthorizer admits the clients that prove they know a
// shared token. A refused request fails with ErrDenied. A request is
// applied for the connection it arrived on, and only if its id is above
// that connection's last one: a replayed request fails with ErrReplayed.
//
// A server takes 64 clients at once, and at most Config.MaxClientsPerPeer
// of one peer (a host on tcp0, a process on shm0); it answers at most two
// connection requests of one peer at a time, and a connection that stops
// halfway through its handshake is dropped after 1 s, so that one peer
// cannot lock the others out. A peer with many addresses, or many
// processes, counts as many peers.
package kv

import (
	"encoding/binary"
	"hash/crc32"
)

// Layout constants shared by server and client.
const (
	// SlotSize is the size of an index slot.
	SlotSize = 128
	// InlineCap is how many bytes of key plus value a slot holds inline.
	InlineCap = SlotSize - inlineOff
	// MaxKey is the longest key.
	MaxKey = 250
	// MaxValueLimit bounds a server's MaxValue: 1 MiB, memcached's
	// default item size. A server registers message buffers of its
	// largest message, RecvDepth receives and RecvDepth replies for each
	// of up to 64 clients (2 GiB at the limit with the default
	// RecvDepth), and each client holds three, so a client refuses a
	// server that says its values are larger.
	MaxValueLimit = 1 << 20
	// recordHeader is the size of a heap record's header.
	recordHeader = 24

	inlineOff = 48
)

// Slot kinds.
const (
	kindEmpty  = 0
	kindInline = 1
	kindHeap   = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// hashKey is 64-bit FNV-1a, written out so that it allocates nothing.
func hashKey(key []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, b := range key {
		h ^= uint64(b)
		h *= 1099511628211
	}
	return h
}

// slot is a view of one index slot:
//
//	0  version u64     8 key hash u64     16 kind u8, reserved u8
//	18 key length u16  20 value length u32  24 record region u32: the
//	   heap region holding the record, by number (each client reads it
//	   with its own key for that region, see grant)
//	28 CRC32-C u32 over the slot with this field zero, up to the end of
//	   the inline bytes in use
//	32 record address u64   40 record length u32   44 reserved u32
//	48 inline key, then value
type slot []byte

func (s slot) version() uint64 { return binary.LittleEndian.Uint64(s[0:]) }
func (s slot) hash() uint64    { return binary.LittleEndian.Uint64(s[8:]) }
func (s slot) kind() uint8     { return s[16] }
func (s slot) keyLen() int     { return int(binary.LittleEndian.Uint16(s[18:])) }
func (s slot) valLen() int     { return int(binary.LittleEndian.Uint32(s[20:])) }
func (s slot) region() int     { return int(binary.LittleEndian.Uint32(s[24:])) }
func (s slot) crc() uint32     { return binary.LittleEndian.Uint32(s[28:]) }
func (s slot) addr() uint64    { return binary.LittleEndian.Uint64(s[32:]) }
func (s slot) recLen() int     { return int(binary.LittleEndian.Uint32(s[40:])) }

// inlineLen is how many inline bytes the CRC covers.
func (s slot) inlineLen() int {
	if s.kind() != kindInline {
		return 0
	}
	return min(s.keyLen()+s.valLen(), InlineCap)
}

// sum computes the slot's CRC.
func (s slot) sum() uint32 {
	c := crc32.Update(0, castagnoli, s[0:28])
	c = crc32.Update(c, castagnoli, s[32:inlineOff+s.inlineLen()])
	return c
}

// valid reports whether the slot is self-consistent: a read of it was
// not torn.
func (s slot) valid() bool {
	switch s.kind() {
	case kindEmpty, kindHeap:
	case kindInline:
		if s.keyLen()+s.valLen() > InlineCap {
			return false
		}
	default:
		return false
	}
	return s.crc() == s.sum()
}

// inline returns the inline key and value.
func (s slot) inline() (key, val []byte) {
	k := s.keyLen()
	return s[inlineOff : inlineOff+k], s[inlineOff+k : inlineOff+k+s.valLen()]
}

// setInline fills the slot with an inline key and value (server side).
func (s slot) setInline(ver, hash uint64, key, val []byte) {
	s.setHeader(ver, hash, kindInline, len(key), len(val))
	copy(s[inlineOff:], key)
	copy(s[inlineOff+len(key):], val)
	s.seal()
}

// setHeap points the slot at a heap record (server side).
func (s slot) setHeap(ver, hash uint64, keyLen, valLen int, addr uint64, recLen int, region int) {
	s.setHeader(ver, hash, kindHeap, keyLen, valLen)
	binary.LittleEndian.PutUint32(s[24:], uint32(region))
	binary.LittleEndian.PutUint64(s[32:], addr)
	binary.LittleEndian.PutUint32(s[40:], uint32(recLen))
	s.seal()
}

// setEmpty empties the slot (server side); the version still moves on.
func (s slot) setEmpty(ver uint64) {
	s.setHeader(ver, 0, kindEmpty, 0, 0)
	s.seal()
}

func (s slot) setHeader(ver, hash uint64, kind uint8, keyLen, valLen int) {
	clear(s[:inlineOff])
	binary.LittleEndian.PutUint64(s[0:], ver)
	binary.LittleEndian.PutUint64(s[8:], hash)
	s[16] = kind
	binary.LittleEndian.PutUint16(s[18:], uint16(keyLen))
	binary.LittleEndian.PutUint32(s[20:], uint32(valLen))
}

func (s slot) seal() { binary.LittleEndian.PutUint32(s[28:], s.sum()) }

// record is a view of a heap record:
//
//	0 version u64   8 key length u16, reserved u16   12 value length u32
//	16 CRC32-C u32 over the record but this field and the next
//	20 superseded u32: 0 while the record is the key's current one (see
//	   the package doc)
//	24 key, then value
type record []byte

// recordSuperseded is the offset of a record's superseded word.
const recordSuperseded = 20

func recordLen(keyLen, valLen int) int { return recordHeader + keyLen + valLen }

func (r record) version() uint64 { return binary.LittleEndian.Uint64(r[0:]) }
func (r record) keyLen() int     { return int(binary.LittleEndian.Uint16(r[8:])) }
func (r record) valLen() int     { return int(binary.LittleEndian.Uint32(r[12:])) }

func (r record) sum() uint32 {
	c := crc32.Update(0, castagnoli, r[0:16])
	return crc32.Update(c, castagnoli, r[recordHeader:recordLen(r.keyLen(), r.valLen())])
}

// intact reports whether a record read is self-consistent: its lengths
// fit what was read and its CRC matches.
func (r record) intact() bool {
	return len(r) >= recordHeader && recordLen(r.keyLen(), r.valLen()) <= len(r) &&
		binary.LittleEndian.Uint32(r[16:]) == r.sum()
}

// superseded reports whether the server has replaced the record.
func (r record) superseded() bool { return binary.LittleEndian.Uint32(r[recordSuperseded:]) != 0 }

// valid checks a record read for the slot s: same version and lengths,
// and an intact CRC.
func (r record) valid(s slot) bool {
	return len(r) >= recordHeader && r.version() == s.version() && r.keyLen() == s.keyLen() && r.valLen() == s.valLen() &&
		r.intact()
}

func (r record) key() []byte { return r[recordHeader : recordHeader+r.keyLen()] }
func (r record) val() []byte {
	k := recordHeader + r.keyLen()
	return r[k : k+r.valLen()]
}

// set fills a record (server side), not yet current. The current word is
// written first and never passes through 0, for readers of reused space.
func (r record) set(ver uint64, key, val []byte) {
	binary.LittleEndian.PutUint32(r[recordSuperseded:], 1)
	clear(r[:recordSuperseded])
	clear(r[recordSuperseded+4 : recordHeader])
	binary.LittleEndian.PutUint64(r[0:], ver)
	binary.LittleEndian.PutUint16(r[8:], uint16(len(key)))
	binary.LittleEndian.PutUint32(r[12:], uint32(len(val)))
	copy(r[recordHeader:], key)
	copy(r[recordHeader+len(key):], val)
	binary.LittleEndian.PutUint32(r[16:], r.sum())
}
