package driver

import "fmt"

// CheckSendWR validates a send work request against a QP's capacities as
// every provider must at post time: a known opcode, no more SGEs than
// MaxSendSGE, an 8-byte result buffer for atomics, and an inline payload
// no longer than MaxInlineData on an opcode that sends local data. Memory
// window opcodes are refused with ErrUnsupported when mw is false.
func CheckSendWR(wr *SendWR, cap *QPCap, mw bool) error {
	switch {
	case !wr.Opcode.Valid():
		return fmt.Errorf("%w: unknown opcode %d", ErrInvalidArg, wr.Opcode)
	case !mw && (wr.Opcode == OpLocalInv || wr.Opcode == OpBindMW || wr.Opcode == OpSendWithInv):
		return fmt.Errorf("%w: %v needs memory windows", ErrUnsupported, wr.Opcode)
	case (wr.Opcode == OpBindMW || wr.Opcode == OpLocalInv) && len(wr.SGList) != 0:
		return fmt.Errorf("%w: %v takes no SGEs", ErrInvalidArg, wr.Opcode)
	case len(wr.SGList) > int(cap.MaxSendSGE):
		return fmt.Errorf("%w: %d SGEs, the QP takes %d", ErrInvalidArg, len(wr.SGList), cap.MaxSendSGE)
	case wr.Opcode.IsAtomic() && SGListLen(wr.SGList) != 8:
		return fmt.Errorf("%w: an atomic's local buffer must be exactly 8 bytes", ErrInvalidArg)
	}
	if wr.Flags&SendInline != 0 {
		if !wr.Opcode.ReadsLocal() {
			return fmt.Errorf("%w: %v cannot be inline", ErrInvalidArg, wr.Opcode)
		}
		if n := SGListLen(wr.SGList); n > uint64(cap.MaxInlineData) {
			return fmt.Errorf("%w: %d inline bytes, the QP takes %d", ErrInvalidArg, n, cap.MaxInlineData)
		}
	}
	return nil
}

// CheckRecvWR validates a receive work request against the SGE limit of
// its queue.
func CheckRecvWR(wr *RecvWR, maxSGE uint32) error {
	if len(wr.SGList) > int(maxSGE) {
		return recvSGEsErr(len(wr.SGList), maxSGE)
	}
	return nil
}

// recvSGEsErr is CheckRecvWR's error, apart so that CheckRecvWR is
// inlined in the posts.
func recvSGEsErr(n int, maxSGE uint32) error {
	return fmt.Errorf("%w: %d SGEs, the queue takes %d", ErrInvalidArg, n, maxSGE)
}
