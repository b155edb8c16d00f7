// Package rlog is a replicated append-only log over RDMA, built the way
// the case study of the seed document's section 4.5 ends: control
// messages over send/recv keep the order; record payloads go by RDMA Write
// into double-buffered regions on the replicas, framed with sequence
// numbers and checksums; and a record is acknowledged only once a quorum
// of members holds it durably.
//
// # Members
//
// A log is kept by a fixed set of members (Config.Members), one of which
// is the primary; the others are replicas. Every member keeps the whole
// log in segment files in its data directory, and listens at its own
// address (loop://, shm:// or tcp://, through package cm).
//
// Clients (Dial, Client.Append) send records to the primary over
// send/recv. The primary frames each record (sequence number, epoch,
// length, CRC-32C), writes it to its own log, and pushes it to every
// replica: an RDMA Write of a batch of frames into one of the replica's
// buffers, then a Send (DATA) that names the buffer, the records and their
// sequence numbers. RC ordering delivers the Send only after the Write's
// data is visible, so the replica learns of a batch from a message, never
// by watching its memory. The replica checks every frame — checksum, the
// sequence number it expects next, the epoch — copies the good ones to
// its log, frees the buffer (STATUS), fsyncs in groups and reports what is
// durable (STATUS). A replica has Config.Buffers buffers (two by default:
// double buffering, the primary fills one while the replica drains the
// other). A bad frame is never applied: the replica answers with a NACK
// naming the record it expects, and the primary sends again from there.
//
// An append is acknowledged when a quorum (a majority of the members by
// default, the primary included) holds its records durably.
//
// # Recovery and promotion
//
// A member that restarts checks its log and truncates a torn tail. A
// replica that (re)connects says how far its log goes and what epochs it
// holds (HELLO); the primary finds where the two logs agree, tells the
// replica to cut back to there (START), and streams what is missing,
// from memory or from its own segment files.
//
// Starting a member as primary (Config.Primary) is a promotion, and it is
// explicit; there is no automatic election. The member picks an epoch
// higher than any it has seen and asks every member to promise it
// (fence): a member that promises refuses records from any primary of an
// older epoch, which fences the old primary. With promises from a
// majority, the member compares logs — by epoch of the last record, then
// length — and, if one of that majority is ahead, fetches the missing
// records from it before it serves. Every acknowledged record is on a
// majority, and any two majorities share a member, so the new primary
// starts with every acknowledged record. As in Raft, the primary counts
// a quorum only for records of its own epoch.
//
// # Modes
//
// ModeWrite is the design above. ModeSend carries the frames in the Sends
// themselves, into receive buffers the replica posted: message semantics
// only, for comparison (goverbs log bench).
//
// Nothing is sent to a peer that has no receive posted for it: receives
// are posted before connections are accepted or dialled, and credits
// bound every stream of messages, as iWARP (which has no RNR retry)
// requires.
//
// # Members, clients and trust
//
// The members are the addresses of Config.Members, and every member
// holds the same secret (Config.Secret; goverbs log reads it from
// --secret-file). When one member connects to another — to replicate,
// to fetch, to fence — each proves to the other that it holds the
// secret, by an HMAC-SHA256 challenge and response over fresh random
// nonces from both ends and the connection's kind, epoch and members, so
// that a response made for one connection proves nothing on another.
// Until the dialer has proved itself, the member it reached tells it
// nothing (no member id, epoch or log length), promises no epoch, steps
// down from no role and registers no ring for it; a peer that fails, or
// says nothing for a second, is disconnected, and at most 8 such peers
// are heard at once (more are refused until one is done). A dialer
// likewise sends nothing of its own — its proof, its ring — to a peer
// that has not proved itself, and counts no promise of it toward a
// majority.
//
// The handshake proves who is at each end of a connection when it is
// made; the messages that follow are not signed. On a network where an
// attacker can inject into an established connection (tcp0 without a
// protected network), the log is no safer than that network.
//
// Clients hold no secret. Anyone who can reach the primary may append
// records (MaxClients of them at once), and learns what its appends
// need: the primary's limits (request size, MaxRecord, depth), the
// sequence numbers of its own records (and so how long the log is), and
// whether the member it reached is the primary. It learns no cluster id,
// member id or epoch, and cannot fence, replicate or fetch. Reading the
// log is done from a member's data directory (ScanDir, goverbs log
// tail), not over the network.
package rlog

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"
)

