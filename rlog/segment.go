package rlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A member's log lives in its data directory as segment files, each named
// after the sequence number of its first record (00000000000000000001.seg)
// and holding whole frames back to back. Only the last segment is written;
// a segment that reaches SegmentBytes is closed and a new one started.
//
// Opening a log checks every frame (checksum, consecutive sequence
// numbers, epochs that never decrease) and truncates a torn tail: the
// frames after the first bad one in the last segment, which a crash in
// the middle of a write leaves. A bad frame anywhere else is corruption,
// not a crash, and the log refuses to open.
//
// Writes go to the page cache; a sync goroutine fsyncs them in groups
// (every fsync covers everything written before it started) and publishes
// the durable sequence number, which is what a member acknowledges.

// epochStart says that the records from first on were appended in epoch;
// a log's history is the list of them, oldest first.
type epochStart struct{ epoch, first uint64 }

// logOptions configure a Log.
type logOptions struct {
	segmentBytes int64
	retain       int // segments kept (0: all)
	noSync       bool
	hooks        *hooks
}

// segment is one segment file.
type segment struct {
	first uint64 // seq of its first record: its name
	last  uint64 // seq of its last record; first-1 while it is empty
	size  int64
	path  string
	index []int64  // offsets of records first, first+indexEvery, ...
	rf    *os.File // opened for reading on demand
}

// indexEvery is the spacing of a segment's in-memory offset index.
const indexEvery = 16

func segName(first uint64) string { return fmt.Sprintf("%020d.seg", first) }

// reader returns the segment's file opened for reading.
func (s *segment) reader() (*os.File, error) {
	if s.rf == nil {
		f, err := os.Open(s.path)
		if err != nil {
			return nil, err
		}
		s.rf = f
	}
	return s.rf, nil
}

func (s *segment) closeReader() {
	if s.rf != nil {
		s.rf.Close()
		s.rf = nil
	}
}

// diskLog is a member's log on disk. Its methods are safe for concurrent use.
type diskLog struct {
	dir  string
	opt  logOptions
	lock *os.File

	// syncMu serialises fsyncs with truncation, which replaces files.
	syncMu sync.Mutex

	mu        sync.Mutex
	segs      []*segment
	active    *os.File // the last segment, open for writing
	first     uint64   // seq of the first record kept
	last      uint64
	lastEpoch uint64
	hist      []epochStart
	durable   uint64
	pending   []*os.File // rotated segments not yet synced
	dirDirty  bool
	err       error // sticky: the log failed and must be reopened
	closed    bool
	subs      map[chan struct{}]struct{}
	torn      int64 // bytes of torn tail truncated at open

	syncReq chan struct{}
	quit    chan struct{}
	wg      sync.WaitGroup
}

// openLog opens (creating it if need be) the log in dir, checks it,
// truncates a torn tail, and makes what it holds durable.
func openLog(dir string, opt logOptions) (*diskLog, error) {
	if opt.segmentBytes <= 0 {
		opt.segmentBytes = 64 << 20
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("rlog: data directory %s is in use by another process: %w", dir, err)
	}
	l := &diskLog{dir: dir, opt: opt, lock: lock, first: 1, subs: map[chan struct{}]struct{}{},
		syncReq: make(chan struct{}, 1), quit: make(chan struct{})}
	if err := l.load(); err != nil {
		l.closeFiles()
		return nil, err
	}
	if !opt.noSync {
		// Every segment: a process killed before its last rotation's
		// sync left the one before the last unsynced, and what is opened
		// is declared durable.
		for _, sg := range l.segs[:len(l.segs)-1] {
			if err := syncPath(sg.path); err != nil {
				l.closeFiles()
				return nil, err
			}
		}
		if err := l.active.Sync(); err != nil {
			l.closeFiles()
			return nil, fmt.Errorf("%w: sync %s: %w", ErrStorage, l.segs[len(l.segs)-1].path, err)
		}
		if err := syncPath(dir); err != nil {
			l.closeFiles()
			return nil, err
		}
	}
	l.durable = l.last
	l.wg.Add(1)
	go l.syncLoop()
	return l, nil
}

