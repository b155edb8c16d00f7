#include "textflag.h"

// ctramp calls a C function with up to six integer arguments, on the
// system stack where runtime.cgocall runs it: DI points to a cargs
// (fn, a1..a6, r1). It keeps the System V ABI: the stack 16-byte aligned
// at the call, BX (callee-saved) holding the cargs pointer across it.
TEXT ctramp<>(SB), NOSPLIT|NOFRAME, $0-0
	PUSHQ BP
	MOVQ  SP, BP
	PUSHQ BX
	SUBQ  $8, SP
	MOVQ  DI, BX
	MOVQ  8(BX), DI
	MOVQ  16(BX), SI
	MOVQ  24(BX), DX
	MOVQ  32(BX), CX
	MOVQ  40(BX), R8
	MOVQ  48(BX), R9
	MOVQ  0(BX), R10
	XORL  AX, AX
	CALL  R10
	MOVQ  AX, 56(BX)
	ADDQ  $8, SP
	POPQ  BX
	POPQ  BP
	RET

GLOBL ·ctrampPC(SB), NOPTR|RODATA, $8
DATA ·ctrampPC(SB)/8, $ctramp<>(SB)

// func ccallOn(a *cargs, stack uintptr)
//
// ccallOn calls the C function of a with its first three arguments on
// the C stack whose 16-byte aligned top is stack, from the goroutine
// itself: no system stack, no syscall state. BX (the cargs) and R12 (the
// goroutine's SP) are callee-saved in the System V ABI, so they survive
// the call. Being assembly, it is never preempted asynchronously; a
// signal is handled on the signal stack. The ABI wrapper restores the g
// register and X15 on the way back to Go. AL is left as it is: the data
// path's functions are not variadic, so they do not read it.
TEXT ·ccallOn(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ a+0(FP), BX
	MOVQ stack+8(FP), AX
	MOVQ SP, R12
	MOVQ AX, SP
	MOVQ 8(BX), DI
	MOVQ 16(BX), SI
	MOVQ 24(BX), DX
	MOVQ 0(BX), R10
	CALL R10
	MOVQ R12, SP
	MOVQ AX, 56(BX)
	RET
