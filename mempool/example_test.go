package mempool_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/goverbs/goverbs/mempool"
	"github.com/goverbs/goverbs/verbs"

	_ "github.com/goverbs/goverbs/provider/loop" // device loop0
)

// A pool registers its regions once, at start; Get and Put then hand out
// and take back registered buffers with no registration and no
// allocation, and each buffer names its own scatter/gather element and
// remote address for work requests.
func Example() {
	dev, err := verbs.Open("loop0")
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	defer pd.Dealloc()
	pool, err := mempool.New(pd, mempool.Config{
		Classes: []mempool.Class{{Size: 64, Count: 2}, {Size: 4096, Count: 1}},
		Access:  verbs.AccessLocalWrite | verbs.AccessRemoteRead,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	small, _ := pool.Get(10)  // from the 64-byte class
	large, _ := pool.Get(100) // the only 4096-byte buffer
	_, err = pool.Get(1000)   // none left that fits
	fmt.Println(small.Len(), large.Len(), errors.Is(err, mempool.ErrExhausted))

	n := copy(large.Bytes(), "Hello, RDMA!")
	sge := large.SGE(n) // what a Send or RDMA Write of it names
	fmt.Println(sge.Length, sge.LKey == large.MR().LKey(), large.Addr() == sge.Addr)

	pool.Put(large)
	fmt.Println(errors.Is(pool.Put(large), mempool.ErrNotInUse)) // a second Put is refused
	for _, s := range pool.Stats() {
		fmt.Printf("%d B: %d of %d free\n", s.Size, s.Free, s.Count)
	}
	pool.Put(small)
	// Output:
	// 64 4096 true
	// 12 true true
	// true
	// 64 B: 1 of 2 free
	// 4096 B: 1 of 1 free
}
