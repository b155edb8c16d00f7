package acceptq_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/acceptq"
	"github.com/goverbs/goverbs/verbs/driver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// queue serves a TCP listener whose handshake is one line of 4 bytes.
func queue(t *testing.T) (*acceptq.Queue[*net.TCPConn, string], string, chan string) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	discarded := make(chan string, 16)
	q := acceptq.New(l.AcceptTCP, l.Close, func(c *net.TCPConn) (string, bool) {
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err != nil || b[0] == 'x' {
			return "", false
		}
		return string(b), true
	}, func(r string) { discarded <- r })
	t.Cleanup(func() { q.Close() })
	return q, l.Addr().String(), discarded
}

func dial(t *testing.T, addr, hello string) net.Conn {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if hello != "" {
		if _, err := c.Write([]byte(hello)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func accept(t *testing.T, q *acceptq.Queue[*net.TCPConn, string]) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return q.Accept(ctx)
}

// A silent client, and one that is turned away, hold up no other.
func TestSilentClientHoldsUpNoOther(t *testing.T) {
	q, addr, _ := queue(t)
	dial(t, addr, "")
	dial(t, addr, "xbad")
	dial(t, addr, "good")
	if r, err := accept(t, q); r != "good" || err != nil {
		t.Fatalf("Accept: %q, %v; want good", r, err)
	}
}

// Close ends the handshakes under way, discards the requests nobody
// took, and makes Accept fail with ErrClosed.
func TestClose(t *testing.T) {
	q, addr, discarded := queue(t)
	dial(t, addr, "")
	dial(t, addr, "one!")
	dial(t, addr, "two!")
	if _, err := accept(t, q); err != nil {
		t.Fatal(err)
	}
	// The other request's handshake is done, or about to be: Close
	// discards it either way, or ends it.
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-discarded:
		if r != "one!" && r != "two!" {
			t.Errorf("discarded %q", r)
		}
	default:
		// Closed before its handshake was done: nothing to discard.
	}
	if _, err := accept(t, q); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want ErrClosed", err)
	}
}

// A first Accept that races Close, or comes after it, fails with
// ErrClosed: the accepting loop is started before Close waits for it or
// not at all (go test -race).
func TestFirstAcceptRacingClose(t *testing.T) {
	for range 50 {
		q, _, _ := queue(t)
		done := make(chan error, 1)
		go func() {
			_, err := accept(t, q)
			done <- err
		}()
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, driver.ErrClosed) {
			t.Fatalf("Accept racing Close: %v, want ErrClosed", err)
		}
	}
	q, _, _ := queue(t)
	q.Close()
	if _, err := accept(t, q); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("a first Accept after Close: %v, want ErrClosed", err)
	}
}

// Accept returns when its context ends.
func TestAcceptContext(t *testing.T) {
	q, _, _ := queue(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := q.Accept(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Accept: %v, want context.Canceled", err)
	}
}

// A failed accept is reported to one Accept; the next one takes the
// connection that waits.
func TestAcceptErrorPasses(t *testing.T) {
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	fail, proceed := true, make(chan struct{})
	q := acceptq.New(func() (*net.TCPConn, error) {
		if fail {
			fail = false
			return nil, errors.New("too many open files")
		}
		<-proceed // the first Accept has had its error
		return l.AcceptTCP()
	}, l.Close, func(c *net.TCPConn) (string, bool) {
		b := make([]byte, 4)
		_, err := io.ReadFull(c, b)
		return string(b), err == nil
	}, func(string) {})
	defer q.Close()
	dial(t, l.Addr().String(), "good")
	_, err = accept(t, q)
	close(proceed)
	if err == nil || errors.Is(err, driver.ErrClosed) {
		t.Fatalf("first Accept: %v, want the accept's error", err)
	}
	if r, err := accept(t, q); r != "good" || err != nil {
		t.Fatalf("second Accept: %q, %v; want good", r, err)
	}
}

// TestOnePeerHoldsItsShareOfSlots: a peer's silent connections hold
// MaxPeerHandshakes slots at most — the queue closes the rest at once —
// so that one peer taking every slot of the queue holds up no other.
func TestOnePeerHoldsItsShareOfSlots(t *testing.T) {
	q, addr, _ := queue(t)
	q.PerPeer(func(c *net.TCPConn) string { return c.RemoteAddr().(*net.TCPAddr).IP.String() })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q.Accept(ctx) // starts accepting
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	ended := make(chan error, acceptq.MaxHandshakes)
	var silent []net.Conn
	for range acceptq.MaxHandshakes {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
		go func() {
			_, err := c.Read(make([]byte, 1))
			ended <- err
		}()
	}
	// The connections beyond the peer's share end (the deadline is a
	// hang guard only: they are closed as soon as they are accepted).
	guard := time.After(10 * time.Second)
	for closed := 0; closed < acceptq.MaxHandshakes-acceptq.MaxPeerHandshakes; closed++ {
		select {
		case err := <-ended:
			if !errors.Is(err, io.EOF) {
				t.Fatalf("a silent connection: %v, want the queue to close it", err)
			}
		case <-guard:
			t.Fatalf("%d of the peer's %d silent connections were closed, want all but %d", closed, len(silent), acceptq.MaxPeerHandshakes)
		}
	}
	dial(t, addr, "good")
	r, err := accept(t, q)
	for _, c := range silent {
		c.Close()
	}
	for range acceptq.MaxPeerHandshakes {
		<-ended
	}
	if r != "good" || err != nil {
		t.Fatalf("Accept: %q, %v; want another peer's request", r, err)
	}
}
