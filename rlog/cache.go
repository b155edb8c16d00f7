package rlog

import (
	"fmt"
	"sync"

	"github.com/goverbs/goverbs/verbs"
)

// cache holds the most recent records, framed, in registered memory that
// senders push from: CacheBuffers chunks of BufferSize bytes, filled in
// turn. A batch never spans chunks, so a chunk is at most one receiver
// buffer. A chunk is reused only when no batch in flight reads it
// (pins); a sender that needs records no longer cached reads them from
// the log.
type cache struct {
	mr     *verbs.MR
	size   int
	chunks []chunk
	cur    int
	mu     *sync.Mutex // the primary's: guards the chunk headers
	// onUnpin is called (with mu held) when a chunk's last pin goes.
	onUnpin func()
}

// chunk is one buffer of the cache. The appender frames records beyond
// what is visible (pend) and makes them visible once they are in the log.
type chunk struct {
	gen   uint64 // bumped when the chunk is reused
	first uint64 // seq of its first record
	count int    // records visible to senders
	fill  int    // bytes visible to senders
	pend  int    // bytes framed but not yet written to the log (appender only)
	npend int
	pins  int
}

// cacheCursor remembers where a sender's next record lies in the cache,
// so that a batch does not walk the chunk from its start.
type cacheCursor struct {
	ok    bool
	chunk int
	gen   uint64
	seq   uint64
	off   int
}

// newCache registers a cache of n chunks of size bytes; mu guards it.
func newCache(pd *verbs.PD, n, size int, mu *sync.Mutex) (*cache, error) {
	mr, err := pd.AllocMR(n*size, verbs.AccessLocalWrite)
	if err != nil {
		return nil, fmt.Errorf("rlog: register the record cache (%d bytes): %w", n*size, err)
	}
	return &cache{mr: mr, size: size, chunks: make([]chunk, n), mu: mu}, nil
}

// close releases the cache's memory.
func (c *cache) close() { c.mr.Dereg() }

// mem is chunk i's memory.
func (c *cache) mem(i int) []byte { return c.mr.Bytes()[i*c.size : (i+1)*c.size] }

// fits reports whether the records of an APPEND can be framed now: placed
// as add places them, every chunk they would move on to is unpinned. If
// so, it takes those chunks out of the cache at once, under the lock, so
// that no sender pins one between this check and add overwriting it.
func (c *cache) fits(m msg, maxRecord int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, fill, used, ok := c.cur, c.chunks[c.cur].fill+c.chunks[c.cur].pend, 1, true
	m.appendRecords(maxRecord, func(rec []byte) {
		n := frameLen(len(rec))
		if fill+n > c.size {
			i, fill, used = (i+1)%len(c.chunks), 0, used+1
			if used > len(c.chunks) || c.chunks[i].pins > 0 {
				ok = false
			}
		}
		fill += n
	})
	if !ok {
		return false
	}
	for k := 1; k < used; k++ {
		ch := &c.chunks[(c.cur+k)%len(c.chunks)]
		*ch = chunk{gen: ch.gen + 1}
	}
	return true
}

// add frames a record, moving on to the next chunk (after flush writes
// the current one) when it does not fit; fits has been checked.
func (c *cache) add(seq, epoch uint64, rec []byte, flush func() error) error {
	n := frameLen(len(rec))
	cur := &c.chunks[c.cur]
	if cur.fill+cur.pend+n > c.size {
		if err := flush(); err != nil {
			return err
		}
		c.mu.Lock()
		c.cur = (c.cur + 1) % len(c.chunks)
		cur = &c.chunks[c.cur]
		if cur.pins > 0 {
			c.mu.Unlock()
			return fmt.Errorf("rlog: internal error: cache chunk %d reused while pinned", c.cur)
		}
		*cur = chunk{gen: cur.gen + 1, first: seq}
		c.mu.Unlock()
	}
	if cur.count == 0 && cur.pend == 0 {
		c.mu.Lock()
		cur.first = seq
		c.mu.Unlock()
	}
	putFrame(c.mem(c.cur)[cur.fill+cur.pend:], seq, epoch, rec)
	cur.pend += n
	cur.npend++
	return nil
}

// pendingBytes returns the frames not yet written and the last seq among
// them.
func (c *cache) pendingBytes() ([]byte, uint64) {
	cur := &c.chunks[c.cur]
	if cur.pend == 0 {
		return nil, 0
	}
	return c.mem(c.cur)[cur.fill : cur.fill+cur.pend], cur.first + uint64(cur.count+cur.npend) - 1
}

// publish makes the pending frames visible to senders.
func (c *cache) publish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur := &c.chunks[c.cur]
	cur.fill += cur.pend
	cur.count += cur.npend
	cur.pend, cur.npend = 0, 0
}

// batch finds records from seq on in the cache and pins their chunk. It
// returns the frames (at most max bytes, and maxCount records if
// positive) as an SGE of the cache, their length and count, and the pin;
// n is 0 if seq is not cached.
func (c *cache) batch(cur *cacheCursor, seq uint64, max, maxCount int) (verbs.SGE, int, int, int, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := -1
	for i := range c.chunks {
		ch := &c.chunks[i]
		if ch.count > 0 && ch.first <= seq && seq < ch.first+uint64(ch.count) {
			idx = i
			break
		}
	}
	if idx < 0 {
		return verbs.SGE{}, 0, 0, -1, 0
	}
	ch := &c.chunks[idx]
	mem := c.mem(idx)
	off := 0
	if cur.ok && cur.chunk == idx && cur.gen == ch.gen && cur.seq == seq {
		off = cur.off
	} else {
		for s := ch.first; s < seq; s++ {
			off += frame(mem[off:]).size()
		}
	}
	end, count := off, 0
	for end < ch.fill && (maxCount <= 0 || count < maxCount) {
		size := frame(mem[end:]).size()
		if end+size-off > max {
			break
		}
		end += size
		count++
	}
	*cur = cacheCursor{ok: true, chunk: idx, gen: ch.gen, seq: seq + uint64(count), off: end}
	ch.pins++
	return c.mr.SGE(idx*c.size+off, end-off), end - off, count, idx, ch.gen
}

// unpin releases a batch's pin.
func (c *cache) unpin(i int, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chunks[i].gen == gen && c.chunks[i].pins > 0 {
		c.chunks[i].pins--
		if c.chunks[i].pins == 0 && c.onUnpin != nil {
			c.onUnpin()
		}
	}
}

// bytes returns the cache memory an SGE of it names.
func (c *cache) bytes(sge verbs.SGE) []byte {
	off := int(sge.Addr - c.mr.Addr())
	return c.mr.Bytes()[off : off+int(sge.Length)]
}
