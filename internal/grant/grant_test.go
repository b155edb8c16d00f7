package grant

import (
	"testing"

	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs/driver"
)

type testPD struct{ int }

// region is a provider's region: its own fields (which
// BenchmarkCheckRegionDirect checks directly) and its Extent.
type region struct {
	key    uint32
	addr   uint64
	len    uint64
	access driver.AccessFlags
	pd     *testPD
	valid  bool
	ext    Extent
}

func newRegion(addr, n uint64, access driver.AccessFlags, pd *testPD) *region {
	return &region{addr: addr, len: n, access: access, pd: pd, valid: true,
		ext: Extent{Addr: addr, Len: n, Access: access, PD: pd}}
}

func (r *region) Extent() *Extent { return &r.ext }

type fixture struct {
	tab     keytab.Table[Entry[*region]]
	pd, pd2 *testPD
	qp, qp2 *int
	mr      *region
}

func newFixture(t *testing.T, access driver.AccessFlags) *fixture {
	f := &fixture{pd: &testPD{1}, pd2: &testPD{2}, qp: new(int), qp2: new(int)}
	f.mr = newRegion(0x1000, 0x1000, access, f.pd)
	if _, err := f.tab.Insert(func(k uint32) Entry[*region] { f.mr.key = k; return RegionEntry(f.mr) }); err != nil {
		t.Fatal(err)
	}
	return f
}

const all = driver.AccessLocalWrite | driver.RemoteAccess | driver.AccessMWBind

func (f *fixture) bind(w *Window[*region], addr, n uint64, acc driver.AccessFlags, qp any) driver.WCStatus {
	wr := driver.SendWR{Opcode: driver.OpBindMW, Bind: driver.MWBind{RKey: w.RKey(), LKey: f.mr.key, Addr: addr, Length: n, Access: acc}}
	st, _, _ := ExecuteBind(&f.tab, &wr, qp, f.pd, nil)
	return st
}

// TestWindowGrantsOnlyItsBinding: a bound window grants its range and
// rights and nothing outside them, on its PD only; the region's own key
// keeps its own grant.
func TestWindowGrantsOnlyItsBinding(t *testing.T) {
	f := newFixture(t, all)
	w, err := AllocMW(&f.tab, driver.MWType1, f.pd)
	if err != nil {
		t.Fatal(err)
	}
	if _, fl := Check(&f.tab, w.RKey(), f.pd, f.qp, 0x1000, 8, driver.AccessRemoteRead); fl != BadKey {
		t.Fatalf("unbound window: %v, want BadKey", fl)
	}
	old := w.RKey()
	if st := f.bind(w, 0x1100, 0x100, driver.AccessRemoteRead, f.qp); st != driver.WCSuccess {
		t.Fatalf("bind: %v", st)
	}
	k := w.RKey()
	if k == old {
		t.Fatal("bind kept the window's key")
	}
	cases := []struct {
		key     uint32
		pd      any
		addr, n uint64
		need    driver.AccessFlags
		want    Fault
	}{
		{k, f.pd, 0x1100, 0x100, driver.AccessRemoteRead, OK},
		{k, f.pd, 0x1100, 0, driver.AccessRemoteRead, OK},
		{k, f.pd, 0x10ff, 1, driver.AccessRemoteRead, Bounds},
		{k, f.pd, 0x11ff, 2, driver.AccessRemoteRead, Bounds},
		{k, f.pd, ^uint64(0), 2, driver.AccessRemoteRead, Bounds},
		{k, f.pd, 0x1100, 8, driver.AccessRemoteWrite, Rights},
		{k, f.pd2, 0x1100, 8, driver.AccessRemoteRead, NotAssoc},
		{old, f.pd, 0x1100, 8, driver.AccessRemoteRead, BadKey},
		{f.mr.key, f.pd, 0x1000, 0x1000, driver.AccessRemoteWrite, OK},
	}
	for _, c := range cases {
		if _, fl := Check(&f.tab, c.key, c.pd, f.qp, c.addr, c.n, c.need); fl != c.want {
			t.Errorf("Check(%#x, %#x+%d, %v) = %v, want %v", c.key, c.addr, c.n, c.need, fl, c.want)
		}
	}
	// A type 1 rebind changes the key; zero length unbinds.
	if st := f.bind(w, 0x1000, 0x10, driver.AccessRemoteWrite, f.qp); st != driver.WCSuccess {
		t.Fatalf("rebind: %v", st)
	}
	if _, fl := Check(&f.tab, k, f.pd, f.qp, 0x1100, 8, driver.AccessRemoteRead); fl != BadKey {
		t.Fatalf("key of the previous binding: %v", fl)
	}
	k2 := w.RKey()
	if st := f.bind(w, 0, 0, 0, f.qp); st != driver.WCSuccess {
		t.Fatalf("unbind: %v", st)
	}
	if _, fl := Check(&f.tab, k2, f.pd, f.qp, 0x1000, 8, driver.AccessRemoteWrite); fl != BadKey {
		t.Fatalf("key after unbind: %v", fl)
	}
	// Deregistering the region ends the window's grant.
	f.bind(w, 0x1000, 0x10, driver.AccessRemoteWrite, f.qp)
	f.mr.ext.Revoke()
	if _, fl := Check(&f.tab, w.RKey(), f.pd, f.qp, 0x1000, 8, driver.AccessRemoteWrite); fl != BadKey {
		t.Fatalf("window over a deregistered region: %v", fl)
	}
}

