package rlog

import (
	"sync"
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// TestCacheClaim: once the appender has found room for a request in the
// next chunk, a sender can no longer pin that chunk (its records are then
// read from the log), so the appender never overwrites a batch in flight.
func TestCacheClaim(t *testing.T) {
	vctx, err := verbs.Open("loop0")
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	c, err := newCache(pd, 2, 4096, &mu)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	flush := func() error {
		c.publish()
		return nil
	}
	req := func(n int) msg {
		b := make([]byte, 8192)
		m := startAppend(b, 1)
		m, _ = addAppend(b, m, make([]byte, n))
		return m
	}
	// Fill chunk 0 and move on to chunk 1, so chunk 0 holds the oldest
	// records.
	seq := uint64(1)
	for range 2 {
		m := req(3000)
		if !c.fits(m, 4000) {
			t.Fatal("no room in an empty cache")
		}
		if err := c.add(seq, 1, make([]byte, 3000), flush); err != nil {
			t.Fatal(err)
		}
		seq++
	}
	flush()
	var cur cacheCursor
	if _, n, _, chunk, _ := c.batch(&cur, 1, 4096, 0); n == 0 || chunk != 0 {
		t.Fatalf("record 1 is not in chunk 0: %d bytes, chunk %d", n, chunk)
	}
	c.unpin(0, c.chunks[0].gen)
	// The next record needs chunk 0 again: fits claims it...
	if !c.fits(req(3000), 4000) {
		t.Fatal("no room, with nothing pinned")
	}
	// ...so a lagging sender no longer finds record 1 there.
	cur = cacheCursor{}
	if _, n, _, _, _ := c.batch(&cur, 1, 4096, 0); n != 0 {
		t.Fatal("a sender pinned a chunk the appender had claimed")
	}
	if err := c.add(seq, 1, make([]byte, 3000), flush); err != nil {
		t.Fatalf("add into the claimed chunk: %v", err)
	}
	// And a chunk pinned before the check is not claimed.
	flush()
	cur = cacheCursor{}
	if _, n, _, chunk, _ := c.batch(&cur, 2, 4096, 0); n == 0 || chunk != 1 {
		t.Fatalf("record 2: %d bytes in chunk %d", n, chunk)
	}
	if c.fits(req(3000), 4000) {
		t.Fatal("room found in a pinned chunk")
	}
}
