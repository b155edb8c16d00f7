package shm

import (
	"testing"

	"github.com/goverbs/goverbs/internal/keytab"
)

// TestGrantTablesTurnApart: the slot of one key lies at different offsets
// of the grant tables of consecutive QPs, and a turned table finds what
// was published in it, and nothing under another turn.
func TestGrantTablesTurnApart(t *testing.T) {
	const qps = 64
	offsets := map[uint32]bool{}
	for qpn := uint32(1); qpn <= qps; qpn++ {
		offsets[grantRotation(qpn)] = true
		if r := grantRotation(qpn); r >= maxKeys {
			t.Fatalf("QP %d: rotation %d beyond the %d slots", qpn, r, maxKeys)
		}
	}
	if len(offsets) < qps*3/4 {
		t.Fatalf("%d QPs' grant tables turn to only %d distinct offsets", qps, len(offsets))
	}
	mem := make([]byte, maxKeys*keySlotSize)
	key := uint32(0xabcd00) | 7
	k := keyInfo{key: key, kind: kindSegment, access: 3, segID: 9, addr: 4096, length: 64}
	owner := viewKeyTable(mem, maxKeys, grantRotation(5))
	owner.publish(keytab.Index(key), k)
	got, ok := viewKeyTable(mem, maxKeys, grantRotation(5)).lookup(key)
	if !ok || got.key != key || got.segID != 9 || got.addr != 4096 {
		t.Fatalf("the turned table's lookup = %+v, %v; want the key published", got, ok)
	}
	if !owner.current(&got) {
		t.Fatal("the key read is not current in its own table")
	}
	if _, ok := viewKeyTable(mem, maxKeys, grantRotation(6)).lookup(key); ok {
		t.Fatal("a table viewed with another QP's turn found the key")
	}
	owner.revoke(keytab.Index(key))
	if _, ok := owner.lookup(key); ok {
		t.Fatal("a revoked key is still found")
	}
}

// TestBlockHeadersSpread: the blocks of consecutive QPs start at
// different offsets below a page, on headerSize boundaries.
func TestBlockHeadersSpread(t *testing.T) {
	const qps = 32
	offsets := map[int]bool{}
	for qpn := uint32(1); qpn <= qps; qpn++ {
		p := blockPad(qpn)
		if p%headerSize != 0 || p < 0 || p+headerSize > pageSize {
			t.Fatalf("QP %d: block at %d, not a header boundary within the first page", qpn, p)
		}
		offsets[p] = true
	}
	if len(offsets) < 12 {
		t.Fatalf("%d QPs' blocks start at only %d distinct offsets", qps, len(offsets))
	}
}
