package kv_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/goverbs/goverbs/kv"

	_ "github.com/goverbs/goverbs/provider/loop" // device loop0, addresses loop://name
)

// A server holds the table in registered memory; a client stores a value
// with one Send to the server and reads it back with one-sided RDMA
// Reads of the index and the record, which the server's CPU takes no
// part in: no GET falls back to a request to the server, and one the
// client knows the record of is a single Read. The same code runs across
// processes at shm://@name and across hosts at tcp://host:port.
func Example() {
	srv, err := kv.Listen("loop://kv-example", kv.Config{Buckets: 1024, HeapBytes: 1 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := kv.Dial(ctx, srv.Addr())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if err := c.Put([]byte("greeting"), []byte("Hello, RDMA!")); err != nil {
		log.Fatal(err)
	}
	v, err := c.Get([]byte("greeting"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", v)

	// A value too large for its index slot lives in a record of the heap.
	long := strings.Repeat("RDMA ", 40)
	if err := c.Put([]byte("long"), []byte(long)); err != nil {
		log.Fatal(err)
	}
	for range 2 {
		v, err := c.Get([]byte("long"))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(len(v), "bytes, the same:", string(v) == long)
	}
	fmt.Println("GETs by RPC:", c.FallbackGets.Load(), "by one Read of a known record:", c.CachedGets.Load())
	if err := c.Delete([]byte("greeting")); err != nil {
		log.Fatal(err)
	}
	_, err = c.Get([]byte("greeting"))
	fmt.Println(err)
	// Output:
	// Hello, RDMA!
	// 200 bytes, the same: true
	// 200 bytes, the same: true
	// GETs by RPC: 0 by one Read of a known record: 2
	// kv: key not found
}
