package rlog

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkAppend measures appends through a three-member log on shm, in
// one process, for each mode and record size (goverbs log bench does it
// with a process per member).
func BenchmarkAppend(b *testing.B) {
	for _, size := range []int{64, 4096, 65536} {
		for _, mode := range []Mode{ModeSend, ModeWrite} {
			b.Run(fmt.Sprintf("%s/%d", mode, size), func(b *testing.B) {
				cfg := Config{Secret: testSecret, MaxRecord: max(size, 4096), NoSync: true}
				cfg.Mode = mode
				c := newCluster(b, "shm", 3, cfg)
				c.start(1, false)
				c.start(2, false)
				c.start(0, true)
				cl := c.dial()
				rec := make([]byte, size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				var wg sync.WaitGroup
				work := make(chan struct{}, b.N)
				for range b.N {
					work <- struct{}{}
				}
				close(work)
				for range 128 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range work {
							if _, err := cl.Append(context.Background(), rec); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}
