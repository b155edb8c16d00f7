package shm

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Grant epochs: one word per connection that the owner of a grant table
// moves on after every write of the table (a key granted, rewritten or
// revoked) and of its QP's header (keyTable.touch). The peer's requester
// keeps the word's value with each fastPath and compares it before each
// WR, so that it reads one word of the peer's memory per WR, neither the
// key's slot nor the QP's header.
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

// epochPages are the pages of epoch words of a context, by the peer
// process they are handed to.
type epochPages struct {
	mu     sync.Mutex
	byPeer map[peerProcess][]*epochPage
	anon   int // the keys given to peers of no PID, each its own (alloc)
}

// peerProcess names a process: its PID and the time it started, so that
// a process that is given a PID once another's, whose words may live on
// in grant tables, is not handed that one's page.
type peerProcess struct {
	pid   int
	start uint64
}

// epochPage is one page of epoch words, handed to one peer process.
type epochPage struct {
	seg  *segment
	peer peerProcess
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
// namespace), or whose start it cannot read, shares its page with no
// other.
func (e *epochPages) alloc(pid int) (*epochSlot, error) {
	peer := peerProcess{pid: pid}
	start, err := processStart(pid)
	if pid <= 0 || err != nil {
		peer.pid = 0
	}
	peer.start = start
	e.mu.Lock()
	defer e.mu.Unlock()
	if peer.pid == 0 {
		e.anon--
		peer = peerProcess{pid: e.anon}
	}
	for _, p := range e.byPeer[peer] {
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
	p := &epochPage{seg: seg, peer: peer, n: 1}
	p.used[0] = true
	if e.byPeer == nil {
		e.byPeer = map[peerProcess][]*epochPage{}
	}
	e.byPeer[peer] = append(e.byPeer[peer], p)
	return &epochSlot{pages: e, page: p, idx: 0, refs: 1}, nil
}

// word is the slot's word in this process's mapping.
func (s *epochSlot) word() *atomic.Uint64 { return epochWord(s.page.seg.mem, s.idx) }

// epochWord is word idx of a page of epoch words mapped at mem (idx <
// epochWords, mem at least epochPageSize bytes).
func epochWord(mem []byte, idx int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&mem[idx*8]))
}

// hold adds a reference to a slot still referenced, and reports
// whether it did: false once the last reference is gone.
func (s *epochSlot) hold() bool {
	s.pages.mu.Lock()
	defer s.pages.mu.Unlock()
	if s.refs == 0 {
		return false
	}
	s.refs++
	return true
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
	pages := e.byPeer[p.peer]
	for i, q := range pages {
		if q == p {
			pages = append(pages[:i], pages[i+1:]...)
			break
		}
	}
	if len(pages) == 0 {
		delete(e.byPeer, p.peer)
	} else {
		e.byPeer[p.peer] = pages
	}
	p.seg.close()
}

// processStart returns when the process pid started, in clock ticks
// since boot (/proc/pid/stat's starttime).
func processStart(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("no process %d", pid)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The fields after the command, which is in parentheses and may
	// hold any byte: starttime is the 20th of them.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields after the command", pid, len(f))
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}
