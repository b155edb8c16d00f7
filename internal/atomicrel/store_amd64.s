//go:build amd64 && !race

#include "textflag.h"

// func storeUint64(p *atomic.Uint64, v uint64)
TEXT ·storeUint64(SB), NOSPLIT, $0-16
	MOVQ	p+0(FP), AX
	MOVQ	v+8(FP), BX
	MOVQ	BX, 0(AX)
	RET

// func storeUint32(p *atomic.Uint32, v uint32)
TEXT ·storeUint32(SB), NOSPLIT, $0-12
	MOVQ	p+0(FP), AX
	MOVL	v+8(FP), BX
	MOVL	BX, 0(AX)
	RET
