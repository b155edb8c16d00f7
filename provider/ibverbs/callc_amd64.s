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
