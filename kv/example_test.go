package kv_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/goverbs/goverbs/kv"

	_ "github.com/goverbs/goverbs/provider/loop" // device loop0, addresses loop://name
)

// A server holds the table in registered memory; a client stores a value
// with one Send to the server and reads it back with one-sided RDMA
// Reads of the index and the record, which the server's CPU takes no
// part in. The same code runs across processes at shm://@name and across
// hosts at tcp://host:port.
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
	if err := c.Delete([]byte("greeting")); err != nil {
		log.Fatal(err)
	}
	_, err = c.Get([]byte("greeting"))
	fmt.Println(err)
	// Output:
	// Hello, RDMA!
	// kv: key not found
}
