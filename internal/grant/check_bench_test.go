package grant

import (
	"testing"

	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs/driver"
)

// BenchmarkCheckRegion is the data-path key check of a region's rkey.
func BenchmarkCheckRegion(b *testing.B) {
	pd := &testPD{1}
	var tab keytab.Table[Entry[*region]]
	m := newRegion(4096, 1<<20, driver.RemoteAccess, pd)
	k, _ := tab.Insert(func(k uint32) Entry[*region] { m.key = k; return RegionEntry(m) })
	b.ReportAllocs()
	for b.Loop() {
		if _, f := Check(&tab, k, any(pd), nil, 8192, 64, driver.AccessRemoteWrite); f != OK {
			b.Fatal(f)
		}
	}
}

// BenchmarkCheckRegionDirect is the pre-grant check (a lookup and the
// field comparisons, as loop0's span did) for comparison.
func BenchmarkCheckRegionDirect(b *testing.B) {
	pd := &testPD{1}
	var tab keytab.Table[*region]
	m := newRegion(4096, 1<<20, driver.RemoteAccess, pd)
	k, _ := tab.Insert(func(k uint32) *region { m.key = k; return m })
	b.ReportAllocs()
	for b.Loop() {
		r, _ := tab.Lookup(k)
		if r == nil || !r.valid || r.pd != any(pd) || r.access&driver.AccessRemoteWrite == 0 || !inside(8192, 64, r.addr, r.len) {
			b.Fatal("refused")
		}
	}
}