// segmentFiles lists the segment files of dir by first sequence number.
func segmentFiles(dir string) ([]*segment, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	var segs []*segment
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".seg")
		if !ok || e.IsDir() {
			continue
		}
		first, err := strconv.ParseUint(name, 10, 64)
		if err != nil || first == 0 {
			return nil, fmt.Errorf("%w: %s is not a segment file name", ErrCorrupt, e.Name())
		}
		segs = append(segs, &segment{first: first, last: first - 1, path: filepath.Join(dir, e.Name())})
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].first < segs[j].first })
	return segs, nil
}

// load reads every segment, checking it, and opens the last for writing.
func (l *diskLog) load() error {
	segs, err := segmentFiles(l.dir)
	if err != nil {
		return err
	}
	if len(segs) > 0 {
		l.first = segs[0].first
	}
	l.last = l.first - 1
	for i, s := range segs {
		if s.first != l.last+1 {
			return fmt.Errorf("%w: segment %s starts at record %d, but the one before ends at %d", ErrCorrupt, filepath.Base(s.path), s.first, l.last)
		}
		end, bad, err := scanFile(s.path, func(f frame, off int64) bool {
			if f.seq() != l.last+1 || f.epoch() < l.lastEpoch || f.epoch() == 0 {
				return false
			}
			l.noteFrame(s, f, off)
			return true
		})
		if err != nil {
			return err
		}
		s.size = end
		if bad != nil {
			if i != len(segs)-1 {
				return fmt.Errorf("%w: segment %s: %v at offset %d, and segments follow it", ErrCorrupt, filepath.Base(s.path), bad, end)
			}
			fi, err := os.Stat(s.path)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrStorage, err)
			}
			l.torn = fi.Size() - end
			if err := os.Truncate(s.path, end); err != nil {
				return fmt.Errorf("%w: truncate the torn tail of %s: %w", ErrStorage, s.path, err)
			}
		}
	}
	if len(segs) == 0 {
		segs = []*segment{{first: 1, path: filepath.Join(l.dir, segName(1))}}
	}
	l.segs = segs
	s := segs[len(segs)-1]
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	l.active = f
	return nil
}

// noteFrame records in the index and history a frame appended to s at off.
func (l *diskLog) noteFrame(s *segment, f frame, off int64) {
	seq := f.seq()
	if (seq-s.first)%indexEvery == 0 {
		s.index = append(s.index, off)
	}
	if len(l.hist) == 0 || f.epoch() != l.lastEpoch {
		l.hist = append(l.hist, epochStart{epoch: f.epoch(), first: seq})
	}
	s.last, l.last, l.lastEpoch = seq, seq, f.epoch()
}

// errStopScan marks a frame that fails a check.
var errStopScan = errors.New("a frame fails its checks")

// scanFile reads the frames of a segment file in order, calling visit for
// each good one until visit returns false. It returns the offset just past
// the last good frame and, if it stopped before the end of the file, why.
func scanFile(path string, visit func(f frame, off int64) bool) (end int64, bad error, err error) {
	fh, err := os.Open(path)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer fh.Close()
	buf := make([]byte, 1<<20)
	var have int // bytes of buf filled
	var pos int  // parse position within buf
	var base int64
	eof := false
	fill := func(need int) error {
		if have-pos >= need || eof {
			return nil
		}
		copy(buf, buf[pos:have])
		have -= pos
		base += int64(pos)
		pos = 0
		if need > len(buf) {
			nb := make([]byte, need)
			copy(nb, buf[:have])
			buf = nb
		}
		for have < need && !eof {
			n, err := fh.Read(buf[have:])
			have += n
			if err == io.EOF {
				eof = true
			} else if err != nil {
				return fmt.Errorf("%w: read %s: %w", ErrStorage, path, err)
			}
		}
		return nil
	}
	for {
		if err := fill(frameHeader); err != nil {
			return base + int64(pos), nil, err
		}
		if have == pos {
			return base + int64(pos), nil, nil
		}
		if have-pos >= frameHeader {
			if n := frame(buf[pos:]).length(); n <= MaxRecordLimit {
				if err := fill(frameLen(n)); err != nil {
					return base + int64(pos), nil, err
				}
			}
		}
		f, size, perr := parseFrame(buf[pos:have], MaxRecordLimit)
		if perr != nil {
			return base + int64(pos), perr, nil
		}
		if !visit(f, base+int64(pos)) {
			return base + int64(pos), errStopScan, nil
		}
		pos += size
	}
}

