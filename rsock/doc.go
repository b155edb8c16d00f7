// Package rsock is a byte stream over RDMA that behaves as a net.Conn,
// with a net.Listener to accept it, so that Go code written for package
// net (net/http, gRPC, database drivers) runs on any goverbs provider
// unchanged. It follows librdmacm's rsocket and SMC-R (RFC 7609): each
// side advertises a receive ring in registered memory, the sender puts
// the bytes into the peer's ring with RDMA Writes, and small control
// messages announce the bytes and return the credits.
//
// Addresses are those of package cm: loop://name, shm:///path.sock,
// shm://@name, tcp://host:port. Import the provider that serves the
// scheme.
//
//	l, err := rsock.Listen("shm://@app")
//	...
//	c, err := rsock.Dial(ctx, "shm://@app")
//
// # Behaviour
//
// Read and Write park their goroutine while they wait, after polling
// for Config.Spin (longer on a connection whose peer has recently
// answered a little later than that; not at all while as many waits of
// the process spin as GOMAXPROCS), on the completion queue's
// notification channel
// (verbs.CQ.ReqNotify and Notify): an idle connection costs no CPU. One
// waiting call at a time polls the connection's completion queue; the
// other waits for it to hand over. On tcp0 a spinning wait also polls,
// in their stead, the process's connections that parked within the last
// millisecond: their wake-up comes through Go's network poller, which
// the scheduler consults only once it has nothing else to run.
// Deadlines apply to blocked calls and fail them with
// os.ErrDeadlineExceeded; every error is a *net.OpError.
// CloseWrite ends the sending half; Close ends the stream (the peer
// reads io.EOF after the last bytes) and releases the connection's
// queues and memory before it returns. A peer that goes away without
// ending its stream makes the next Read, after the bytes it sent, and
// the next Write fail with ErrReset; a peer that breaks the protocol
// is disconnected, and the connection's calls fail with ErrProtocol; a
// connection whose own device refuses an operation (a work request, the
// arming of its completion queue) is dropped, and its calls fail with
// ErrAborted, which wraps the device's error.
// Nothing a peer sends makes this side touch memory outside the
// connection's own ring, and nothing it fails to send blocks a call
// past its deadline.
//
// # Wire layout
//
// Connection setup carries a hello in each side's private data (28
// bytes, big-endian):
//
//	offset  size  field
//	0       4     magic "RSK1"
//	4       1     version, 1
//	5       1     flags: bit 0, the sender takes control messages as
//	              immediate data (otherwise as Sends); bit 1, the
//	              sender's receives hold 128 bytes and take inline
//	              data messages
//	6       2     reserved, 0
//	8       8     ring address
//	16      4     ring rkey (remote write only)
//	20      4     ring size in bytes (MinRingSize to MaxRingSize)
//	24      4     receives posted for control messages (2 to 63)
//
// Ring addressing: byte n of a stream (counting from 0) goes to offset
// n mod size of the receiver's ring. A sender may have at most size
// bytes in the ring that the receiver has not freed; it RDMA-Writes a
// run of bytes that does not wrap, then announces it.
//
// Control messages are 4 bytes:
//
//	offset  size  field
//	0       1     bits 7-6: op; bits 5-0: acks, receives the sender
//	              has posted again since its last message
//	1       3     count, big-endian
//
// with ops 0 credit (count ring bytes the sender freed; 0 is a message
// that only carries acks), 1 data (count bytes were written into the
// receiver's ring, just before the message), 2 end of stream (count 0).
// A control message travels as the immediate data of the RDMA Write with
// immediate that carries the data (a zero-length one when there is none),
// when the receiver's hello asks for that and the sender's device has
// immediate data (verbs.CapImmData) and is not iWARP; otherwise as a
// 4-byte inline Send after a plain RDMA Write, as rsocket does on iWARP.
// (On iWARP a Write with immediate is two frames, like a Write and a
// Send, and a control message alone is two frames where a Send is one.)
// A receiver takes both forms whatever its hello asked for.
//
// Inline data: when the receiver's hello sets bit 1 and control messages
// go as Sends, a data message of at most 124 bytes may carry its bytes
// itself, in place of the RDMA Write before it: its Send is the 4-byte
// control message followed by the count bytes, and the receiver copies
// them into its ring where the Write would have put them. On iWARP that
// is one frame per small write instead of two. A side sets bit 1 when it
// does not ask for immediate data.
//
// Each message consumes one of the receiver's posted receives, which it
// posts again at once and acknowledges in the acks of its next message;
// a sender spends its last credit only on a credit message or its end of
// stream, never on data, so credits always flow back. A receiver frees
// ring bytes to the sender once half the ring has been read, and
// acknowledges receives once half are owed.
//
// A receiver checks each message against the credits it gave: data past
// them, a count or op out of range, acks beyond its receives, a
// completion it did not ask for, inline bytes where it did not offer to
// take them or that their data message's count does not name — each ends that connection with
// ErrProtocol. Each connection has a protection domain of its own, whose
// one remotely accessible region is the ring, registered for remote
// write alone: a peer that writes anywhere else, with this connection's
// key or another's, fails at its own side.
//
// Large writes: a Write of at least Config.ZeroCopyMin bytes (64 KiB by
// default; 256 KiB on iWARP, where Write then waits for the peer's
// confirmation) is not copied. Its buffer is registered for local access
// alone, and the RDMA Writes into the peer's ring read it there; the last
// of them is signaled, and Write returns once it has completed, so the
// caller may reuse the buffer at once. The registration is kept for the
// next Write of the same buffer, as a stream's writes usually reuse one,
// until a Write of another buffer or Close. A large Write that stops
// before its end returns, like one that ends, once the device has read
// what it posted: while a write deadline is set, the last data message
// of each post is signaled too, so that a Write whose deadline passes
// while it waits for the reader knows whether the device is done. A
// large Write whose deadline passes, or whose connection is closed,
// before the device has read its buffer ends the connection (the device
// must not read the buffer after Write returned), whose calls then fail
// with ErrAborted. The wire is the same either way: the peer sees the
// same RDMA Writes into its ring, with the same control messages. rsock
// does not place bytes into the reader's own buffer (rsocket and SMC-R
// do not either: the receiver's ring is the only memory a peer writes).
//
// Memory: each end registers its ring (Config.RingSize: 256 KiB by
// default, 2 MiB on iWARP devices), a staging copy
// of the peer's ring (Writes below Config.ZeroCopyMin are copied there and
// written from there), control buffers (132 bytes; 4,224 where its
// receives take inline data, as on iWARP), and the buffer of its last
// zero-copy Write; Conn.RegisteredBytes reports the first three.
// A device context is shared by the process's connections on a device, as
// many as its regions allow (four a connection, within the device's
// MaxMR: 64 on shm0); more connections open further contexts.
//
// Scale: on shm0 an end holds about nine file descriptors (its socket,
// shared segments, and the sockets its CQ and the peer's are notified
// through), so a process that keeps many connections
// needs its descriptor limit raised to match; a listener accepts at most
// Config.MaxConns at once.
package rsock
