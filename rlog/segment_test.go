package rlog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// frames builds the frames of records first..first+n-1 of epoch, each
// with data rec(seq).
func frames(first uint64, n int, epoch uint64, rec func(uint64) []byte) []byte {
	var b []byte
	for s := first; s < first+uint64(n); s++ {
		r := rec(s)
		f := make([]byte, frameLen(len(r)))
		putFrame(f, s, epoch, r)
		b = append(b, f...)
	}
	return b
}

func recData(s uint64) []byte { return bytes.Repeat([]byte{byte(s)}, int(s%97)) }

func openTestLog(t *testing.T, dir string, opt logOptions) *diskLog {
	t.Helper()
	l, err := openLog(dir, opt)
	if err != nil {
		t.Fatalf("open log: %v", err)
	}
	t.Cleanup(func() { l.close() })
	return l
}

// checkRead reads every record of l from each start and compares.
func checkRead(t *testing.T, l *diskLog, last uint64) {
	t.Helper()
	buf := make([]byte, 4096)
	for start := l.First(); start <= last; start += 7 {
		n, count, err := l.read(start, buf)
		if err != nil || count == 0 {
			t.Fatalf("read from %d: %d records, %v", start, count, err)
		}
		off := 0
		for k := range count {
			f, size, err := parseFrame(buf[off:n], MaxRecordLimit)
			if err != nil || f.seq() != start+uint64(k) || !bytes.Equal(f.payload(), recData(f.seq())) {
				t.Fatalf("read from %d: record %d: %v %v", start, k, f, err)
			}
			off += size
		}
	}
}

func TestLogAppendRotateReopen(t *testing.T) {
	dir := t.TempDir()
	opt := logOptions{segmentBytes: 2048}
	l := openTestLog(t, dir, opt)
	var seq uint64 = 1
	for _, n := range []int{1, 5, 30, 2, 64, 10} {
		if err := l.append(frames(seq, n, 1, recData)); err != nil {
			t.Fatal(err)
		}
		seq += uint64(n)
	}
	if err := l.append(frames(seq, 20, 3, recData)); err != nil {
		t.Fatal(err)
	}
	seq += 20
	last := seq - 1
	if got, e := l.Last(); got != last || e != 3 {
		t.Fatalf("last %d epoch %d, want %d epoch 3", got, e, last)
	}
	if h := l.history(); len(h) != 2 || h[0] != (epochStart{1, 1}) || h[1] != (epochStart{3, last - 19}) {
		t.Fatalf("history %v", h)
	}
	l.requestSync()
	checkRead(t, l, last)
	if err := l.append(frames(seq+1, 1, 3, recData)); err == nil {
		t.Fatal("append of a gap accepted")
	}
	if err := l.append(frames(seq, 1, 2, recData)); err == nil {
		t.Fatal("append of an older epoch accepted")
	}
	l.close()
	segs, _ := segmentFiles(dir)
	if len(segs) < 3 {
		t.Fatalf("%d segments; want rotation", len(segs))
	}
	l2 := openTestLog(t, dir, opt)
	if got, _ := l2.Last(); got != last || l2.Durable() != last {
		t.Fatalf("reopened: last %d durable %d, want %d", got, l2.Durable(), last)
	}
	checkRead(t, l2, last)
	if _, err := openLog(dir, opt); err == nil {
		t.Fatal("a second open of a data directory in use succeeded")
	}
}

func TestLogTornTail(t *testing.T) {
	for _, tail := range []struct {
		name string
		fn   func(f []byte) []byte
	}{
		{"half a header", func(f []byte) []byte { return f[:10] }},
		{"half a record", func(f []byte) []byte { return f[:len(f)-5] }},
		{"bad checksum", func(f []byte) []byte { f[frameHeader+3] ^= 1; return f }},
		{"zeros", func(f []byte) []byte { return make([]byte, 100) }},
		{"a stale record", func([]byte) []byte { return frames(3, 1, 1, recData) }},
	} {
		t.Run(tail.name, func(t *testing.T) {
			dir := t.TempDir()
			l := openTestLog(t, dir, logOptions{})
			if err := l.append(frames(1, 40, 1, recData)); err != nil {
				t.Fatal(err)
			}
			l.close()
			path := filepath.Join(dir, segName(1))
			f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			junk := tail.fn(frames(41, 1, 1, func(uint64) []byte { return []byte("the record being written when the power went") }))
			f.Write(junk)
			f.Close()
			res, err := ScanDir(dir, 1, func(Record) error { return nil })
			if err != nil || res.Last != 40 || res.Torn != int64(len(junk)) {
				t.Fatalf("scan: %+v, %v; want last 40, %d torn bytes", res, err, len(junk))
			}
			l2 := openTestLog(t, dir, logOptions{})
			if last, _ := l2.Last(); last != 40 || l2.torn != int64(len(junk)) {
				t.Fatalf("reopened: last %d, truncated %d bytes", last, l2.torn)
			}
			if err := l2.append(frames(41, 1, 1, recData)); err != nil {
				t.Fatalf("append after truncation: %v", err)
			}
		})
	}
}

