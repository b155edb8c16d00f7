package rsock

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// processThreads counts this process's threads.
func processThreads(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// parkedReads counts the goroutines parked in Conn.Read, waiting for
// bytes.
func parkedReads() int {
	buf := make([]byte, 4<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		if strings.Contains(g, "rsock.(*Conn).Read(") && strings.Contains(header, "[select") {
			n++
		}
	}
	return n
}

// TestIdleConnectionsHoldNoThreads: connections whose Reads wait for
// bytes that do not come park their goroutines, not threads: on every
// provider, the process does not gain a thread per connection.
func TestIdleConnectionsHoldNoThreads(t *testing.T) {
	const n = 32
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			before := processThreads(t)
			var conns []*Conn
			reads := make(chan error, 2*n)
			for range n {
				d, a := pair(t, scheme, &Config{})
				conns = append(conns, d, a)
				for _, c := range []*Conn{d, a} {
					go func() {
						_, err := c.Read(make([]byte, 1))
						reads <- err
					}()
				}
			}
			defer func() {
				for _, c := range conns {
					c.Close()
				}
				for range conns {
					<-reads
				}
			}()
			for deadline := time.Now().Add(10 * time.Second); parkedReads() < 2*n; runtime.Gosched() {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d Reads parked", parkedReads(), 2*n)
				}
			}
			if grown := processThreads(t) - before; grown >= n/2 {
				t.Fatalf("%d idle connections with a Read waiting at each end: the process has %d more threads", n, grown)
			}
		})
	}
}
