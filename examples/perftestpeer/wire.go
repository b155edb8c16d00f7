package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/goverbs/goverbs/verbs"
)

// The control messages perftest exchanges, in the layout of its C
// structures on a 64-bit host, integers big-endian.
const (
	// destLen is the size of struct pingpong_dest: lid, out_reads, qpn,
	// psn and rkey (4 bytes each), 4 bytes of padding, vaddr (8), gid
	// (16), srqn and gid_index (4 each).
	destLen = 56
	// versionLen is the size of perftest's version field: its text,
	// ended by NUL.
	versionLen = 16
	// mtuLen is the size of the MTU message: the enum ibv_mtu of the
	// sender's path MTU as decimal text, ended by NUL.
	mtuLen = 2
)

// protocolVersion is the version this side says it is: the perftest
// whose exchange it speaks.
const protocolVersion = "6.06"

// The perftest versions whose exchange this program speaks: 6.06
// (Debian's 4.5-0.17) to 6.10 (4.5-0.20). perftest refuses peers older
// than 5.70, and later versions than 6.10 make more handshakes.
const (
	minVersion = 6.06
	maxVersion = 6.10
)

// dest is perftest's struct pingpong_dest. Over rdma_cm only rkey and
// vaddr matter (the area the peer writes into or reads from); the rest is
// printed by perftest and checked by no one.
type dest struct {
	lid, outReads, qpn, psn, rkey uint32
	vaddr                         uint64
	gid                           [16]byte
	srqn                          uint32
	gidIndex                      int32
}

func (d dest) encode() []byte {
	b := make([]byte, destLen)
	binary.BigEndian.PutUint32(b[0:], d.lid)
	binary.BigEndian.PutUint32(b[4:], d.outReads)
	binary.BigEndian.PutUint32(b[8:], d.qpn)
	binary.BigEndian.PutUint32(b[12:], d.psn)
	binary.BigEndian.PutUint32(b[16:], d.rkey)
	binary.BigEndian.PutUint64(b[24:], d.vaddr)
	copy(b[32:48], d.gid[:])
	binary.BigEndian.PutUint32(b[48:], d.srqn)
	binary.BigEndian.PutUint32(b[52:], uint32(d.gidIndex))
	return b
}

// decodeDest decodes the fields perftest reads of a struct pingpong_dest
// (it ignores srqn and gid_index, and so does this). len(b) is destLen.
func decodeDest(b []byte) dest {
	var d dest
	d.lid = binary.BigEndian.Uint32(b[0:])
	d.outReads = binary.BigEndian.Uint32(b[4:])
	d.qpn = binary.BigEndian.Uint32(b[8:])
	d.psn = binary.BigEndian.Uint32(b[12:])
	d.rkey = binary.BigEndian.Uint32(b[16:])
	d.vaddr = binary.BigEndian.Uint64(b[24:])
	copy(d.gid[:], b[32:48])
	return d
}

// same says whether d and e agree in what perftest reads.
func (d dest) same(e dest) bool {
	return d.lid == e.lid && d.outReads == e.outReads && d.qpn == e.qpn && d.psn == e.psn &&
		d.rkey == e.rkey && d.vaddr == e.vaddr && d.gid == e.gid
}

func (d dest) String() string {
	return fmt.Sprintf("{QPN %#x PSN %#x rkey %#x vaddr %#x}", d.qpn, d.psn, d.rkey, d.vaddr)
}

func encodeVersion(v string) []byte {
	b := make([]byte, versionLen)
	copy(b, v)
	return b
}

// checkVersion returns the peer's version, if it is one whose exchange
// this program speaks.
func checkVersion(b []byte) (string, error) {
	n := bytes.IndexByte(b, 0)
	if n < 0 {
		return "", fmt.Errorf("the peer's version %q is not ended by NUL", b)
	}
	v := string(b[:n])
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return "", fmt.Errorf("the peer's version %q is not a number", v)
	}
	if !(f >= minVersion && f <= maxVersion) { // NaN too
		return "", fmt.Errorf("the peer is perftest %s: this program speaks the exchange of perftest %.2f to %.2f", v, minVersion, maxVersion)
	}
	return v, nil
}

// encodeMTU is the MTU message for qp's path MTU, or "0" when the QP
// does not know it (tcp0): perftest then keeps its own.
func encodeMTU(qp *verbs.QP) []byte {
	m := 0
	if a, err := qp.Query(); err == nil && a.PathMTU.Bytes() != 0 {
		m = int(a.PathMTU)
	}
	b := make([]byte, mtuLen)
	copy(b, strconv.Itoa(m))
	return b
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