// Errors of the log; test them with errors.Is.
var (
	// ErrTooLarge: a record is larger than the log's MaxRecord.
	ErrTooLarge = errors.New("rlog: record larger than the log's MaxRecord")
	// ErrNotPrimary: the member reached is not the primary.
	ErrNotPrimary = errors.New("rlog: not the primary")
	// ErrFenced: a member of a higher epoch has been promoted; this
	// primary (or its epoch) is obsolete.
	ErrFenced = errors.New("rlog: fenced by a promotion to a higher epoch")
	// ErrStorage: writing or syncing a segment file failed (for example,
	// the disk is full).
	ErrStorage = errors.New("rlog: storage error")
	// ErrCorrupt: a segment file fails its checks where a crash cannot
	// explain it.
	ErrCorrupt = errors.New("rlog: corrupt log")
	// ErrTooFarBehind: a replica needs records that the sender no longer
	// keeps (Config.RetainSegments); copy a member's data directory to it.
	ErrTooFarBehind = errors.New("rlog: too far behind: the records needed are no longer kept")
	// ErrNoQuorum: a promotion could not reach a majority of members.
	ErrNoQuorum = errors.New("rlog: cannot reach a majority of the members")
	// ErrUnavailable: no primary could be reached, or a peer cannot serve.
	ErrUnavailable = errors.New("rlog: unavailable")
	// ErrOutcomeUnknown: the connection to the primary broke after the
	// append was sent and before it was acknowledged; the record may or
	// may not be in the log.
	ErrOutcomeUnknown = errors.New("rlog: connection lost before the append was acknowledged: the record may or may not be in the log")
	// ErrProtocol: a peer sent a malformed or unexpected message.
	ErrProtocol = errors.New("rlog: protocol violation")
	// ErrCluster: the peer is configured with other members.
	ErrCluster = errors.New("rlog: the peer belongs to another cluster (its member list differs)")
	// ErrAuth: a peer did not prove that it is a member of the log (it
	// does not hold Config.Secret); check that every member is given the
	// same secret.
	ErrAuth = errors.New("rlog: the peer did not prove that it is a member (check that every member has the same secret)")
	// ErrClosed: the member or client is closed.
	ErrClosed = errors.New("rlog: closed")
)

// Mode is how the primary moves records to the replicas.
type Mode uint8

const (
	// ModeWrite pushes frames with RDMA Write into the replica's buffers
	// and announces each batch with a Send.
	ModeWrite Mode = iota
	// ModeSend carries the frames in the Sends themselves.
	ModeSend
)

// String returns "write" or "send", as ParseMode takes them.
func (m Mode) String() string {
	if m == ModeSend {
		return "send"
	}
	return "write"
}

// ParseMode parses "write" or "send".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "write":
		return ModeWrite, nil
	case "send":
		return ModeSend, nil
	}
	return 0, fmt.Errorf("rlog: unknown mode %q: use write or send", s)
}

// Config configures a member. Zero fields take the defaults.
type Config struct {
	// Dir is the member's data directory: its segment files and state.
	Dir string
	// Listen is the member's own address; it must be one of Members.
	Listen string
	// Members are the addresses of every member, this one included.
	Members []string
	// Secret is the cluster's secret, the same on every member and at
	// least MinSecret bytes (draw it from a random source). A member
	// proves with it that it belongs, and checks that its peers do:
	// replication, fetches and fences come only from and go only to
	// members that hold it. Clients need none (see Dial).
	Secret []byte
	// Primary starts the member as the primary: it first promotes itself
	// (see the package documentation), which needs a majority of members.
	Primary bool
	// Quorum is how many members, the primary included, must hold a
	// record durably before it is acknowledged (default and minimum: a
	// majority).
	Quorum int
	// Mode is how a primary moves records to replicas (default ModeWrite).
	Mode Mode
	// Buffers is how many buffers the primary uses in each replica
	// (default 2: double buffering), and BufferSize their size (default
	// 1 MiB); a batch of records fills at most one buffer.
	Buffers    int
	BufferSize int
	// MaxRecord is the largest record (default 256 KiB); its frame must
	// fit in a buffer.
	MaxRecord int
	// MaxBatch caps the records in one batch (0: as many as fit).
	MaxBatch int
	// CacheBuffers is how many buffers of recent records the primary
	// keeps in registered memory to push from (default 8); older records
	// are read from its segment files.
	CacheBuffers int
	// SegmentBytes is the size at which a segment file is closed and a
	// new one started (default 64 MiB).
	SegmentBytes int64
	// RetainSegments, if positive, is how many segment files a member
	// keeps; older ones are deleted, and a replica that needs their
	// records gets ErrTooFarBehind.
	RetainSegments int
	// ClientDepth is how many requests a client may have outstanding
	// (default 16), and MaxClients how many clients the primary serves
	// (default 64).
	ClientDepth int
	MaxClients  int
	// NoSync skips fsync (for measurements on a machine whose disk would
	// dominate them); acknowledged then means written, not durable.
	NoSync bool
	// DialTimeout bounds each connection attempt (default 2 s), and
	// PromoteTimeout the whole promotion (default 30 s).
	DialTimeout    time.Duration
	PromoteTimeout time.Duration
	// Logf, if set, receives the member's diagnostics: replicas
	// connecting and leaving, errors, promotions.
	Logf func(format string, args ...any)

	hooks *hooks
}

