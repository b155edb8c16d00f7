package iwarp

import (
	"hash/crc32"
	"net"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
)

// The transmit batch: the frames of one writev, their headers and
// trailers in an arena, their payloads inline or in place, and their
// CRCs.

// Limits of one transmit batch (one writev).
const (
	batchBytes  = 2 << 20
	batchFrames = 128
	batchIovs   = 1024
	arenaLen    = batchFrames*(wire.MaxHeaderLen+3+wire.CRCLen) + inlineArena
)

// A payload of up to inlineMax bytes is copied into the arena behind its
// headers, as long as inlineArena has room, rather than sent from its
// buffer by an iovec of its own: a small frame is then one contiguous
// run of the arena, and a batch of small frames one buffer, which the
// kernel takes with write(2) at less cost than the iovecs of a writev
// (the copy of the payload, which the kernel makes anyway, costs less
// than the iovec). This is what verbs calls inline data, done for every
// small payload; larger ones go from the registered memory.
const (
	inlineMax   = 256
	inlineArena = 16 << 10
)

// txBatch is one writev: the headers and trailers in an arena, the
// registered memory in place, and where each frame's CRC goes.
type txBatch struct {
	arena   [arenaLen]byte
	na      int
	iov     [batchIovs][]byte
	niov    int
	bufs    net.Buffers // what is left to write
	wiov    [batchIovs]unix.Iovec
	frames  [batchFrames]frameRef
	nframes int
	bytes   int
	full    bool // a frame did not fit: go round again
	hstart  int  // arena offset of the frame being built
	// The last arena iovec (-1: none), where it starts and ends.
	arenaIov, arenaStart, arenaEnd int
	// snap[:nsnap]: copies of memory sent under CRC (snapshot).
	snap  []byte
	nsnap int
	// src is the source of the Read Response being built
	// (addResponses), and snapSrc its snapshot's under CRC: lists of the
	// batch's rather than new ones per response, whose every segment
	// would be zeroed first.
	src, snapSrc sglist.List
}

// Transmit batches are lent to connections while they transmit: a
// connection holds one from the round that builds into it until all of
// it is written (or the transmitter stops), so that a batch's memory
// (about 72 KiB, and 2 MiB of snapshots once it has sent a Read
// Response under CRC) belongs to the transmitters at work rather than
// to every connection, and stays in the caches when many connections
// take turns. Returned batches wait for the next borrower; as many are
// kept as were ever lent at once, so that once warm the data path
// allocates none.
var batches struct {
	mu   sync.Mutex
	free []*txBatch
}

// borrowBatch lends an empty batch.
func borrowBatch() *txBatch {
	batches.mu.Lock()
	if n := len(batches.free); n > 0 {
		b := batches.free[n-1]
		batches.free[n-1] = nil
		batches.free = batches.free[:n-1]
		batches.mu.Unlock()
		return b
	}
	batches.mu.Unlock()
	b := new(txBatch)
	b.reset()
	return b
}

// returnBatch takes back a batch lent by borrowBatch, whatever is left in
// it dropped.
func returnBatch(b *txBatch) {
	b.reset()
	batches.mu.Lock()
	batches.free = append(batches.free, b)
	batches.mu.Unlock()
}

// frameRef locates a frame in the batch for its CRC: its headers in the
// arena, its payload's iovecs, and the arena offset of its pad and CRC.
type frameRef struct {
	hstart, hlen int
	p0, p1       int
	padOff, pad  int
}

// snapshot copies p into the batch's own memory (allocated the first
// time) and returns the copy: Read Responses under CRC send what their
// CRC was computed over. room keeps a batch's bytes within batchBytes.
func (b *txBatch) snapshot(p []byte) []byte {
	if b.snap == nil {
		b.snap = make([]byte, batchBytes)
	}
	s := b.snap[b.nsnap : b.nsnap+len(p)]
	if raceEnabled {
		copyUnwatched(s, p)
	} else {
		copy(s, p)
	}
	b.nsnap += len(p)
	return s
}

// copyUnwatched copies src into dst out of the race detector's sight: the
// memory an RDMA Read reads may be written meanwhile by its owner, which
// RDMA allows (the reader gets torn data), and the detector does not
// watch the writev that sends such memory without CRC either. (copy's
// runtime.slicecopy reports to the detector whoever calls it.)
//
//go:norace
func copyUnwatched(dst, src []byte) int {
	n := min(len(dst), len(src))
	i := 0
	for ; i+8 <= n; i += 8 {
		*(*uint64)(unsafe.Pointer(&dst[i])) = *(*uint64)(unsafe.Pointer(&src[i]))
	}
	for ; i < n; i++ {
		dst[i] = src[i]
	}
	return n
}

// consume drops the first n bytes written from b.bufs.
func (b *txBatch) consume(n int) {
	for n > 0 && len(b.bufs) > 0 {
		if n < len(b.bufs[0]) {
			b.bufs[0] = b.bufs[0][n:]
			return
		}
		n -= len(b.bufs[0])
		b.bufs[0] = nil
		b.bufs = b.bufs[1:]
	}
	for len(b.bufs) > 0 && len(b.bufs[0]) == 0 {
		b.bufs = b.bufs[1:]
	}
}

