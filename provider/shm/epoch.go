package shm

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// Grant epochs: one word per connection that the owner of a grant table
// moves on after every write of the table (a key granted, rewritten or
// revoked, or every slot's version moved because the QP's header
// changed: keyTable.touch). The peer's requester keeps the word's value
// with each fastPath and compares it before each WR, so that it reads
// one word of the peer's memory per WR, not the key's slot.
//
// The words of the connections to one peer process lie together, in
// pages of their own that the owner hands that peer alone, read-only
// (the owner writes them, the peer reads): its connections share one
// mapping, and a requester going round a thousand of them touches a few
// pages, not a grant table's page for each. A peer sees no other peer's
// words, and can write none.

// epochPageSize is the size of a page of epoch words.
const epochPageSize = 4096

// epochWords is the number of words in a page.
const epochWords = epochPageSize / 8

// epochPages are the pages of epoch words of a context, by the PID of
// the peer process they are handed to.
type epochPages struct {
	mu    sync.Mutex
	byPID map[int][]*epochPage
	anon  int // the keys given to peers of no PID, each its own (alloc)
}

// epochPage is one page of epoch words, handed to one peer process.
type epochPage struct {
	seg  *segment
	pid  int
	used [epochWords]bool
	n    int
}

// epochSlot is one connection's word. It lives while it is referenced:
// by its connection until it ends, and by the grant table that moves it
// on (qp.grantTo). Its last release frees the word, and the page with
// its last word.
type epochSlot struct {
	pages *epochPages
	page  *epochPage
	idx   int
	refs  int // guarded by pages.mu
}

// alloc returns a word in a page handed to the process pid, with one
// reference. A peer whose PID this process cannot see (0: in another PID
// namespace) shares its page with no other.
func (e *epochPages) alloc(pid int) (*epochSlot, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if pid <= 0 {
		e.anon--
		pid = e.anon
	}
	for _, p := range e.byPID[pid] {
		if p.n < epochWords {
			for i := range p.used {
				if !p.used[i] {
					p.used[i] = true
					p.n++
					return &epochSlot{pages: e, page: p, idx: i, refs: 1}, nil
				}
			}
		}
	}
	seg, err := newSegment("epochs", epochPageSize)
	if err != nil {
		return nil, err
	}
	p := &epochPage{seg: seg, pid: pid, n: 1}
	p.used[0] = true
	if e.byPID == nil {
		e.byPID = map[int][]*epochPage{}
	}
	e.byPID[pid] = append(e.byPID[pid], p)
	return &epochSlot{pages: e, page: p, idx: 0, refs: 1}, nil
}

// word is the slot's word in this process's mapping.
func (s *epochSlot) word() *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&s.page.seg.mem[s.idx*8]))
}

// hold adds a reference.
func (s *epochSlot) hold() {
	s.pages.mu.Lock()
	s.refs++
	s.pages.mu.Unlock()
}

// release drops a reference; the last frees the word, and its page with
// the page's last word.
func (s *epochSlot) release() {
	e := s.pages
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.refs--; s.refs > 0 {
		return
	}
	p := s.page
	p.used[s.idx] = false
	if p.n--; p.n > 0 {
		return
	}
	pages := e.byPID[p.pid]
	for i, q := range pages {
		if q == p {
			pages = append(pages[:i], pages[i+1:]...)
			break
		}
	}
	if len(pages) == 0 {
		delete(e.byPID, p.pid)
	} else {
		e.byPID[p.pid] = pages
	}
	p.seg.close()
}
