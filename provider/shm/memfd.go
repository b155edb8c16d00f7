package shm

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// segment is a memfd mapped into this process. Segments this process
// creates are sealed against shrinking and growing before anyone else sees
// them, so that a peer's mapping can never be cut short under it (which
// would turn an access into SIGBUS); segments received from a peer are
// mapped only if the peer sealed them the same way.
type segment struct {
	fd     int
	mem    []byte
	shared *sharedMapping // a peer's segment: the mapping, shared
}

const sealsRequired = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

var pageSize = os.Getpagesize()

func roundPage(n int) int { return (n + pageSize - 1) &^ (pageSize - 1) }

// newSegment creates a sealed memfd of at least size bytes and maps it
// read-write. The memfd's mode is 0600: a process of another user handed
// a read-only descriptor of it cannot reopen it writable through /proc.
func newSegment(name string, size int) (*segment, error) {
	size = roundPage(max(size, 1))
	fd, err := unix.MemfdCreate("goverbs-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Fchmod(fd, 0o600); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("restrict memfd to its owner: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate memfd to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, sealsRequired); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seal memfd: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap memfd: %w", err)
	}
	return &segment{fd: fd, mem: mem}, nil
}

// maxPeerSegment is the largest peer segment mapped: a region's most
// (MaxMRSize), and room for its rounding.
const maxPeerSegment = 1<<36 + 1<<21

// mapPeerSegment maps a memfd received from a peer, after checking that it
// is sealed, at least minSize bytes long and at most maxPeerSegment.
// writable maps it read-write, else read-only. The fd is closed; the
// mapping keeps the memory. A memfd the process has mapped already, alike
// (the same file, as fstat tells it, and the same protection), is not
// mapped again: the segment shares that mapping (sharedMapping), so that
// the connections to one peer process share one mapping of each of its
// segments they reach (its CQ's, its regions'), not one each, which saves
// a mapping per connection and, for a requester going round many
// connections, a page in the TLB.
func mapPeerSegment(fd int, minSize int, writable bool) (*segment, error) {
	defer unix.Close(fd)
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("peer segment is not a memfd: %w", err)
	}
	if seals&sealsRequired != sealsRequired {
		return nil, fmt.Errorf("peer segment is not sealed (seals %#x)", seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat peer segment: %w", err)
	}
	if st.Size < int64(minSize) || st.Size <= 0 || st.Size > maxPeerSegment {
		return nil, fmt.Errorf("peer segment has %d bytes, expected at least %d", st.Size, minSize)
	}
	key := mappingKey{dev: uint64(st.Dev), ino: st.Ino, writable: writable}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if m := sharedMappings[key]; m != nil {
		m.refs++
		return &segment{fd: -1, mem: m.mem, shared: m}, nil
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap peer segment: %w", err)
	}
	m := &sharedMapping{key: key, mem: mem, refs: 1}
	sharedMappings[key] = m
	return &segment{fd: -1, mem: mem, shared: m}, nil
}

// A sharedMapping is a peer's memfd as this process maps it, with the
// number of segments that use it: unmapped when the last is closed. The
// memfd's file lives as long as the mapping, so its inode number, the
// key, is not reused meanwhile. (Sealed, the file keeps its size.)
type sharedMapping struct {
	key  mappingKey
	mem  []byte
	refs int // guarded by sharedMu
}

type mappingKey struct {
	dev, ino uint64
	writable bool
}

var (
	sharedMu       sync.Mutex
	sharedMappings = map[mappingKey]*sharedMapping{}
)

// release drops the segment's use of its shared mapping, unmapping it
// when no other segment uses it.
func (m *sharedMapping) release() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if m.refs--; m.refs == 0 {
		delete(sharedMappings, m.key)
		unix.Munmap(m.mem)
	}
}

// readOnlyFD returns a new descriptor of the segment's memfd opened
// read-only: a peer given it cannot map the memory writable.
func (s *segment) readOnlyFD() (int, error) {
	return unix.Open(fmt.Sprintf("/proc/self/fd/%d", s.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// close unmaps the segment (or leaves its shared mapping to the other
// segments that use it) and closes its memfd.
func (s *segment) close() {
	if s.shared != nil {
		s.shared.release()
		s.shared, s.mem = nil, nil
	}
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}