// syncPath makes the file at path durable, or for a directory the files
// created and removed in it (fsync). A variable, so that a test can see
// what is synced.
var syncPath = fsyncPath

func fsyncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%w: sync %s: %w", ErrStorage, path, err)
	}
	return nil
}

// Last returns the sequence number and epoch of the last record written.
func (l *diskLog) Last() (seq, epoch uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last, l.lastEpoch
}

// First returns the sequence number of the first record kept.
func (l *diskLog) First() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.first
}

// Durable returns the sequence number up to which the log is on stable
// storage.
func (l *diskLog) Durable() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durable
}

// Err returns the error that broke the log, if one did.
func (l *diskLog) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// history returns a copy of the log's epoch history.
func (l *diskLog) history() []epochStart {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]epochStart(nil), l.hist...)
}

// append writes frames — whole, checked frames that continue the log — to
// the last segment, starting a new segment first if it is full. On a write
// error the segment is cut back to where it was, so a failed append leaves
// no partial frame; if even that fails, the log is broken until reopened.
func (l *diskLog) append(b []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if l.closed {
		return ErrClosed
	}
	seq, epoch := l.last+1, l.lastEpoch
	for off := 0; off < len(b); {
		f := frame(b[off:])
		if len(f) < frameHeader || f.size() > len(f) || f.seq() != seq || f.epoch() < epoch {
			return fmt.Errorf("rlog: internal error: append of frames that do not continue the log at %d", seq)
		}
		epoch = f.epoch()
		off += f.size()
		seq++
	}
	s := l.segs[len(l.segs)-1]
	if s.size > 0 && s.size+int64(len(b)) > l.opt.segmentBytes {
		if err := l.rotate(); err != nil {
			return err
		}
		s = l.segs[len(l.segs)-1]
	}
	var err error
	if h := l.opt.hooks; h != nil && h.writeError != nil {
		err = h.writeError(len(b))
	}
	if err == nil {
		_, err = l.active.WriteAt(b, s.size)
	}
	if err != nil {
		if terr := l.active.Truncate(s.size); terr != nil {
			l.err = fmt.Errorf("%w: %w; and cutting %s back failed: %w", ErrStorage, err, s.path, terr)
			return l.err
		}
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	for off := 0; off < len(b); {
		f := frame(b[off:])
		l.noteFrame(s, f, s.size+int64(off))
		off += f.size()
	}
	s.size += int64(len(b))
	return nil
}

// rotate starts a new segment; l.mu is held.
func (l *diskLog) rotate() error {
	s := &segment{first: l.last + 1, last: l.last, path: filepath.Join(l.dir, segName(l.last+1))}
	f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("%w: start segment %s: %w", ErrStorage, s.path, err)
	}
	l.pending = append(l.pending, l.active)
	l.active = f
	l.segs = append(l.segs, s)
	l.dirDirty = true
	for l.opt.retain > 0 && len(l.segs) > l.opt.retain {
		old := l.segs[0]
		old.closeReader()
		os.Remove(old.path)
		l.segs = l.segs[1:]
		l.first = l.segs[0].first
		for len(l.hist) > 1 && l.hist[1].first <= l.first {
			l.hist = l.hist[1:]
		}
		if len(l.hist) > 0 && l.hist[0].first < l.first {
			l.hist[0].first = l.first
		}
	}
	return nil
}

