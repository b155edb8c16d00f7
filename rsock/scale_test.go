package rsock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
)

// TestThousandConnections opens 1,000 connections over shm0 in one
// process (2,000 ends), has every one carry a request and its reply at
// once, checks that the listener, bounded at 1,000, rejects one more, and
// closes them all. It logs the registered memory per connection end.
func TestThousandConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 2,000 connection ends")
	}
	const n = 1000
	cfg := &Config{RingSize: MinRingSize, MaxConns: n, Spin: -1}
	l, err := cfg.Listen(listenAddr(t, "shm"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	accepted := make(chan net.Conn, n)
	acceptErr := make(chan error, 1)
	// Several goroutines accept, as a server that sets connections up
	// concurrently does.
	const acceptors = 8
	var acceptWG sync.WaitGroup
	for range acceptors {
		acceptWG.Add(1)
		go func() {
			defer acceptWG.Done()
			for range n / acceptors { // n is a multiple of acceptors
				c, err := l.Accept()
				if err != nil {
					select {
					case acceptErr <- err:
					default:
					}
					cancel() // the dials waiting for it fail
					return
				}
				accepted <- c
			}
		}()
	}
	go func() {
		acceptWG.Wait()
		select {
		case acceptErr <- nil:
		default:
		}
	}()
	dialled := make([]net.Conn, n)
	var closeAll sync.Once
	var servers []net.Conn
	closeEverything := func() {
		closeAll.Do(func() {
			all := append(append([]net.Conn(nil), dialled...), servers...)
			var wg sync.WaitGroup
			for k := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := k; i < len(all); i += 8 {
						if all[i] != nil {
							all[i].Close()
						}
					}
				}()
			}
			wg.Wait()
		})
	}
	defer closeEverything()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	// A listener takes at most 8 handshakes of one process at a time.
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := cfg.Dial(ctx, l.Addr().String())
			if err != nil {
				var rej *cm.RejectError
				if errors.As(err, &rej) {
					err = fmt.Errorf("%w: %s", err, rej.PrivateData)
				}
				errs <- fmt.Errorf("dial %d: %w", i, err)
				return
			}
			dialled[i] = c
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		// Some dials failed: the acceptors wait for connections that will
		// not come until the listener closes.
		l.Close()
	}
	if err := <-acceptErr; err != nil && len(errs) == 0 {
		t.Fatal(err)
	}
	// The first acceptor to fail reported at once: the others may still
	// hand over a connection they had accepted before the listener closed.
	acceptWG.Wait()
	close(accepted)
	for c := range accepted {
		servers = append(servers, c)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(servers) != n {
		t.Fatalf("accepted %d connections, want %d", len(servers), n)
	}
	t.Logf("%d connections over shm0: %d bytes of registered memory per end (ring %d B)", n, servers[0].(*Conn).RegisteredBytes(), cfg.RingSize)

	// One more is rejected: the listener holds n.
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
	}()
	if c, err := cfg.Dial(ctx, l.Addr().String()); !errors.Is(err, cm.ErrRejected) {
		if c != nil {
			c.Close()
		}
		t.Errorf("dial beyond MaxConns: %v, want cm.ErrRejected", err)
	}

	// Every server echoes once; every client sends and checks, all at once.
	errs = make(chan error, 2*n)
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64)
			k, err := io.ReadFull(s, buf[:16])
			if err == nil {
				_, err = s.Write(buf[:k])
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	for i, c := range dialled {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := fmt.Sprintf("request %8d", i)
			if _, err := io.WriteString(c, msg); err != nil {
				errs <- err
				return
			}
			buf := make([]byte, 16)
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
				errs <- fmt.Errorf("client %d: got %q, %v", i, buf, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	closeEverything()
	if fds := openFDs(t); fds > 100 {
		t.Errorf("%d file descriptors open after every connection closed", fds)
	}
}

// openFDs counts the process's open file descriptors that are memfds or
// sockets.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil &&
			(strings.HasPrefix(target, "/memfd:") || strings.HasPrefix(target, "socket:")) {
			n++
		}
	}
	return n
}
