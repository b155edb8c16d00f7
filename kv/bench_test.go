package kv

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// BenchmarkGet measures one-sided GETs on shm, inline and from the heap.
func BenchmarkGet(b *testing.B) {
	for _, size := range []int{64, 512, 4096} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			a := addrs()["shm"]()
			startServer(b, a, Config{Buckets: 1024, MaxValue: 8192, HeapBytes: 8 << 20})
			c := dial(b, a)
			val := bytes.Repeat([]byte("v"), size)
			if err := c.Put([]byte("0123456789abcdef"), val); err != nil {
				b.Fatal(err)
			}
			dst := make([]byte, size)
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				if n, err := c.GetInto([]byte("0123456789abcdef"), dst); err != nil || n != size {
					b.Fatal(n, err)
				}
			}
		})
	}
}

// BenchmarkPut measures PUT RPCs on shm: out-of-place updates of one key,
// with the server's serving loop spinning between requests (the default)
// and sleeping on its CQ.
func BenchmarkPut(b *testing.B) {
	for _, spin := range []struct {
		name string
		d    time.Duration
	}{{"spin", 0}, {"sleep", -1}} {
		for _, size := range []int{64, 4096} {
			b.Run(fmt.Sprintf("%s/%d", spin.name, size), func(b *testing.B) {
				a := addrs()["shm"]()
				startServer(b, a, Config{Buckets: 1024, MaxValue: 8192, HeapBytes: 8 << 20, Spin: spin.d, Grace: time.Millisecond})
				c := dial(b, a)
				val := bytes.Repeat([]byte("v"), size)
				b.ReportAllocs()
				b.SetBytes(int64(size))
				for b.Loop() {
					if err := c.Put([]byte("0123456789abcdef"), val); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