// requestSync asks the sync goroutine for an fsync of everything written.
func (l *diskLog) requestSync() {
	select {
	case l.syncReq <- struct{}{}:
	default:
	}
}

// subscribe returns a channel that receives a token whenever the durable
// sequence number advances, and a function to cancel.
func (l *diskLog) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	l.subs[ch] = struct{}{}
	l.mu.Unlock()
	return ch, func() {
		l.mu.Lock()
		delete(l.subs, ch)
		l.mu.Unlock()
	}
}

// notifyLocked wakes the subscribers; l.mu is held.
func (l *diskLog) notifyLocked() {
	for ch := range l.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (l *diskLog) syncLoop() {
	defer l.wg.Done()
	for {
		select {
		case <-l.syncReq:
			l.syncOnce()
		case <-l.quit:
			return
		}
	}
}

// syncOnce fsyncs everything written so far and publishes the new durable
// sequence number. An fsync failure breaks the log: what the page cache
// held is unknown afterwards, so it is not retried.
func (l *diskLog) syncOnce() {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	if l.err != nil || l.closed {
		l.mu.Unlock()
		return
	}
	target, files, dirty, f := l.last, l.pending, l.dirDirty, l.active
	l.pending, l.dirDirty = nil, false
	if target <= l.durable && len(files) == 0 && !dirty {
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	var err error
	if h := l.opt.hooks; h != nil && h.syncError != nil {
		err = h.syncError()
	}
	if !l.opt.noSync {
		for _, pf := range files {
			if err == nil {
				if e := pf.Sync(); e != nil {
					err = fmt.Errorf("%w: sync %s: %w", ErrStorage, pf.Name(), e)
				}
			}
		}
		if err == nil {
			if e := f.Sync(); e != nil {
				err = fmt.Errorf("%w: sync %s: %w", ErrStorage, f.Name(), e)
			}
		}
		if err == nil && dirty {
			err = syncPath(l.dir)
		}
	}
	for _, pf := range files {
		pf.Close()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if l.err == nil {
			l.err = err
		}
	} else if target > l.durable && target <= l.last {
		l.durable = target
	}
	l.notifyLocked()
}

// offsetOf returns the offset of record seq in s; l.mu is held.
func (l *diskLog) offsetOf(s *segment, seq uint64) (int64, error) {
	i := (seq - s.first) / indexEvery
	if i >= uint64(len(s.index)) {
		return 0, fmt.Errorf("rlog: internal error: no index entry for record %d", seq)
	}
	off, cur := s.index[i], s.first+i*indexEvery
	if cur == seq {
		return off, nil
	}
	rf, err := s.reader()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	var hdr [frameHeader]byte
	for ; cur < seq; cur++ {
		if _, err := rf.ReadAt(hdr[:], off); err != nil {
			return 0, fmt.Errorf("%w: read %s: %w", ErrStorage, s.path, err)
		}
		off += int64(frame(hdr[:]).size())
	}
	return off, nil
}

// segmentOf returns the segment holding seq; l.mu is held.
func (l *diskLog) segmentOf(seq uint64) *segment {
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].last >= seq })
	if i == len(l.segs) || l.segs[i].first > seq {
		return nil
	}
	return l.segs[i]
}

