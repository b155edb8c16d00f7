package kv

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkGet measures one-sided GETs on shm, inline and from the heap,
// through the client's windows and, as on a device without memory
// windows, through the regions' own keys.
func BenchmarkGet(b *testing.B) {
	for _, keys := range []string{"windows", "regionkeys"} {
		for _, size := range []int{64, 512, 4096} {
			b.Run(fmt.Sprintf("%s/%d", keys, size), func(b *testing.B) {
				benchGet(b, size, keys == "regionkeys")
			})
		}
	}
}

// benchGet measures GETs of a value of size bytes on shm.
func benchGet(b *testing.B, size int, noWindows bool) {
	a := addrs()["shm"]()
	startServer(b, a, Config{Buckets: 1024, MaxValue: 8192, HeapBytes: 8 << 20, noWindows: noWindows})
	c := dial(b, a)
	if c.windowed == noWindows {
		b.Fatalf("the client reads through windows: %v", c.windowed)
	}
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

// BenchmarkDial measures a client's connection on shm, handshake and
// grant included: with windows, the server allocates and binds a window
// per heap region and one over the index for each client.
func BenchmarkDial(b *testing.B) {
	for _, keys := range []string{"windows", "regionkeys"} {
		b.Run(keys, func(b *testing.B) {
			a := addrs()["shm"]()
			// A closed client stops counting once the server has dropped
			// it, which may come after the next Dial.
			startServer(b, a, Config{Buckets: 1024, MaxValue: 8192, HeapBytes: 8 << 20, MaxClientsPerPeer: maxClients, noWindows: keys == "regionkeys"})
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := Dial(ctx, a)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}
