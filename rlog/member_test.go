package rlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// appendConcurrently appends n records from workers goroutines and
// returns their sequence numbers by record index.
func appendConcurrently(t *testing.T, cl *Client, n, workers int, prefix string) []uint64 {
	t.Helper()
	seqs := make([]uint64, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				seq, err := cl.Append(ctx, []byte(fmt.Sprintf("%s-%d", prefix, i)))
				cancel()
				if err != nil {
					errs <- fmt.Errorf("append %d: %w", i, err)
					return
				}
				seqs[i] = seq
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return seqs
}

// sameLogs checks that members' logs are equal.
func (c *cluster) sameLogs(members ...int) []Record {
	c.t.Helper()
	ref := c.records(members[0])
	for _, i := range members[1:] {
		got := c.records(i)
		if len(got) != len(ref) {
			c.t.Fatalf("member %d holds %d records, member %d %d", i, len(got), members[0], len(ref))
		}
		for k := range got {
			if got[k].Seq != ref[k].Seq || got[k].Epoch != ref[k].Epoch || !bytes.Equal(got[k].Data, ref[k].Data) {
				c.t.Fatalf("record %d differs between members %d and %d", k+1, i, members[0])
			}
		}
	}
	return ref
}

func TestConcurrentAppends(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	seqs := appendConcurrently(t, cl, 1600, 32, "r")
	seen := map[uint64]bool{}
	for _, s := range seqs {
		if s < 1 || s > 1600 || seen[s] {
			t.Fatalf("sequence number %d duplicated or out of range", s)
		}
		seen[s] = true
	}
	c.waitDurable(1, 1600)
	c.waitDurable(2, 1600)
	recs := c.sameLogs(0, 1, 2)
	for i, s := range seqs {
		if want := fmt.Sprintf("r-%d", i); string(recs[s-1].Data) != want {
			t.Fatalf("record %d is %q, want %q", s, recs[s-1].Data, want)
		}
	}
}

// TestCatchUp: a replica that was down catches up, from the primary's
// memory and, for records no longer cached, from its segment files.
func TestCatchUp(t *testing.T) {
	for _, mode := range []Mode{ModeWrite, ModeSend} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := smallConfig()
			cfg.Mode = mode
			c := newCluster(t, "loop", 3, cfg)
			c.start(1, false)
			c.start(2, false)
			c.start(0, true)
			cl := c.dial()
			appendN(t, cl, 50, "a")
			c.stop(2)
			appendConcurrently(t, cl, 5000, 16, "b") // more than the 64 KiB cache holds
			c.start(2, false)
			c.waitDurable(2, 5050)
			c.sameLogs(0, 1, 2)
			st := c.members[0].Status()
			var fromLog int64
			for _, r := range st.Replicas {
				fromLog += r.FromLog
			}
			if fromLog == 0 {
				t.Fatalf("no batch was read from the primary's log: %+v", st.Replicas)
			}
		})
	}
}

// TestPrimaryRestart: the primary restarts, promotes itself to a new
// epoch, and the client carries on.
func TestPrimaryRestart(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	appendN(t, cl, 30, "a")
	c.stop(0)
	c.start(0, true)
	if st := c.members[0].Status(); !st.Primary || st.Epoch != 2 {
		t.Fatalf("restarted primary: %+v", st)
	}
	seqs := appendN(t, cl, 30, "b")
	if seqs[0] != 31 || cl.Reconnects.Load() == 0 {
		t.Fatalf("after the restart: first seq %d, %d reconnects", seqs[0], cl.Reconnects.Load())
	}
	c.waitDurable(1, 60)
	c.waitDurable(2, 60)
	recs := c.sameLogs(0, 1, 2)
	if recs[29].Epoch != 1 || recs[30].Epoch != 2 {
		t.Fatalf("epochs %d, %d", recs[29].Epoch, recs[30].Epoch)
	}
}

