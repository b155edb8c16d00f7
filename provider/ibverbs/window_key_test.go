package ibverbs

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestWindowKeyDrawn: a type 2 bind's new key keeps the window's index,
// changes the low byte every time, and draws it from the whole byte.
func TestWindowKeyDrawn(t *testing.T) {
	var m mwQueue
	seen := map[byte]bool{}
	key := uint32(0x123456ab)
	for range 4000 {
		k := m.newKey(key)
		if k>>8 != key>>8 {
			t.Fatalf("new key %#x of %#x changed the index", k, key)
		}
		if byte(k) == byte(key) {
			t.Fatalf("new key %#x kept the low byte of %#x", k, key)
		}
		seen[byte(k)] = true
		key = k
	}
	// 4000 draws from 255 values leave one unseen with probability
	// about 255·(254/255)^4000, below 1e-4.
	if len(seen) < 255 {
		t.Fatalf("4000 draws gave %d distinct low bytes, want at least 255", len(seen))
	}
}

// windowFixture is a PD with one window whose struct ibv_mw is
// anonymous memory, and a QP of that PD with a send queue of 4, as far
// as the bind bookkeeping needs them.
func windowFixture(t *testing.T, typ driver.MWType, key uint32) (*qp, *mw, *uint32) {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	d := &pd{mws: map[*mw]struct{}{}, byRKey: map[uint32]*mw{}}
	w := &mw{pd: d, p: uintptr(unsafe.Pointer(&mem[0])), typ: typ}
	w.key.Store(key)
	cKey := (*uint32)(unsafe.Pointer(&mem[offMWRKey]))
	*cKey = key
	d.mws[w] = struct{}{}
	d.byRKey[key] = w
	q := &qp{pd: d, cap: driver.QPCap{MaxSendWR: 4}, sqMarks: make([]uint64, 4)}
	return q, w, cKey
}

// postBind does what PostSend does for a type 2 bind of w: stage it with
// a drawn key, count it, record it. It returns the staged key.
func postBind(q *qp, w *mw, signaled bool) uint32 {
	wr := []driver.SendWR{{Opcode: driver.OpBindMW}}
	if signaled {
		wr[0].Flags = driver.SendSignaled
	}
	var c ibvSendWR
	q.stageBind(0, &c, &wr[0], w, &mr{})
	first := q.sqPosted.Load()
	q.sentWRs(wr)
	q.bindPosted(wr, first)
	return c.bindMW.rkey
}

// TestWindowKeyChangesAtCompletion: the key a type 2 bind draws becomes
// the window's once the bind completes successfully, in the window and
// in the PD's index by key and struct ibv_mw; a failed or flushed bind
// leaves the key alone.
func TestWindowKeyChangesAtCompletion(t *testing.T) {
	q, w, cKey := windowFixture(t, driver.MWType2, 0x0700_0011)
	k := postBind(q, w, true)
	if w.RKey() != 0x0700_0011 {
		t.Fatalf("the key changed to %#x before the bind completed", w.RKey())
	}
	q.sendDone(true)
	if w.RKey() != k || *cKey != k || q.pd.byRKey[k] != w || q.pd.byRKey[0x0700_0011] != nil {
		t.Fatalf("after the bind completed: key %#x, struct ibv_mw's %#x, index %v; want %#x", w.RKey(), *cKey, q.pd.byRKey, k)
	}

	postBind(q, w, true)
	q.sendDone(false)
	if w.RKey() != k || *cKey != k || q.pd.byRKey[k] != w {
		t.Fatalf("a failed bind moved the key from %#x to %#x (struct ibv_mw %#x)", k, w.RKey(), *cKey)
	}
	if q.mwq.size != 0 {
		t.Fatalf("%d binds still pending", q.mwq.size)
	}
}

// TestWindowUnsignaledBindSettledByLaterCompletion: an unsignaled bind
// takes effect when a later signaled WR's successful completion retires
// it.
func TestWindowUnsignaledBindSettledByLaterCompletion(t *testing.T) {
	q, w, _ := windowFixture(t, driver.MWType2, 0x0900_0001)
	k := postBind(q, w, false)
	q.sentWRs([]driver.SendWR{{Opcode: driver.OpSend, Flags: driver.SendSignaled}})
	q.sendDone(true)
	if w.RKey() != k {
		t.Fatalf("key %#x after the later Send completed, want %#x", w.RKey(), k)
	}
}

