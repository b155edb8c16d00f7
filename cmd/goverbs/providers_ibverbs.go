//go:build !noibverbs

package main

// The ibverbs provider: the kernel's RDMA devices (rxe0, siw0, mlx5_0, ...)
// through rdma-core, loaded at run time. It makes a CGO_ENABLED=0 goverbs
// dynamically linked against the C library; build with -tags noibverbs
// for a static binary without it.
import "github.com/goverbs/goverbs/provider/ibverbs"

func init() { noHardware = ibverbs.Available }