// TestFailoverDivergence: the primary writes records no replica gets,
// and dies; a replica is promoted and appends; the old primary comes back
// as a replica, and its tail of records that were never acknowledged is
// cut, not kept.
func TestFailoverDivergence(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	appendN(t, cl, 20, "acked")
	c.stop(1)
	c.stop(2)
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err := cl.Append(ctx, []byte(fmt.Sprintf("never acknowledged %d", i))); !errors.Is(err, ErrOutcomeUnknown) {
				t.Errorf("append without a quorum: %v, want ErrOutcomeUnknown", err)
			}
		}()
	}
	wg.Wait()
	c.waitFor("the primary to write the unacknowledged records", func() bool { return c.members[0].Status().Last == 25 })
	c.stop(0)
	c.start(1, false)
	c.start(2, true)
	cl2 := c.dial()
	seqs := appendN(t, cl2, 10, "epoch2")
	if seqs[0] != 21 {
		t.Fatalf("the new primary's first record is %d, want 21", seqs[0])
	}
	c.start(0, false)
	c.waitDurable(0, 30)
	c.waitFor("member 0 to catch up", func() bool { return c.members[0].Status().LastEpoch == 2 })
	recs := c.sameLogs(0, 1, 2)
	for _, r := range recs {
		if strings.HasPrefix(string(r.Data), "never") {
			t.Fatalf("record %d, never acknowledged and lost with its primary, survived: %q", r.Seq, r.Data)
		}
	}
	if !c.logs[0].has("cut the log back from record 25 to 20") {
		t.Fatalf("member 0 did not report cutting its tail: %q", c.logs[0].lines)
	}
}

// TestPromotionFetches: a member promoted while behind another member of
// the majority fetches the missing records before it serves.
func TestPromotionFetches(t *testing.T) {
	for _, mode := range []Mode{ModeWrite, ModeSend} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := smallConfig()
			cfg.Mode = mode
			c := newCluster(t, "loop", 3, cfg)
			c.start(1, false)
			c.start(2, false)
			c.start(0, true)
			cl := c.dial()
			appendN(t, cl, 20, "a")
			c.stop(2)
			appendConcurrently(t, cl, 3000, 8, "b")
			c.stop(0)
			c.start(2, true)
			if st := c.members[2].Status(); st.Last != 3020 || !st.Primary {
				t.Fatalf("promoted member: %+v", st)
			}
			if !c.logs[2].has("is ahead") {
				t.Fatalf("no fetch reported: %q", c.logs[2].lines)
			}
			cl2 := c.dial()
			if seqs := appendN(t, cl2, 5, "c"); seqs[0] != 3021 {
				t.Fatalf("first append after promotion: %d", seqs[0])
			}
			c.waitDurable(1, 3025)
			c.sameLogs(1, 2)
		})
	}
}

// TestFenceLivePrimary: promoting a member fences the running primary,
// which steps down; clients move to the new primary.
func TestFenceLivePrimary(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	appendN(t, cl, 10, "a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.members[1].Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if st := c.members[0].Status(); st.Primary || st.Epoch != 2 {
		t.Fatalf("old primary after the promotion: %+v", st)
	}
	if st := c.members[1].Status(); !st.Primary || st.Epoch != 2 {
		t.Fatalf("new primary: %+v", st)
	}
	seqs := appendN(t, cl, 10, "b")
	if seqs[0] != 11 {
		t.Fatalf("first append to the new primary: %d", seqs[0])
	}
	c.waitDurable(0, 20)
	c.waitDurable(2, 20)
	c.sameLogs(0, 1, 2)
	// The old epoch is fenced for good: a member of epoch 1 cannot
	// replicate to the others.
	m := c.members[0]
	m.mu.Lock()
	rc := m.promiseLocked(1, m.st.id)
	m.mu.Unlock()
	if rc != codeFenced {
		t.Fatalf("promise of the old epoch: code %d", rc)
	}
}

// TestNack: batches corrupted on the way are refused, NACKed and sent
// again; no bad record is ever applied.
func TestNack(t *testing.T) {
	for _, mode := range []Mode{ModeWrite, ModeSend} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := smallConfig()
			cfg.Mode = mode
			c := newCluster(t, "loop", 3, cfg)
			var mu sync.Mutex
			seen := map[uint64]int{}
			h := &hooks{corrupt: func(first uint64) bool {
				mu.Lock()
				defer mu.Unlock()
				seen[first]++
				return first%5 == 0 && seen[first] == 1
			}}
			c.hooks = []*hooks{h, nil, nil}
			c.start(1, false)
			c.start(2, false)
			c.start(0, true)
			cl := c.dial()
			appendN(t, cl, 100, "r")
			c.waitDurable(1, 100)
			c.waitDurable(2, 100)
			recs := c.sameLogs(0, 1, 2)
			for i, r := range recs {
				if string(r.Data) != fmt.Sprintf("r-%d", i) {
					t.Fatalf("record %d = %q", r.Seq, r.Data)
				}
			}
			var nacks int64
			for _, r := range c.members[0].Status().Replicas {
				nacks += r.Nacks
			}
			if nacks == 0 || !(c.logs[1].has("refused a batch") || c.logs[2].has("refused a batch")) {
				t.Fatalf("no NACK: %d", nacks)
			}
		})
	}
}

