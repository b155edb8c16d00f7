package soft

import "github.com/goverbs/goverbs/verbs/driver"

// CoreCaps are the capabilities every provider built on this package
// has: what its QP skeleton, receive queues, SRQ, CQ ring and send queue
// provide.
const CoreCaps = driver.CapSRQ | driver.CapImmData | driver.CapAtomics |
	driver.CapAckedCompletion | driver.CapModifyConnect | driver.CapRecvNoSGE | driver.CapSQD |
	driver.CapAtomicResultSGList | driver.CapQPErrorEvents | driver.CapMemoryWindows |
	driver.CapCommEstEvent

// Limits are what a provider's transport and resources bound, where
// providers differ.
type Limits struct {
	MaxMRSize      uint64
	MaxSGE         int // per WR, and per receive of an SRQ
	MaxQP          int
	MaxCQ          int
	MaxMR          int
	MaxPD          int
	MaxSRQ         int
	MaxPrivateData int
	Caps           driver.DeviceCaps // beyond CoreCaps
}

// MaxRdAtomic is the most Reads and atomics a QP has outstanding as a
// requester (ORD) or serves at once as a responder (IRD).
const MaxRdAtomic = 16

// The core's other limits: queue depths, inline data and message size.
const (
	maxQueueWR = 1 << 14
	maxCQE     = 1 << 20
	maxInline  = 1024
	maxMsgSize = 1 << 31
)

// DeviceAttr returns the attributes of device name on transport: the
// core's limits and capabilities with the provider's l.
func DeviceAttr(name, transport string, l Limits) driver.DeviceAttr {
	return driver.DeviceAttr{
		Name:            name,
		Transport:       transport,
		FWVersion:       "goverbs-" + transport + " 1",
		MaxMRSize:       l.MaxMRSize,
		MaxQP:           l.MaxQP,
		MaxQPWR:         maxQueueWR,
		MaxSGE:          l.MaxSGE,
		MaxCQ:           l.MaxCQ,
		MaxCQE:          maxCQE,
		MaxMR:           l.MaxMR,
		MaxPD:           l.MaxPD,
		MaxQPRdAtom:     MaxRdAtomic,
		MaxQPInitRdAtom: MaxRdAtomic,
		MaxSRQ:          l.MaxSRQ,
		MaxSRQWR:        maxQueueWR,
		MaxSRQSGE:       l.MaxSGE,
		MaxInlineData:   maxInline,
		MaxMsgSize:      maxMsgSize,
		MaxPrivateData:  l.MaxPrivateData,
		AtomicCap:       driver.AtomicGlob,
		Caps:            CoreCaps | l.Caps,
		PhysPortCnt:     1,
	}
}
