package rsock

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/goverbs/goverbs/provider/iwarp"
	_ "github.com/goverbs/goverbs/provider/loop"
	_ "github.com/goverbs/goverbs/provider/shm"
)

var addrSeq atomic.Int64

// providers are the address schemes the tests run on.
var providers = []string{"loop", "shm", "tcp"}

// listenAddr returns a fresh address to listen on for the scheme.
func listenAddr(t testing.TB, scheme string) string {
	n := addrSeq.Add(1)
	switch scheme {
	case "loop":
		return fmt.Sprintf("loop://rsock-%s-%d", t.Name(), n)
	case "shm":
		return fmt.Sprintf("shm://@rsock-%d-%d", time.Now().UnixNano(), n)
	case "tcp":
		return "tcp://127.0.0.1:0"
	}
	t.Fatalf("no scheme %q", scheme)
	return ""
}

// pair returns both ends of a connection made with cfg.
func pair(t testing.TB, scheme string, cfg *Config) (dialled, accepted *Conn) {
	t.Helper()
	l, err := cfg.Listen(listenAddr(t, scheme))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, d, err := connectVia(l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d, a
}

// connectVia dials l and accepts the request.
func connectVia(l net.Listener, cfg *Config) (accepted, dialled *Conn, err error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		ch <- res{c, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := cfg.Dial(ctx, l.Addr().String())
	r := <-ch
	if err != nil || r.err != nil {
		if d != nil {
			d.Close()
		}
		if r.c != nil {
			r.c.Close()
		}
		return nil, nil, fmt.Errorf("dial: %v, accept: %v", err, r.err)
	}
	return r.c.(*Conn), d.(*Conn), nil
}