// TestBindRefusals: each rule of a bind, broken alone, refuses it and
// leaves the window as it was.
func TestBindRefusals(t *testing.T) {
	f := newFixture(t, all)
	noBind := newFixture(t, driver.AccessLocalWrite|driver.RemoteAccess)
	readOnly := newFixture(t, driver.AccessRemoteRead|driver.AccessMWBind)
	cases := []struct {
		name   string
		f      *fixture
		typ    driver.MWType
		addr   uint64
		n      uint64
		access driver.AccessFlags
	}{
		{"region without AccessMWBind", noBind, driver.MWType1, 0x1000, 8, driver.AccessRemoteRead},
		{"remote write on a region without LocalWrite", readOnly, driver.MWType1, 0x1000, 8, driver.AccessRemoteWrite},
		{"remote atomics on a region without LocalWrite", readOnly, driver.MWType1, 0x1000, 8, driver.AccessRemoteAtomic},
		{"a local right", f, driver.MWType1, 0x1000, 8, driver.AccessLocalWrite},
		{"below the region", f, driver.MWType2, 0xfff, 8, driver.AccessRemoteRead},
		{"past the region", f, driver.MWType2, 0x1ff9, 8, driver.AccessRemoteRead},
		{"wrapping around", f, driver.MWType2, 0x1000, ^uint64(0), driver.AccessRemoteRead},
		{"type 2 zero length", f, driver.MWType2, 0x1000, 0, driver.AccessRemoteRead},
	}
	for _, c := range cases {
		w, err := AllocMW(&c.f.tab, c.typ, c.f.pd)
		if err != nil {
			t.Fatal(err)
		}
		k := w.RKey()
		if st := c.f.bind(w, c.addr, c.n, c.access, c.f.qp); st != driver.WCMWBindErr {
			t.Errorf("%s: bind %v, want %v", c.name, st, driver.WCMWBindErr)
		}
		if w.RKey() != k {
			t.Errorf("%s: a refused bind changed the key", c.name)
		}
		if _, ok := w.Current(); ok {
			t.Errorf("%s: a refused bind bound the window", c.name)
		}
	}
	// A window of another PD, a stale window key, a window as region.
	w, _ := AllocMW(&f.tab, driver.MWType1, f.pd2)
	if st := f.bind(w, 0x1000, 8, driver.AccessRemoteRead, f.qp); st != driver.WCMWBindErr {
		t.Errorf("window of another PD: %v", st)
	}
	w2, _ := AllocMW(&f.tab, driver.MWType1, f.pd)
	wr := driver.SendWR{Opcode: driver.OpBindMW, Bind: driver.MWBind{RKey: w2.RKey(), LKey: w2.RKey(), Addr: 0x1000, Length: 8, Access: driver.AccessRemoteRead}}
	if st, _, _ := ExecuteBind(&f.tab, &wr, f.qp, f.pd, nil); st != driver.WCMWBindErr {
		t.Errorf("a window's key as the region: %v", st)
	}
	if st := f.bind(w2, 0x1000, 8, driver.AccessRemoteRead, f.qp); st != driver.WCSuccess {
		t.Fatal(st)
	}
	wr = driver.SendWR{Opcode: driver.OpBindMW, Bind: driver.MWBind{RKey: wr.Bind.RKey, LKey: f.mr.key, Addr: 0x1000, Length: 8, Access: driver.AccessRemoteRead}}
	if st, _, _ := ExecuteBind(&f.tab, &wr, f.qp, f.pd, nil); st != driver.WCMWBindErr {
		t.Errorf("bind under a stale window key: %v", st)
	}
}

