// Package soft is the core that goverbs' software providers (loop, shm and
// iwarp) share, and the toolkit every provider, ibverbs included, builds
// on; verbs/driver holds only the contract.
//
// The core: the in-memory completion ring of a CQ (CQ), the shared
// receive queue over internal/recvq (SRQ), and the transport-independent
// skeleton of a QP (QP, Modify, PostRecv, PostSend, FlushRecvs), which
// reaches the transport through QPHooks; a provider keeps only its
// transport. The toolkit: a context's asynchronous event queue
// (EventQueue), a CQ's notification arming (Arm), the transport-free
// parts of QP and SRQ Query and Modify (QueryQP, Transition, SRQLimit,
// CheckQPInit), the states that take work requests (PostSendStateErr,
// PostRecvStateErr), the moves by which a connection manager connects a
// QP (ConnectRC), and the bookkeeping of creation and release (Admit,
// Release, Open, Own, QPNumbers).
//
// The types here do no locking of their own unless their doc says so:
// the provider serialises them with the lock that guards the object.
package soft