// reset empties b.
func (b *txBatch) reset() {
	clear(b.iov[:b.niov])
	b.bufs = nil
	b.na, b.niov, b.nframes, b.bytes, b.full, b.nsnap = 0, 0, 0, 0, false, 0
	b.arenaIov = -1
	b.src.One(nil) // the last sources stay unreachable from here
	b.snapSrc.One(nil)
}

// room reports whether a frame with hlen bytes of headers and n bytes of
// payload fits; if not, the batch is marked full.
func (b *txBatch) room(hlen, n int) bool {
	ok := b.nframes < batchFrames && b.na+hlen+3+wire.CRCLen <= arenaLen &&
		b.niov+maxSGE+2 <= batchIovs && (b.bytes == 0 || b.bytes+hlen+n <= batchBytes)
	if !ok {
		b.full = true
	}
	return ok
}

// header reserves hlen bytes of the arena for the headers of the next
// frame and returns them.
func (b *txBatch) header(hlen int) []byte {
	b.hstart = b.na
	b.na += hlen
	return b.arena[b.hstart:b.na]
}

// addArena adds arena[start:end] to the iovecs, extending the last one
// when it ends where this begins: the headers and trailers of frames
// without payload between them go out as one iovec, which the kernel
// takes faster than many small ones.
func (b *txBatch) addArena(start, end int) {
	if b.arenaIov == b.niov-1 && b.niov > 0 && b.arenaEnd == start {
		b.iov[b.niov-1] = b.arena[b.arenaStart:end]
	} else {
		b.iov[b.niov] = b.arena[start:end]
		b.arenaIov, b.arenaStart = b.niov, start
		b.niov++
	}
	b.arenaEnd = end
}

// endFrame completes the frame whose headers header returned: n bytes of
// payload from src at offset off (none if src is nil), then pad and
// CRC. The ULPDU length in the headers must already be right.
func (b *txBatch) endFrame(src *sglist.List, off uint64, n int) {
	f := &b.frames[b.nframes]
	b.nframes++
	pad := b.framePad()
	if src == nil {
		n = 0
	}
	inline := b.inlines(n)
	if inline {
		b.addPayload(src, off, n, true)
	}
	f.hstart, f.hlen = b.hstart, b.na-b.hstart
	b.addArena(b.hstart, b.na)
	f.p0 = b.niov
	if !inline {
		b.addPayload(src, off, n, false)
	}
	f.p1 = b.niov
	clear(b.arena[b.na : b.na+pad+wire.CRCLen])
	f.padOff, f.pad = b.na, pad
	b.addArena(b.na, b.na+pad+wire.CRCLen)
	b.na += pad + wire.CRCLen
	b.bytes += f.hlen + pad + wire.CRCLen
	if !inline {
		b.bytes += n
	}
}

// framePad is the pad of the frame whose headers header returned.
func (b *txBatch) framePad() int { return wire.Pad(wire.Hdr(b.arena[b.hstart:b.na]).ULPDULen()) }

// inlines reports whether endFrame copies n bytes of payload of the frame
// whose headers header returned into the arena (see inlineMax).
func (b *txBatch) inlines(n int) bool {
	return n <= inlineMax && b.na+n+b.framePad()+wire.CRCLen <= arenaLen
}

// addPayload adds n bytes of src from offset off to the frame being
// built: copied into the arena behind its headers (inline, see
// inlineMax), or as iovecs of the memory itself. The memory may be a
// region a peer's Read reads while its owner writes it, which RDMA
// allows: under the race detector the copy is out of its sight, as the
// writev that sends it otherwise is.
func (b *txBatch) addPayload(src *sglist.List, off uint64, n int, inline bool) {
	for i := 0; n > 0 && i < src.N(); i++ {
		s := src.Seg(i)
		if off >= uint64(len(s)) {
			off -= uint64(len(s))
			continue
		}
		s = s[off:min(uint64(len(s)), off+uint64(n))]
		off = 0
		n -= len(s)
		if !inline {
			b.iov[b.niov] = s
			b.niov++
		} else if raceEnabled {
			b.na += copyUnwatched(b.arena[b.na:], s)
		} else {
			b.na += copy(b.arena[b.na:], s)
		}
	}
}

// computeCRCs fills the CRC of every frame: CRC32c over the length
// field, the ULPDU and the pad.
func (b *txBatch) computeCRCs() {
	for i := range b.nframes {
		f := &b.frames[i]
		crc := crc32.Update(0, wire.Castagnoli, b.arena[f.hstart:f.hstart+f.hlen])
		for _, s := range b.iov[f.p0:f.p1] {
			crc = crc32.Update(crc, wire.Castagnoli, s)
		}
		crc = crc32.Update(crc, wire.Castagnoli, b.arena[f.padOff:f.padOff+f.pad])
		wire.PutCRC(b.arena[f.padOff+f.pad:], crc)
	}
}
