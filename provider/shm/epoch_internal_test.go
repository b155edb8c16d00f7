package shm

import (
	"os"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestEpochWordsOfOnePeerShareAPage: the grant epoch words of the
// connections between two contexts lie in one page, a word each, which
// the requester maps once for all of them: going round the connections,
// a WR touches no page of the peer's of a connection's own.
func TestEpochWordsOfOnePeerShareAPage(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{QPs: 3})
	var owner *epochPage
	seen := map[int]bool{}
	var page unsafe.Pointer
	for i := range 3 {
		b := driverQP(p.B.(*verbstest.Local).QPs[i])
		b.grantMu.Lock()
		slot := b.grantEpoch
		b.grantMu.Unlock()
		if slot == nil {
			t.Fatalf("B's QP %d moves no epoch word", i)
		}
		if owner == nil {
			owner = slot.page
		} else if slot.page != owner {
			t.Errorf("B's QP %d: its epoch word lies in a page of its own, not its peer's", i)
		}
		if seen[slot.idx] {
			t.Errorf("B's QP %d: epoch word %d given twice", i, slot.idx)
		}
		seen[slot.idx] = true

		a := driverQP(p.A.QPs[i])
		a.mu.Lock()
		c := a.conn
		a.mu.Unlock()
		if got, want := uintptr(unsafe.Pointer(c.hot.epoch))-uintptr(unsafe.Pointer(&c.epochSeg.mem[0])), uintptr(slot.idx*8); got != want {
			t.Errorf("A's QP %d reads the word at offset %d of B's page, B moves the one at %d", i, got, want)
		}
		if !uniqueInode(devOf(t, c.epochSeg)) {
			continue // each connection maps it for itself
		}
		if page == nil {
			page = unsafe.Pointer(&c.epochSeg.mem[0])
		} else if unsafe.Pointer(&c.epochSeg.mem[0]) != page {
			t.Errorf("A's QP %d maps B's page of epoch words again, at %p, not at %p", i, &c.epochSeg.mem[0], page)
		}
	}
}

// devOf returns the device of a mapped segment's file, as mapPeerSegment
// saw it.
func devOf(t *testing.T, s *segment) uint64 {
	t.Helper()
	if s.shared == nil {
		return 0 // mapped alone: a device whose inode numbers may repeat
	}
	return s.shared.key.dev
}

// TestEpochPagesByPeer: a context hands each peer process pages of its
// own, a word per connection; a full page gets a second one; the last
// word released frees its page, and a word released is given again. A
// process is its PID and its start: one that got the PID of another
// does not share its page.
func TestEpochPagesByPeer(t *testing.T) {
	var e epochPages
	self, parent := os.Getpid(), os.Getppid()
	one, err := e.alloc(self)
	if err != nil {
		t.Fatal(err)
	}
	two, err := e.alloc(parent)
	if err != nil {
		t.Fatal(err)
	}
	if one.page == two.page {
		t.Fatal("two peer processes share a page of epoch words")
	}
	// Peers whose PID this process cannot see share with no one.
	anon1, err := e.alloc(0)
	if err != nil {
		t.Fatal(err)
	}
	anon2, err := e.alloc(0)
	if err != nil {
		t.Fatal(err)
	}
	if anon1.page == anon2.page {
		t.Fatal("two peers of no PID share a page of epoch words")
	}
	anon1.release()
	anon2.release()
	if one.page.peer.start == 0 {
		t.Fatal("no start time read for this process")
	}
	e.mu.Lock()
	reused := peerProcess{pid: self, start: one.page.peer.start + 1}
	e.byPeer[reused] = e.byPeer[peerProcess{pid: self, start: one.page.peer.start}]
	delete(e.byPeer, peerProcess{pid: self, start: one.page.peer.start})
	e.mu.Unlock()
	other, err := e.alloc(self) // this process, as if its PID had been another's before
	if err != nil {
		t.Fatal(err)
	}
	if other.page == one.page {
		t.Fatal("a process was handed the page of another that had its PID")
	}
	other.release()
	e.mu.Lock()
	e.byPeer[peerProcess{pid: self, start: one.page.peer.start}] = e.byPeer[reused]
	delete(e.byPeer, reused)
	e.mu.Unlock()
	slots := []*epochSlot{one}
	for range epochWords {
		s, err := e.alloc(self)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	mine := peerProcess{pid: self, start: one.page.peer.start}
	if n := len(e.byPeer[mine]); n != 2 {
		t.Fatalf("%d words for one peer in %d pages, want 2", len(slots), n)
	}
	last := slots[len(slots)-1]
	if last.page == one.page {
		t.Fatal("a page of epoch words holds more words than it has room for")
	}
	// A word held by its grant table as well outlives its connection's
	// release.
	if !last.hold() {
		t.Fatal("a word referenced could not be held")
	}
	last.release()
	if last.page.n != 1 || len(e.byPeer[mine]) != 2 {
		t.Fatal("a word still held was freed")
	}
	last.release()
	if len(e.byPeer[mine]) != 1 {
		t.Fatal("the page of a peer's last word released is still there")
	}
	if last.hold() {
		t.Fatal("a word released by its last holder was held again")
	}
	freed := slots[5]
	freed.release()
	again, err := e.alloc(self)
	if err != nil {
		t.Fatal(err)
	}
	if again.page != one.page || again.idx != freed.idx {
		t.Fatal("a word freed in a full page was not given again")
	}
	slots[5] = again
	for _, s := range append(slots[:len(slots)-1], two) {
		s.release()
	}
	if len(e.byPeer) != 0 {
		t.Fatalf("pages left after every word was released: %v", e.byPeer)
	}
}

// TestHandshakeRefusesEpochBeyondItsPage: a peer that names an epoch word
// beyond its page is refused; its page's last word is taken.
func TestHandshakeRefusesEpochBeyondItsPage(t *testing.T) {
	q := victimQP(t)
	kinds := []byte{fdMedium, fdMedium, fdKeys, fdSmall, fdEvent}
	if c, err := handshake(t, q, withEpochIndex(validHello(16, 4, 16, false, nil), epochWords), kinds); err == nil {
		c.close()
		t.Fatal("a handshake naming an epoch word beyond its page was taken")
	}
	c, err := handshake(t, q, withEpochIndex(validHello(16, 4, 16, false, nil), epochWords-1), kinds)
	if err != nil {
		t.Fatalf("a handshake naming its page's last epoch word: %v", err)
	}
	defer c.close()
	if got, want := uintptr(unsafe.Pointer(c.hot.epoch)), uintptr(unsafe.Pointer(&c.epochSeg.mem[epochPageSize-8])); got != want {
		t.Fatalf("the connection reads its epoch word at %#x, want %#x", got, want)
	}
	if c.pid != os.Getpid() {
		t.Fatal("the handshake took another process for the peer")
	}
}