// TestType2QPAndInvalidation: a type 2 window grants on its QP only,
// refuses a second bind while bound, is invalidated locally on its PD
// and remotely on its QP only, and binds again under a new key.
func TestType2QPAndInvalidation(t *testing.T) {
	f := newFixture(t, all)
	w, _ := AllocMW(&f.tab, driver.MWType2, f.pd)
	if st := f.bind(w, 0x1000, 64, driver.AccessRemoteWrite, f.qp); st != driver.WCSuccess {
		t.Fatal(st)
	}
	k := w.RKey()
	if _, fl := Check(&f.tab, k, f.pd, f.qp, 0x1000, 8, driver.AccessRemoteWrite); fl != OK {
		t.Fatalf("own QP: %v", fl)
	}
	if _, fl := Check(&f.tab, k, f.pd, f.qp2, 0x1000, 8, driver.AccessRemoteWrite); fl != NotAssoc {
		t.Fatalf("another QP: %v", fl)
	}
	if st := f.bind(w, 0x1000, 64, driver.AccessRemoteWrite, f.qp); st != driver.WCMWBindErr {
		t.Fatalf("second bind while bound: %v", st)
	}
	if _, isW, err := RemoteInvalidate(&f.tab, k, f.qp2, f.pd); !isW || err == nil {
		t.Fatalf("remote invalidation on another QP: window %v, err %v", isW, err)
	}
	if _, isW, _ := RemoteInvalidate(&f.tab, f.mr.key, f.qp, f.pd); isW {
		t.Fatal("a region's key taken for a window")
	}
	if st, _ := LocalInvalidate(&f.tab, k, f.qp2, f.pd2); st != driver.WCMWBindErr {
		t.Fatalf("local invalidation from another PD: %v", st)
	}
	if st, mr := LocalInvalidate(&f.tab, k, f.qp2, f.pd); st != driver.WCSuccess || mr != f.mr {
		t.Fatalf("local invalidation: %v, %v", st, mr)
	}
	if _, fl := Check(&f.tab, k, f.pd, f.qp, 0x1000, 8, driver.AccessRemoteWrite); fl != BadKey {
		t.Fatalf("after invalidation: %v", fl)
	}
	if st, _ := LocalInvalidate(&f.tab, k, f.qp, f.pd); st != driver.WCMWBindErr {
		t.Fatalf("second invalidation: %v", st)
	}
	if st := f.bind(w, 0x1000, 64, driver.AccessRemoteWrite, f.qp2); st != driver.WCSuccess {
		t.Fatal(st)
	}
	if w.RKey() == k {
		t.Fatal("rebind after invalidation kept the key")
	}
	if _, isW, err := RemoteInvalidate(&f.tab, w.RKey(), f.qp2, f.pd); !isW || err != nil {
		t.Fatalf("remote invalidation on the window's QP: %v", err)
	}
	// Type 1 windows are not invalidated.
	w1, _ := AllocMW(&f.tab, driver.MWType1, f.pd)
	f.bind(w1, 0x1000, 64, driver.AccessRemoteWrite, f.qp)
	if st, _ := LocalInvalidate(&f.tab, w1.RKey(), f.qp, f.pd); st != driver.WCMWBindErr {
		t.Fatalf("type 1 local invalidation: %v", st)
	}
	// Dealloc.
	k1 := w1.RKey()
	if b, bound, err := w1.Dealloc(&f.tab); err != nil || !bound || b.MR != f.mr || b.Key != k1 {
		t.Fatalf("dealloc: %+v %v %v", b, bound, err)
	}
	if _, fl := Check(&f.tab, k1, f.pd, f.qp, 0x1000, 8, driver.AccessRemoteWrite); fl != BadKey {
		t.Fatalf("after dealloc: %v", fl)
	}
	if _, _, err := w1.Dealloc(&f.tab); err == nil {
		t.Fatal("second dealloc succeeded")
	}
	if _, err := AllocMW(&f.tab, 3, f.pd); err == nil {
		t.Fatal("type 3 allocated")
	}
}

