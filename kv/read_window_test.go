package kv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// windowsOf returns the windows the server holds for the raw client r
// (nil if it holds none), found by the QP number r's request named.
func windowsOf(s *Server, r *rawClient) []*verbs.MW {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sc := range s.conns {
		if sc.hello != nil && binary.LittleEndian.Uint32(sc.hello[8:]) == r.qp.Num() {
			return append([]*verbs.MW(nil), sc.windows...)
		}
	}
	return nil
}

// clients returns how many clients the server counts.
func clients(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clients
}

// waitClients waits until the server counts want clients — a client
// stops counting once it is dropped and all it held is released (its
// connection watcher runs on its own) — or fails after a hang guard.
func waitClients(t *testing.T, s *Server, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for clients(s) != want {
		if time.Now().After(deadline) {
			t.Fatalf("the server counts %d clients, want %d", clients(s), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// read makes one Read of n bytes at addr with key from the raw client's
// QP and returns its status.
func (r *rawClient) read(t *testing.T, addr uint64, key uint32, n int) verbs.WCStatus {
	t.Helper()
	return r.post(t, verbs.SendWR{Opcode: verbs.OpRDMARead, SGList: []verbs.SGE{r.mr.SGE(0, n)}, RemoteAddr: addr, RKey: key}).Status
}

// heapSlot reads the bucket of key with the raw client's own window and
// returns key's heap slot.
func (r *rawClient) heapSlot(t *testing.T, key []byte) slot {
	t.Helper()
	bsize := r.info.slotsPerBucket * SlotSize
	baddr := r.info.addr + (hashKey(key)%uint64(r.info.buckets))*uint64(bsize)
	if st := r.read(t, baddr, r.g.indexKey(), bsize); st != verbs.WCSuccess {
		t.Fatalf("a Read of the index through the client's own window: %v", st)
	}
	for i := 0; i < bsize; i += SlotSize {
		if x := slot(r.mr.Bytes()[i : i+SlotSize]); x.valid() && x.kind() == kindHeap && x.hash() == hashKey(key) {
			return append(slot(nil), x...)
		}
	}
	t.Fatalf("the index has no heap slot of %q", key)
	return nil
}

// TestGetsReadThroughTheirOwnWindows: each client is granted read-only
// windows of its own, bound to its connection: they read the index and
// the heap from that connection; from another client's connection they
// end in a remote access error, and they write nothing. The server
// deallocates a client's windows when it goes — whether it hangs up or
// its connection breaks on a refused access — and its old keys read
// nothing from then on, while the server goes on serving.
func TestGetsReadThroughTheirOwnWindows(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		cfg := small()
		cfg.Listen.Strikes = 1000 // the refused accesses below are the test's, not a guesser's
		s := startServer(t, a, cfg)
		honest := dial(t, a)
		if !s.Windows() || !honest.windowed {
			t.Fatalf("the server says it grants windows: %v; the client says it was granted windows: %v", s.Windows(), honest.windowed)
		}
		big := bytes.Repeat([]byte("W"), 1000)
		if err := honest.Put([]byte("big"), big); err != nil {
			t.Fatal(err)
		}
		if got, err := honest.Get([]byte("big")); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("GET through the client's windows: %d bytes, %v", len(got), err)
		}

		owner := rawDial(t, a)
		if !owner.g.windows() {
			t.Fatal("the grant does not say its keys are windows")
		}
		rec := owner.heapSlot(t, []byte("big"))
		heapKey := owner.g.heapKey(rec.region())
		if st := owner.read(t, rec.addr(), heapKey, rec.recLen()); st != verbs.WCSuccess {
			t.Fatalf("a Read of the record through the client's own window: %v", st)
		}
		if r := record(owner.mr.Bytes()[:rec.recLen()]); !r.valid(rec) || !bytes.Equal(r.val(), big) {
			t.Fatal("the record read through the window is not the value stored")
		}
		for _, k := range []uint32{owner.g.indexKey(), heapKey} {
			if k == s.index.RKey() {
				t.Fatalf("key %#x granted is the index region's own key", k)
			}
			for _, mr := range s.heapMRs {
				if k == mr.RKey() {
					t.Fatalf("key %#x granted is a heap region's own key", k)
				}
			}
		}

		// Another client's connection, with the owner's keys.
		steals := []struct {
			what string
			addr uint64
			key  uint32
			n    int
		}{
			{"the index", owner.info.addr, owner.g.indexKey(), SlotSize},
			{"a record", rec.addr(), heapKey, rec.recLen()},
		}
		for _, st := range steals {
			before := clients(s)
			thief := rawDial(t, a)
			thiefWindows := windowsOf(s, thief)
			if got := thief.read(t, st.addr, st.key, st.n); got != verbs.WCRemAccessErr {
				t.Errorf("a Read of %s with another client's window key: %v, want %v", st.what, got, verbs.WCRemAccessErr)
			}
			// Its connection broke on the refusal: the server drops it and
			// deallocates its windows.
			waitClients(t, s, before)
			for _, mw := range thiefWindows {
				if err := mw.Dealloc(); !errors.Is(err, verbs.ErrClosed) {
					t.Fatalf("a window of a client whose connection broke was not deallocated: Dealloc %v", err)
				}
			}
		}

		// The owner's own keys write nothing.
		// (Each from a connection of its own: a refusal breaks it.)
		writes := []struct {
			what   string
			op     verbs.Opcode
			record bool
		}{
			{"Write to the index", verbs.OpRDMAWrite, false},
			{"Write to a record", verbs.OpRDMAWrite, true},
			{"CompareAndSwap on the index", verbs.OpAtomicCmpAndSwp, false},
			{"FetchAndAdd on a record", verbs.OpAtomicFetchAndAdd, true},
		}
		for _, w := range writes {
			before := clients(s)
			writer := rawDial(t, a)
			wr := verbs.SendWR{Opcode: w.op, SGList: []verbs.SGE{writer.mr.SGE(0, 8)}, RemoteAddr: writer.info.addr, RKey: writer.g.indexKey(), CompareAdd: 1}
			if w.record {
				wr.RemoteAddr, wr.RKey = rec.addr(), writer.g.heapKey(rec.region())
			}
			if st := writer.attack(t, wr, writer.info.addr); st == verbs.WCSuccess {
				t.Errorf("%s through the client's own window: it succeeded", w.what)
			}
			waitClients(t, s, before) // the refusal broke its connection
		}
		if got, err := honest.Get([]byte("big")); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("after the writes, \"big\" is %d bytes, %v", len(got), err)
		}

		// The owner goes: its windows are deallocated, and its keys read
		// nothing from any connection.
		before := clients(s)
		ownerWindows := windowsOf(s, owner)
		if len(ownerWindows) != 1+len(s.heapMRs) {
			t.Fatalf("the server holds %d windows for the client, want %d", len(ownerWindows), 1+len(s.heapMRs))
		}
		owner.conn.Close()
		waitClients(t, s, before-1)
		for _, mw := range ownerWindows {
			if err := mw.Dealloc(); !errors.Is(err, verbs.ErrClosed) {
				t.Fatalf("a window of a client that hung up was not deallocated: Dealloc %v", err)
			}
		}
		later := rawDial(t, a)
		if got := later.read(t, rec.addr(), heapKey, rec.recLen()); got != verbs.WCRemAccessErr {
			t.Errorf("a Read with the key of a client that went: %v, want %v", got, verbs.WCRemAccessErr)
		}
		// The index region's own key is never handed out; registered
		// without remote read (regionAccess), it reaches nothing either.
		// The refused Read above broke later's connection: a new one reads.
		if regionAccess(true)&verbs.AccessRemoteRead == 0 {
			waitClients(t, s, before-1)
			fresh := rawDial(t, a)
			if got := fresh.read(t, fresh.info.addr, s.index.RKey(), SlotSize); got != verbs.WCRemAccessErr {
				t.Errorf("a Read with the index region's own key: %v, want %v", got, verbs.WCRemAccessErr)
			}
		}
		if err := honest.Put([]byte("after"), []byte("the attacks")); err != nil {
			t.Fatalf("a PUT after the attacks: %v", err)
		}
		if got, err := honest.Get([]byte("big")); err != nil || !bytes.Equal(got, big) {
			t.Fatalf("after the attacks, \"big\" is %d bytes, %v", len(got), err)
		}
	})
}