func TestLogCorruptMiddle(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, dir, logOptions{segmentBytes: 1024})
	for s := uint64(1); s <= 100; s += 10 {
		if err := l.append(frames(s, 10, 1, recData)); err != nil {
			t.Fatal(err)
		}
	}
	l.close()
	path := filepath.Join(dir, segName(1))
	b, _ := os.ReadFile(path)
	b[frameHeader] ^= 0xff // record 1's one byte
	os.WriteFile(path, b, 0o644)
	if _, err := openLog(dir, logOptions{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with a bad record in the first of several segments: %v, want ErrCorrupt", err)
	}
	if _, err := ScanDir(dir, 1, func(Record) error { return nil }); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("scan: %v, want ErrCorrupt", err)
	}
}

func TestLogTruncate(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, dir, logOptions{segmentBytes: 1024})
	if err := l.append(frames(1, 50, 1, recData)); err != nil {
		t.Fatal(err)
	}
	for s := uint64(51); s <= 150; s += 10 {
		if err := l.append(frames(s, 10, 2, recData)); err != nil {
			t.Fatal(err)
		}
	}
	for _, keep := range []uint64{150, 120, 61, 60, 50, 33, 0} {
		if err := l.truncate(keep); err != nil {
			t.Fatalf("truncate to %d: %v", keep, err)
		}
		last, e := l.Last()
		wantE := uint64(2)
		if keep <= 50 {
			wantE = 1
		}
		if keep == 0 {
			wantE = 0
		}
		if last != keep || e != wantE || (keep < 150 && l.Durable() != keep) {
			t.Fatalf("truncated to %d: last %d epoch %d durable %d", keep, last, e, l.Durable())
		}
		if keep > 0 {
			checkRead(t, l, keep)
		}
		res, err := ScanDir(dir, 1, func(Record) error { return nil })
		if err != nil || res.Last != keep || res.Torn != 0 {
			t.Fatalf("scan after truncating to %d: %+v %v", keep, res, err)
		}
	}
	if err := l.append(frames(1, 5, 4, recData)); err != nil {
		t.Fatalf("append after truncating everything: %v", err)
	}
	l.close()
	l2 := openTestLog(t, dir, logOptions{})
	if last, e := l2.Last(); last != 5 || e != 4 {
		t.Fatalf("reopened: %d epoch %d", last, e)
	}
}

func TestLogRetain(t *testing.T) {
	dir := t.TempDir()
	l := openTestLog(t, dir, logOptions{segmentBytes: 1024, retain: 2})
	for s := uint64(1); s <= 200; s += 10 {
		if err := l.append(frames(s, 10, 1, recData)); err != nil {
			t.Fatal(err)
		}
	}
	segs, _ := segmentFiles(dir)
	if len(segs) != 2 || l.First() == 1 || l.First() != segs[0].first {
		t.Fatalf("%d segments, first record %d", len(segs), l.First())
	}
	if _, _, err := l.read(1, make([]byte, 4096)); !errors.Is(err, ErrTooFarBehind) {
		t.Fatalf("read of a deleted record: %v", err)
	}
	if h := l.history(); len(h) != 1 || h[0].first != l.First() {
		t.Fatalf("history %v, first %d", h, l.First())
	}
	checkRead(t, l, 200)
}