// TestWindowRightsBeyondRegion: a window grants rights its region lacks
// (C10-74: a region registered LocalWrite|MWBind takes a window granting
// remote read, write and atomics), while the region's own key grants
// nothing remotely.
func TestWindowRightsBeyondRegion(t *testing.T) {
	f := newFixture(t, driver.AccessLocalWrite|driver.AccessMWBind)
	w, err := AllocMW(&f.tab, driver.MWType1, f.pd)
	if err != nil {
		t.Fatal(err)
	}
	if st := f.bind(w, 0x1000, 0x100, driver.RemoteAccess, f.qp); st != driver.WCSuccess {
		t.Fatalf("bind: %v", st)
	}
	if _, fl := Check(&f.tab, w.RKey(), f.pd, f.qp, 0x1000, 8, driver.AccessRemoteWrite|driver.AccessRemoteAtomic); fl != OK {
		t.Fatalf("write through the window: %v", fl)
	}
	if _, fl := Check(&f.tab, f.mr.key, f.pd, f.qp, 0x1000, 8, driver.AccessRemoteRead); fl != Rights {
		t.Fatalf("read with the region's key: %v, want %v", fl, Rights)
	}
}

// testMW is a provider's driver.MW: the window it is.
type testMW struct{ w *Window[*region] }

func (m *testMW) RKey() uint32                  { return m.w.RKey() }
func (m *testMW) Type() driver.MWType           { return m.w.Type() }
func (m *testMW) Dealloc() error                { return nil }
func (m *testMW) GrantWindow() *Window[*region] { return m.w }

// TestBindsNamingTheWindow: binds that name their window execute one
// after the other although built with the same (then current) key, each
// giving the window a new key; a deallocated window refuses them.
func TestBindsNamingTheWindow(t *testing.T) {
	f := newFixture(t, all)
	w, err := AllocMW(&f.tab, driver.MWType1, f.pd)
	if err != nil {
		t.Fatal(err)
	}
	h := &testMW{w}
	posted := w.RKey()
	keys := map[uint32]bool{posted: true}
	for i := range 3 {
		wr := driver.SendWR{Opcode: driver.OpBindMW, Bind: driver.MWBind{MW: h, RKey: posted, LKey: f.mr.key, Addr: 0x1000 + uint64(i)*0x100, Length: 0x100, Access: driver.AccessRemoteRead}}
		st, got, rep := ExecuteBind(&f.tab, &wr, f.qp, f.pd, nil)
		if st != driver.WCSuccess || got != w {
			t.Fatalf("bind %d: %v", i, st)
		}
		if !keys[rep.Key] || keys[w.RKey()] {
			t.Fatalf("bind %d revoked %#x and gave %#x; want a key given before revoked and a new one", i, rep.Key, w.RKey())
		}
		keys[w.RKey()] = true
	}
	if _, fl := Check(&f.tab, w.RKey(), f.pd, f.qp, 0x1200, 0x100, driver.AccessRemoteRead); fl != OK {
		t.Fatalf("the last binding: %v", fl)
	}
	if _, fl := Check(&f.tab, posted, f.pd, f.qp, 0x1000, 8, driver.AccessRemoteRead); fl != BadKey {
		t.Fatalf("the key the binds were built with: %v", fl)
	}
	if _, _, err := w.Dealloc(&f.tab); err != nil {
		t.Fatal(err)
	}
	wr := driver.SendWR{Opcode: driver.OpBindMW, Bind: driver.MWBind{MW: h, LKey: f.mr.key, Addr: 0x1000, Length: 8, Access: driver.AccessRemoteRead}}
	if st, _, _ := ExecuteBind(&f.tab, &wr, f.qp, f.pd, nil); st != driver.WCMWBindErr {
		t.Fatalf("bind of a deallocated window: %v", st)
	}
}
