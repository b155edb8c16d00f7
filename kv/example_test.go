package kv_test

import (
	"context"
	"errors"
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

// A server that takes a shared token applies the PUTs and DELETEs of the
// clients that prove they hold it; the proof is a challenge and response
// made when the client connects, so the token never crosses the network.
// A client that proves nothing still reads; one that tries a wrong token
// is refused when it dials.
func ExampleTokenAuthorizer() {
	token := []byte("read this from a file only its owner can read")
	srv, err := kv.Listen("loop://kv-token-example", kv.Config{Buckets: 1024, HeapBytes: 1 << 20, Authorizer: kv.TokenAuthorizer(token)})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	owner, err := kv.DialConfig{Credential: kv.TokenCredential(token)}.Dial(ctx, srv.Addr())
	if err != nil {
		log.Fatal(err)
	}
	defer owner.Close()
	fmt.Println("the owner's PUT:", owner.Put([]byte("k"), []byte("v")))

	reader, err := kv.Dial(ctx, srv.Addr())
	if err != nil {
		log.Fatal(err)
	}
	defer reader.Close()
	v, err := reader.Get([]byte("k"))
	fmt.Printf("a reader's GET: %s, %v\n", v, err)
	fmt.Println("a reader's PUT refused:", errors.Is(reader.Put([]byte("k"), []byte("x")), kv.ErrDenied))

	_, err = kv.DialConfig{Credential: kv.TokenCredential([]byte("a guess"))}.Dial(ctx, srv.Addr())
	fmt.Println("a wrong token refused:", errors.Is(err, kv.ErrDenied))
	// Output:
	// the owner's PUT: <nil>
	// a reader's GET: v, <nil>
	// a reader's PUT refused: true
	// a wrong token refused: true
}