// TestReplicaDiskFull: a replica whose writes fail refuses the batch and
// drops the session; the others keep acknowledging; once it has room it
// catches up.
func TestReplicaDiskFull(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	var full atomic.Bool
	c.hooks = []*hooks{nil, nil, {writeError: func(int) error {
		if full.Load() {
			return syscall.ENOSPC
		}
		return nil
	}}}
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	appendN(t, cl, 10, "a")
	c.waitDurable(2, 10)
	full.Store(true)
	appendN(t, cl, 50, "b")
	if st := c.members[2].Status(); st.Last != 10 {
		t.Fatalf("the full replica holds %d records", st.Last)
	}
	c.waitFor("the primary to report the replica's storage error", func() bool {
		for _, r := range c.members[0].Status().Replicas {
			if strings.Contains(r.Err, "no space left on device") {
				return true
			}
		}
		return false
	})
	full.Store(false)
	c.waitDurable(2, 60)
	c.sameLogs(0, 1, 2)
}

// TestReplicaDiskFullTmpfs fills a real file system: a 256 KiB tmpfs
// (root only).
func TestReplicaDiskFullTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	c := newCluster(t, "loop", 3, smallConfig())
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "rlogtest", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		c.stop(2)
		exec.Command("umount", mnt).Run()
	})
	c.dirs[2] = mnt + "/data"
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	rec := bytes.Repeat([]byte("x"), 1000)
	for i := range 400 { // 400 KB: more than the tmpfs holds
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := cl.Append(ctx, rec); err != nil {
			t.Fatalf("append %d with one replica's disk full: %v", i, err)
		}
		cancel()
	}
	c.waitFor("the primary to report the replica's full disk", func() bool {
		if c.logs[2].has("no space left on device") {
			return true
		}
		for _, r := range c.members[0].Status().Replicas {
			if strings.Contains(r.Err, "no space left on device") {
				return true
			}
		}
		return false
	})
	c.waitDurable(1, 400)
	full := c.members[2].Status()
	if full.Last >= 400 || full.Err != nil {
		t.Fatalf("the full replica: %+v", full)
	}
	// What it holds is a valid prefix, and it reopens cleanly.
	c.stop(2)
	recs := c.records(2)
	ref := c.records(0)
	for i := range recs {
		if !bytes.Equal(recs[i].Data, ref[i].Data) {
			t.Fatalf("record %d differs", i+1)
		}
	}
	if _, err := ScanDir(c.dirs[2], 1, func(Record) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// TestPrimaryDiskFull: a primary that cannot write its log stops being
// primary; the appends waiting fail with the cause.
func TestPrimaryDiskFull(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	var full atomic.Bool
	c.hooks = []*hooks{{writeError: func(int) error {
		if full.Load() {
			return syscall.ENOSPC
		}
		return nil
	}}, nil, nil}
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	appendN(t, cl, 10, "a")
	full.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := cl.Append(ctx, []byte("b"))
	if !errors.Is(err, ErrOutcomeUnknown) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("append on a primary whose disk is full: %v", err)
	}
	c.waitFor("the primary to step down", func() bool { return !c.members[0].Status().Primary })
	if st := c.members[0].Status(); st.Last != 10 {
		t.Fatalf("the primary's log after the failed write: %+v", st)
	}
}

