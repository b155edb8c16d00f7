// Package cheader reports the sizes and field offsets of the C structures
// of <infiniband/verbs.h> and <rdma/rdma_cma.h> that provider/ibverbs
// declares in Go, as the C compiler lays them out. It is built only with
// cgo, and reports nothing when the headers (Debian: libibverbs-dev,
// librdmacm-dev) are not installed, so that a cgo build of the module does
// not need them; only provider/ibverbs' layout test uses it, and the
// provider itself needs neither.
package cheader
