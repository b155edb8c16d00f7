package perftest

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestSilentClientHoldsServerNoLonger: a client that connects and then
// does nothing holds the server, which serves one run at a time, for
// RunTimeout at most; the next client is served after it.
func TestSilentClientHoldsServerNoLonger(t *testing.T) {
	for _, d := range devices {
		if d.name == "loop0" {
			continue // the server is a goroutine of the client's process
		}
		t.Run(d.name, func(t *testing.T) {
			// RunTimeout bounds the second client's run too, so it is
			// long enough for its connection and 100 round trips on a
			// machine whose other work holds both processors.
			addr, cli := startServer(t, d.name, d.addr, ServeOptions{RunTimeout: 5 * time.Second})
			silent, _, err := dial(context.Background(), cli, addr, DefaultParams(WriteBW, 64, cli.QueryDevice()))
			if err != nil {
				t.Fatal(err)
			}
			defer silent.close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p := DefaultParams(SendLat, 8, cli.QueryDevice())
			p.Iters = 100
			if _, err := Run(ctx, cli, addr, p); err != nil {
				t.Fatalf("a client while a silent one is connected: %v", err)
			}
		})
	}
}

// TestServerMaxSize: a request for messages larger than the server's
// MaxSize is refused before the server registers memory for it.
func TestServerMaxSize(t *testing.T) {
	addr, cli := startServer(t, "tcp0", "tcp://127.0.0.1:0", ServeOptions{MaxSize: 4096})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := DefaultParams(WriteBW, 8192, cli.QueryDevice())
	p.Iters = 10
	if _, err := Run(ctx, cli, addr, p); err == nil || !strings.Contains(err.Error(), "up to 4096 bytes") {
		t.Fatalf("a run of 8 KiB messages on a server of 4 KiB at most: %v", err)
	}
	p = DefaultParams(WriteBW, 4096, cli.QueryDevice())
	p.Iters = 10
	if _, err := Run(ctx, cli, addr, p); err != nil {
		t.Fatalf("a run of 4 KiB messages: %v", err)
	}
}