// TestWindowBindRefusedAtPost: a bind the device refuses at post time
// is forgotten, and the next completion does not apply it.
func TestWindowBindRefusedAtPost(t *testing.T) {
	q, w, _ := windowFixture(t, driver.MWType2, 0x0a00_0001)
	wr := []driver.SendWR{{Opcode: driver.OpBindMW, Flags: driver.SendSignaled}}
	postBind(q, w, true)
	q.unsent(wr)
	if q.mwq.size != 0 {
		t.Fatalf("%d binds pending after the device refused the only one", q.mwq.size)
	}
	q.sentWRs([]driver.SendWR{{Opcode: driver.OpSend, Flags: driver.SendSignaled}})
	q.sendDone(true)
	if w.RKey() != 0x0a00_0001 {
		t.Fatalf("a refused bind gave the window the key %#x", w.RKey())
	}
}

// TestWindowType1RollsBackLibraryKey: for a type 1 window the device
// library moves struct ibv_mw's key at post time; a failed bind puts the
// window's key back there, a successful one adopts the library's.
func TestWindowType1RollsBackLibraryKey(t *testing.T) {
	q, w, cKey := windowFixture(t, driver.MWType1, 0x0b00_0005)
	bindType1Bookkeeping := func() {
		first := q.sqPosted.Load()
		q.sentWRs([]driver.SendWR{{Opcode: driver.OpBindMW, Flags: driver.SendSignaled}})
		q.sqMu.Lock()
		q.pushBind(pendingBind{seq: first + 1, w: w})
		q.sqMu.Unlock()
	}
	bindType1Bookkeeping()
	*cKey = 0x0b00_0006 // as ibv_bind_mw leaves it
	q.sendDone(false)
	if *cKey != 0x0b00_0005 || w.RKey() != 0x0b00_0005 {
		t.Fatalf("after a failed bind: struct ibv_mw %#x, window %#x; want both 0xb000005", *cKey, w.RKey())
	}
	bindType1Bookkeeping()
	*cKey = 0x0b00_0006
	q.sendDone(true)
	if w.RKey() != 0x0b00_0006 || q.pd.byRKey[0x0b00_0006] != w {
		t.Fatalf("after a completed bind the window's key is %#x, want 0xb000006", w.RKey())
	}
}

// TestRxeInvalidationFlag: on rxe, a successful receive completion with
// the kernel's IB_WC_WITH_INVALIDATE bit reports the invalidated key;
// other devices' bit 2 and rxe's failed or send completions are left
// alone.
func TestRxeInvalidationFlag(t *testing.T) {
	rxe, other := &devContext{kernelInvFlag: true}, &devContext{}
	c := &ibvWC{opcode: uint32(driver.WCRecv), wcFlags: 1 | kernelWCWithInv, immData: 0x1234}
	var w driver.WorkCompletion
	fromIBV(&w, c)
	rxe.invalidated(&w, c)
	if w.Flags&driver.WCWithInv == 0 || w.InvalidatedRKey != 0x1234 {
		t.Fatalf("rxe receive completion: %+v, want WCWithInv of 0x1234", w)
	}
	fromIBV(&w, c)
	other.invalidated(&w, c)
	if w.Flags&driver.WCWithInv != 0 {
		t.Fatalf("another device's checksum bit read as an invalidation: %+v", w)
	}
	c.status = uint32(driver.WCRemInvReqErr)
	fromIBV(&w, c)
	rxe.invalidated(&w, c)
	if w.Flags&driver.WCWithInv != 0 {
		t.Fatalf("a failed receive reported an invalidation: %+v", w)
	}
}

// TestDeregWithWindowBoundIsBusy: the EINVAL rxe answers a Dereg of a
// region with a window bound to it becomes ErrBusy, saying what to do.
func TestDeregWithWindowBoundIsBusy(t *testing.T) {
	err := windowBoundErr(syscall.EINVAL)
	if !errors.Is(err, driver.ErrBusy) || !strings.Contains(err.Error(), "invalidate or deallocate") {
		t.Fatalf("%v: want ErrBusy saying to invalidate or deallocate the windows", err)
	}
}