// read copies whole frames, starting with record seq, into dst — as many
// as fit, from one segment — and returns the bytes copied and the number
// of records. It checks every frame it returns. A record before the first
// one kept is ErrTooFarBehind; one after the last is nothing.
func (l *diskLog) read(seq uint64, dst []byte) (int, int, error) {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return 0, 0, l.err
	}
	if seq < l.first {
		first := l.first
		l.mu.Unlock()
		return 0, 0, fmt.Errorf("%w: record %d is needed, but the log keeps records from %d on", ErrTooFarBehind, seq, first)
	}
	if seq > l.last {
		l.mu.Unlock()
		return 0, 0, nil
	}
	s := l.segmentOf(seq)
	if s == nil {
		l.mu.Unlock()
		return 0, 0, fmt.Errorf("rlog: internal error: no segment holds record %d", seq)
	}
	off, err := l.offsetOf(s, seq)
	if err != nil {
		l.mu.Unlock()
		return 0, 0, err
	}
	rf, err := s.reader()
	if err != nil {
		l.mu.Unlock()
		return 0, 0, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	want := min(int64(len(dst)), s.size-off)
	l.mu.Unlock()
	n, err := rf.ReadAt(dst[:want], off)
	if err != nil && !(err == io.EOF && int64(n) == want) {
		return 0, 0, fmt.Errorf("%w: read %s: %w", ErrStorage, s.path, err)
	}
	pos, count := 0, 0
	for pos < n {
		f, size, perr := parseFrame(dst[pos:n], MaxRecordLimit)
		if perr == errFrameShort {
			break
		}
		if perr != nil || f.seq() != seq+uint64(count) {
			return 0, 0, fmt.Errorf("%w: record %d in %s fails its checks on reading", ErrCorrupt, seq+uint64(count), s.path)
		}
		pos += size
		count++
	}
	if count == 0 {
		return 0, 0, fmt.Errorf("rlog: internal error: record %d does not fit a buffer of %d bytes", seq, len(dst))
	}
	return pos, count, nil
}

// truncate drops every record after keep, durably: a receiver does this
// to a tail that diverges from its sender's log.
func (l *diskLog) truncate(keep uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if keep >= l.last {
		return nil
	}
	if keep+1 < l.first {
		return fmt.Errorf("%w: cannot keep records up to %d: the log starts at %d", ErrTooFarBehind, keep, l.first)
	}
	s := l.segmentOf(keep + 1)
	if s == nil {
		return fmt.Errorf("rlog: internal error: no segment holds record %d", keep+1)
	}
	off, err := l.offsetOf(s, keep+1)
	if err != nil {
		return err
	}
	k := 0
	for l.segs[k] != s {
		k++
	}
	for _, later := range l.segs[k+1:] {
		later.closeReader()
		if err := os.Remove(later.path); err != nil {
			l.err = fmt.Errorf("%w: remove %s: %w", ErrStorage, later.path, err)
			return l.err
		}
	}
	l.segs = l.segs[:k+1]
	if l.active != nil {
		l.pending = append(l.pending, l.active)
		l.active = nil
	}
	f, err := os.OpenFile(s.path, os.O_RDWR, 0o644)
	if err == nil {
		err = f.Truncate(off)
		if err == nil && !l.opt.noSync {
			err = f.Sync()
		}
	}
	if err == nil && !l.opt.noSync {
		err = syncPath(l.dir)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		l.err = fmt.Errorf("%w: truncate %s: %w", ErrStorage, s.path, err)
		return l.err
	}
	for _, pf := range l.pending {
		if err == nil && !l.opt.noSync {
			if e := pf.Sync(); e != nil {
				err = fmt.Errorf("%w: sync %s: %w", ErrStorage, pf.Name(), e)
			}
		}
		pf.Close()
	}
	l.pending = nil
	l.active = f
	if err != nil {
		l.err = err
		return err
	}
	s.size, s.last = off, keep
	if keep < s.first {
		s.index = s.index[:0]
	} else {
		s.index = s.index[:(keep-s.first)/indexEvery+1]
	}
	for len(l.hist) > 0 && l.hist[len(l.hist)-1].first > keep {
		l.hist = l.hist[:len(l.hist)-1]
	}
	l.last, l.lastEpoch = keep, 0
	if len(l.hist) > 0 {
		l.lastEpoch = l.hist[len(l.hist)-1].epoch
	}
	l.durable = keep
	return nil
}

// close stops the sync goroutine and closes the files. It does not sync:
// what was written but not synced is in the page cache, exactly as after
// a crash of the process.
func (l *diskLog) close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	close(l.quit)
	l.wg.Wait()
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closeFiles()
	return nil
}