func TestLogStorageErrors(t *testing.T) {
	dir := t.TempDir()
	var fail error
	h := &hooks{writeError: func(int) error { return fail }}
	l := openTestLog(t, dir, logOptions{hooks: h})
	if err := l.append(frames(1, 10, 1, recData)); err != nil {
		t.Fatal(err)
	}
	fail = syscall.ENOSPC
	if err := l.append(frames(11, 10, 1, recData)); !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append on a full disk: %v", err)
	}
	if last, _ := l.Last(); last != 10 || l.Err() != nil {
		t.Fatalf("after a failed append: last %d, err %v", last, l.Err())
	}
	fail = nil
	if err := l.append(frames(11, 10, 1, recData)); err != nil {
		t.Fatalf("append once there is room: %v", err)
	}
	// An fsync failure breaks the log for good: what the page cache held
	// is unknown.
	sub, cancel := l.subscribe()
	defer cancel()
	h.syncError = func() error { return fmt.Errorf("%w: injected fsync failure", ErrStorage) }
	l.requestSync()
	<-sub
	if l.Err() == nil || l.Durable() == 20 {
		t.Fatalf("after a failed fsync: err %v, durable %d", l.Err(), l.Durable())
	}
	if err := l.append(frames(21, 1, 1, recData)); !errors.Is(err, ErrStorage) {
		t.Fatalf("append to a broken log: %v", err)
	}
}

func TestCommonPrefix(t *testing.T) {
	h := func(pairs ...uint64) []epochStart {
		var out []epochStart
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, epochStart{pairs[i], pairs[i+1]})
		}
		return out
	}
	for _, c := range []struct {
		a     []epochStart
		aLast uint64
		b     []epochStart
		bLast uint64
		want  uint64
	}{
		{nil, 0, nil, 0, 0},
		{h(1, 1), 10, nil, 0, 0},
		{h(1, 1), 10, h(1, 1), 5, 5},
		{h(1, 1), 10, h(1, 1), 15, 10},
		{h(1, 1, 2, 8), 10, h(1, 1), 15, 7},                 // b has an old primary's tail beyond 7
		{h(1, 1, 3, 56), 80, h(1, 1, 2, 50), 60, 49},        // Kafka's two-round case, in one
		{h(1, 1, 2, 50, 4, 70), 90, h(1, 1, 2, 50), 65, 65}, // b is a prefix
		{h(2, 5), 10, h(1, 1, 2, 7), 12, 10},                // a's log starts at 5 (retention)
		{h(1, 1, 5, 20), 30, h(1, 1, 3, 20), 25, 19},
	} {
		if got := commonPrefix(c.a, c.aLast, c.b, c.bLast); got != c.want {
			t.Errorf("commonPrefix(%v, %d, %v, %d) = %d, want %d", c.a, c.aLast, c.b, c.bLast, got, c.want)
		}
		if got := commonPrefix(c.b, c.bLast, c.a, c.aLast); got != c.want {
			t.Errorf("commonPrefix(%v, %d, %v, %d) = %d, want %d (swapped)", c.b, c.bLast, c.a, c.aLast, got, c.want)
		}
	}
}

func TestState(t *testing.T) {
	dir := t.TempDir()
	st, err := loadState(dir, false)
	if err != nil || st.id == 0 || st.epoch != 0 {
		t.Fatalf("new state: %+v, %v", st, err)
	}
	st.epoch, st.holder = 7, 42
	if err := saveState(dir, st, false); err != nil {
		t.Fatal(err)
	}
	if got, err := loadState(dir, false); err != nil || got != st {
		t.Fatalf("reloaded %+v, %v; want %+v", got, err, st)
	}
	b, _ := os.ReadFile(filepath.Join(dir, stateFile))
	b[17] ^= 1
	os.WriteFile(filepath.Join(dir, stateFile), b, 0o644)
	if _, err := loadState(dir, false); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a damaged state file: %v", err)
	}
}

// TestOpenSyncsEverySegment: opening a log declares all it holds
// durable, so every segment is synced then, not only the last: a process
// killed before it synced a segment it had just rotated out of left that
// one's records in the page cache alone.
func TestOpenSyncsEverySegment(t *testing.T) {
	dir := t.TempDir()
	l, err := openLog(dir, logOptions{segmentBytes: 1024, noSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 60; seq += 10 {
		if err := l.append(frames(seq, 10, 1, recData)); err != nil {
			t.Fatal(err)
		}
	}
	segs := len(l.segs)
	l.close()
	if segs < 3 {
		t.Fatalf("%d segments, want 3 or more", segs)
	}
	var synced []string
	defer func(f func(string) error) { syncPath = f }(syncPath)
	syncPath = func(p string) error {
		synced = append(synced, p)
		return fsyncPath(p)
	}
	l = openTestLog(t, dir, logOptions{segmentBytes: 1024})
	for _, sg := range l.segs[:len(l.segs)-1] {
		if !slices.Contains(synced, sg.path) {
			t.Errorf("segment %s was not synced when the log was opened", sg.path)
		}
	}
	if d := l.Durable(); d != 60 {
		t.Errorf("durable %d, want 60", d)
	}
}