// TestGrantOnceAsFirstRequest: a grant asked for a second time, or
// after another request, is refused, and binds no window.
func TestGrantOnceAsFirstRequest(t *testing.T) {
	a := addrs()["loop"]()
	startServer(t, a, small())
	r := rawDial(t, a)
	if st := r.rpc(t, rawRequest(opGrant, 2, nil, nil)).status(); st != statusNoGrant {
		t.Errorf("a second grant: status %d, want %d", st, statusNoGrant)
	}
	late := rawDialWith(t, a, func(qpn uint32) []byte { return encodeHello(qpn, nil) })
	if st := late.rpc(t, rawRequest(opDel, 1, []byte("k"), nil)).status(); st != statusNotFound {
		t.Fatalf("a DELETE: status %d", st)
	}
	if st := late.rpc(t, rawRequest(opGrant, 2, nil, nil)).status(); st != statusNoGrant {
		t.Errorf("a grant after another request: status %d, want %d", st, statusNoGrant)
	}
}

// TestRegionKeysWithoutWindows: a server on a device without memory
// windows grants every client the regions' own keys, and says so; GETs
// read with them.
func TestRegionKeysWithoutWindows(t *testing.T) {
	a := addrs()["loop"]()
	cfg := small()
	cfg.noWindows = true
	s := startServer(t, a, cfg)
	c := dial(t, a)
	if s.Windows() || c.windowed {
		t.Fatalf("the server says it grants windows: %v; the client says it was granted windows: %v", s.Windows(), c.windowed)
	}
	if c.indexKey != s.index.RKey() {
		t.Fatalf("index key %#x, want the region's %#x", c.indexKey, s.index.RKey())
	}
	big := bytes.Repeat([]byte("R"), 1000)
	if err := c.Put([]byte("big"), big); err != nil {
		t.Fatal(err)
	}
	if got, err := c.Get([]byte("big")); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("GET: %d bytes, %v", len(got), err)
	}
	s.mu.Lock()
	for _, sc := range s.conns {
		if sc.windows != nil {
			t.Error("the server holds windows for a client")
		}
	}
	s.mu.Unlock()
}