func (l *diskLog) closeFiles() {
	for _, s := range l.segs {
		s.closeReader()
	}
	for _, pf := range l.pending {
		pf.Close()
	}
	l.pending = nil
	if l.active != nil {
		l.active.Close()
		l.active = nil
	}
	if l.lock != nil {
		l.lock.Close()
		l.lock = nil
	}
}

// epochAt returns the epoch of record seq according to hist (0 if seq
// precedes it).
func epochAt(hist []epochStart, seq uint64) uint64 {
	i := sort.Search(len(hist), func(i int) bool { return hist[i].first > seq })
	if i == 0 {
		return 0
	}
	return hist[i-1].epoch
}

// commonPrefix returns the last sequence number up to which two logs hold
// the same records, given their histories and last sequence numbers: the
// largest seq that both logs hold in the same epoch. Within one epoch only
// one primary assigns sequence numbers, and a member takes records from
// a sender only after cutting its log back to where the two agree, so two
// logs that hold a record of the same seq and epoch agree on every record
// up to it (the log matching property of Raft).
func commonPrefix(a []epochStart, aLast uint64, b []epochStart, bLast uint64) uint64 {
	var best uint64
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		switch {
		case a[i].epoch < b[j].epoch:
			i++
		case a[i].epoch > b[j].epoch:
			j++
		default:
			aEnd, bEnd := aLast, bLast
			if i+1 < len(a) {
				aEnd = a[i+1].first - 1
			}
			if j+1 < len(b) {
				bEnd = b[j+1].first - 1
			}
			lo, hi := max(a[i].first, b[j].first), min(aEnd, bEnd)
			if lo <= hi {
				best = max(best, hi)
			}
			i++
			j++
		}
	}
	return best
}

// ScanResult describes a log that ScanDir read.
type ScanResult struct {
	// First and Last are the sequence numbers of the first and last good
	// records (Last is First-1 for an empty log).
	First, Last uint64
	// Segments is the number of segment files.
	Segments int
	// Torn is how many bytes follow the last good record of the last
	// segment: a torn tail, which the member truncates when it starts.
	Torn int64
}

// ScanDir reads the log in a member's data directory without changing it
// — the member may be running — and calls fn for each record from seq
// from on, in order, until fn returns an error (which ScanDir returns).
// rec.Data is valid only during the call. Every record is checked:
// checksum, consecutive sequence numbers, epochs that never decrease. A
// bad record in the last segment ends the scan (it is a torn tail, or a
// record being written); anywhere else it is ErrCorrupt.
func ScanDir(dir string, from uint64, fn func(rec Record) error) (ScanResult, error) {
	segs, err := segmentFiles(dir)
	if err != nil {
		return ScanResult{}, err
	}
	res := ScanResult{First: 1, Segments: len(segs)}
	if len(segs) > 0 {
		res.First = segs[0].first
	}
	res.Last = res.First - 1
	var lastEpoch uint64
	var ferr error
	for i, s := range segs {
		if s.first != res.Last+1 {
			return res, fmt.Errorf("%w: segment %s starts at record %d, but the one before ends at %d", ErrCorrupt, filepath.Base(s.path), s.first, res.Last)
		}
		end, bad, err := scanFile(s.path, func(f frame, off int64) bool {
			if f.seq() != res.Last+1 || f.epoch() < lastEpoch || f.epoch() == 0 {
				return false
			}
			res.Last, lastEpoch = f.seq(), f.epoch()
			if f.seq() >= from && ferr == nil {
				ferr = fn(f.record())
			}
			return ferr == nil
		})
		if err != nil {
			return res, err
		}
		if ferr != nil {
			return res, ferr
		}
		if bad != nil {
			if i != len(segs)-1 {
				return res, fmt.Errorf("%w: segment %s: %v at offset %d, and segments follow it", ErrCorrupt, filepath.Base(s.path), bad, end)
			}
			if fi, err := os.Stat(s.path); err == nil {
				res.Torn = fi.Size() - end
			}
		}
	}
	return res, nil
}