// TestOversize: records over MaxRecord are refused, by the client and by
// the primary.
func TestOversize(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cl.Append(ctx, make([]byte, 1025)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a record of 1025 bytes with MaxRecord 1024: %v", err)
	}
	if seq, err := cl.Append(ctx, make([]byte, 1024)); err != nil || seq != 1 {
		t.Fatalf("a record of exactly MaxRecord: %d, %v", seq, err)
	}
	// The primary checks too, whatever a client sends.
	p := newRawPeer(t, c.addrs[0])
	r, err := p.dial(c.addrs[0], newConnMsg(kindClient))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, int(r.a())+2048)
	m := startAppend(buf, 5)
	m, _ = addAppend(buf, m, make([]byte, 1500))
	p.sendMsg(m)
	if rep := p.until(msgReply); rep == nil || rep.replyStatus() != codeTooLarge || rep.replyID() != 5 {
		t.Fatalf("reply to an oversize record: %v", rep)
	}
	bad := startAppend(buf, 6)
	bad.put32(16, 3) // claims three records, holds none
	p.sendMsg(bad)
	if rep := p.until(msgReply); rep == nil || rep.replyStatus() != codeBadRequest {
		t.Fatalf("reply to a malformed APPEND: %v", rep)
	}
	p.sendMsg([]byte("garbage"))
	if rep := p.until(msgReply); rep == nil || rep.replyStatus() != codeBadRequest {
		t.Fatalf("reply to garbage: %v", rep)
	}
	if st := c.members[0].Status(); st.Last != 1 {
		t.Fatalf("the log holds %d records; only one was valid", st.Last)
	}
}

// TestTooFarBehind: a replica that needs records the primary no longer
// keeps is told so, clearly, and is not fed anything.
func TestTooFarBehind(t *testing.T) {
	cfg := smallConfig()
	cfg.RetainSegments = 2
	c := newCluster(t, "loop", 3, cfg)
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	appendN(t, cl, 10, "a")
	c.waitDurable(2, 10)
	c.stop(2)
	rec := bytes.Repeat([]byte("y"), 1000)
	for range 200 { // 200 KB: several 32 KiB segments
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := cl.Append(ctx, rec); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	if first := c.members[0].Status().First; first <= 11 {
		t.Fatalf("the primary still keeps records from %d", first)
	}
	c.start(2, false)
	c.waitFor("the replica to be told it is too far behind", func() bool { return c.logs[2].has("too far behind") })
	c.waitFor("the primary to report it", func() bool {
		for _, r := range c.members[0].Status().Replicas {
			if strings.Contains(r.Err, "too far behind") {
				return true
			}
		}
		return false
	})
	if st := c.members[2].Status(); st.Last != 10 {
		t.Fatalf("the replica that is too far behind holds %d records", st.Last)
	}
}

// TestNoQuorum: without a quorum nothing is acknowledged; the append's
// outcome is unknown, and it is committed once a replica is back.
func TestNoQuorum(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	appendN(t, cl, 5, "a")
	c.stop(1)
	c.stop(2)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := cl.Append(ctx, []byte("pending")); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("append without a quorum: %v", err)
	}
	c.start(1, false)
	seqs := appendN(t, cl, 1, "after")
	if seqs[0] != 7 {
		t.Fatalf("append after a replica returned: %d", seqs[0])
	}
	if r := c.records(1); len(r) < 6 || string(r[5].Data) != "pending" {
		t.Fatalf("the append whose outcome was unknown is not in the log")
	}
}

// TestPromotionNeedsMajority: a member cannot become primary alone.
func TestPromotionNeedsMajority(t *testing.T) {
	cfg := smallConfig()
	cfg.PromoteTimeout = 300 * time.Millisecond
	c := newCluster(t, "loop", 3, cfg)
	if _, err := c.startErr(1, true); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("promotion with no other member up: %v, want ErrNoQuorum", err)
	}
}

// TestClusterMismatch: members configured with different member lists
// refuse each other.
func TestClusterMismatch(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	odd := c.config(2, false)
	odd.Members = append([]string{"loop://someone-else"}, c.addrs[1:]...)
	odd.Members[0] = "loop://someone-else"
	m, err := Start(context.Background(), odd)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cfg := c.config(0, true)
	cfg.PromoteTimeout = 300 * time.Millisecond
	if _, err := Start(context.Background(), cfg); !errors.Is(err, ErrNoQuorum) || !strings.Contains(err.Error(), "another cluster") {
		t.Fatalf("promotion with the only other member up of another cluster: %v", err)
	}
}

// TestReplyWaitsForBuffer: when every reply buffer is in flight — on
// iWARP a client can send its next request, on the credit a reply gave
// back, before the primary has polled that reply's send completion — the
// reply waits for a buffer; the client keeps its connection.
func TestReplyWaitsForBuffer(t *testing.T) {
	cs := &clientSession{k: &link{}}
	cs.reply(7, 1, 1, codeOK, "")
	if cs.dead || len(cs.waiting) != 1 || cs.waiting[0].id != 7 {
		t.Fatalf("a reply with no buffer free: dead %v, waiting %v", cs.dead, cs.waiting)
	}
}
