package shm

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/acceptq"
	"github.com/goverbs/goverbs/verbs"
)

// The child of TestUntrustedUserRejectedBeforeSendingAnything: it drops
// to uid and gid 65534, opens MaxPeerHandshakes connections to the address
// in GOVERBS_SHM_ADDR, sends nothing on them, and reports for each what
// the listener answered: "answer rejected", or "answer <what came>".
func init() { childModes["silentuntrusted"] = asNobody(silentUntrustedChild) }

func silentUntrustedChild() int {
	ua, err := sockAddr(os.Getenv("GOVERBS_SHM_ADDR")[len("shm://"):])
	if err != nil {
		return childFail("address: %v", err)
	}
	var socks []*net.UnixConn
	for range acceptq.MaxPeerHandshakes {
		c, err := net.DialUnix("unixpacket", nil, ua)
		if err != nil {
			return childFail("dial: %v", err)
		}
		defer c.Close()
		socks = append(socks, c)
	}
	for _, c := range socks {
		// The deadline only keeps a broken listener from hanging the test.
		h, fds, err := readHello(c, time.Now().Add(20*time.Second), nil)
		closeFDs(fds)
		switch {
		case err != nil:
			say("answer %v", err)
		case h.typ() == msgRej:
			say("answer rejected")
		default:
			say("answer message type %d", h.typ())
		}
	}
	return 0
}

// TestUntrustedUserRejectedBeforeSendingAnything: a listener rejects a
// process of a user it does not trust as soon as it connects, before it
// sends its request, rather than holding a handshake slot for it until
// the handshake times out.
func TestUntrustedUserRejectedBeforeSendingAnything(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child of another user")
	}
	addr := uniqueAddr("silent-untrusted")
	l, err := cm.ListenWith(addr, cm.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(context.Background())
		if err == nil {
			req.Reject(nil)
			err = errors.New("the listener handed over a request of an untrusted uid")
		}
		accepted <- err
	}()
	defer func() {
		l.Close()
		if err := <-accepted; !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("Accept: %v", err)
		}
	}()
	ch := spawn(t, "silentuntrusted", "GOVERBS_SHM_ADDR="+addr)
	for i := range acceptq.MaxPeerHandshakes {
		if got := ch.expect("answer", 30*time.Second); got != "rejected" {
			t.Fatalf("silent connection %s of uid 65534: the listener answered %q, not a rejection", strconv.Itoa(i), got)
		}
	}
	if err := ch.wait(20 * time.Second); err != nil {
		t.Fatalf("child: %v", err)
	}
}