// hooks inject faults in tests.
type hooks struct {
	// writeError, if set, is called before every segment write of n
	// bytes; an error it returns is the write's error.
	writeError func(n int) error
	// syncError, if set, is called before every fsync.
	syncError func() error
	// corrupt, if set, is called by a sender for every batch; if it
	// returns true, the sender flips a byte of the batch's first frame
	// before pushing it.
	corrupt func(first uint64) bool
	// authTimeout, if not zero, replaces authTimeout.
	authTimeout time.Duration
}

const (
	defaultBufferSize = 1 << 20
	defaultMaxRecord  = 256 << 10
	maxBuffers        = 64
	maxBufferSize     = 64 << 20
)

func (c *Config) defaults() error {
	if c.Dir == "" {
		return errors.New("rlog: Config.Dir is empty")
	}
	if len(c.Members) == 0 {
		return errors.New("rlog: Config.Members is empty")
	}
	if len(c.Secret) < MinSecret {
		return fmt.Errorf("rlog: Config.Secret has %d bytes: give every member the same secret of at least %d random bytes", len(c.Secret), MinSecret)
	}
	if !slices.Contains(c.Members, c.Listen) {
		return fmt.Errorf("rlog: the member's address %q is not one of Members %q", c.Listen, c.Members)
	}
	for i, a := range c.Members {
		if slices.Contains(c.Members[i+1:], a) {
			return fmt.Errorf("rlog: member %q is listed twice", a)
		}
	}
	majority := len(c.Members)/2 + 1
	if c.Quorum == 0 {
		c.Quorum = majority
	}
	if c.Quorum < majority || c.Quorum > len(c.Members) {
		return fmt.Errorf("rlog: quorum %d of %d members: it must be from a majority (%d) to all", c.Quorum, len(c.Members), majority)
	}
	if c.Buffers == 0 {
		c.Buffers = 2
	}
	if c.BufferSize == 0 {
		c.BufferSize = defaultBufferSize
	}
	if c.MaxRecord == 0 {
		c.MaxRecord = min(defaultMaxRecord, c.BufferSize-frameHeader)
	}
	if c.Buffers < 1 || c.Buffers > maxBuffers {
		return fmt.Errorf("rlog: %d buffers: use 1 to %d", c.Buffers, maxBuffers)
	}
	if c.BufferSize < 4096 || c.BufferSize > maxBufferSize || c.BufferSize%frameAlign != 0 {
		return fmt.Errorf("rlog: buffer size %d: use a multiple of %d from 4096 to %d", c.BufferSize, frameAlign, maxBufferSize)
	}
	if c.MaxRecord < 1 || c.MaxRecord > MaxRecordLimit || frameLen(c.MaxRecord) > c.BufferSize {
		return fmt.Errorf("rlog: MaxRecord %d: a record's frame (%d bytes) must fit in a buffer of %d bytes, and records are at most %d bytes",
			c.MaxRecord, frameLen(c.MaxRecord), c.BufferSize, MaxRecordLimit)
	}
	if c.CacheBuffers == 0 {
		c.CacheBuffers = 8
	}
	if c.CacheBuffers < 2 {
		return fmt.Errorf("rlog: %d cache buffers: use at least 2", c.CacheBuffers)
	}
	// A request's frames take at most 8 times its bytes (a 0-byte record:
	// 4 bytes in a request, 24 in a frame, 32 padded); they must fit in
	// the cache's chunks other than the one being filled.
	if (c.CacheBuffers-1)*c.BufferSize < 8*c.clientMsgSize() {
		return fmt.Errorf("rlog: %d cache buffers of %d bytes are too few for records of up to %d bytes: use at least %d",
			c.CacheBuffers, c.BufferSize, c.MaxRecord, 8*c.clientMsgSize()/c.BufferSize+2)
	}
	if c.ClientDepth == 0 {
		c.ClientDepth = 16
	}
	if c.ClientDepth < 1 || c.ClientDepth > 255 {
		return fmt.Errorf("rlog: client depth %d: use 1 to 255", c.ClientDepth)
	}
	if c.MaxClients == 0 {
		c.MaxClients = 64
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 2 * time.Second
	}
	if c.PromoteTimeout == 0 {
		c.PromoteTimeout = 30 * time.Second
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}

// clientMsgSize is the size of a client request buffer: one record of
// MaxRecord bytes fits, and small records share it; rounded up to a page.
func (c *Config) clientMsgSize() int { return (appendLen + 4 + c.MaxRecord + 4095) &^ 4095 }

// clusterID identifies the member list, so that members configured
// differently refuse each other.
func clusterID(members []string) uint64 {
	s := slices.Clone(members)
	slices.Sort(s)
	h := fnv.New64a()
	h.Write([]byte(strings.Join(s, "\n")))
	return h.Sum64() | 1
}
