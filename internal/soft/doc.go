// Package soft is the core that goverbs' software providers (loop, shm and
// iwarp) share: the in-memory completion ring of a CQ, the shared receive
// queue over internal/recvq, and the transport-independent skeleton of a
// QP (the Modify switch, PostRecv, the flush of posted receives). Each
// provider keeps only its transport, reached through hooks (QPHooks).
//
// The types here do no locking of their own unless their doc says so:
// the provider serialises them with the lock that guards the object.
package soft
