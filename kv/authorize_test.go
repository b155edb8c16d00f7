package kv

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

func dialWith(t *testing.T, addr string, cfg DialConfig) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cfg.Dial(ctx, addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialErr dials with cfg and returns the error; a client it made is
// closed.
func dialErr(addr string, cfg DialConfig) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cfg.Dial(ctx, addr)
	if err == nil {
		c.Close()
	}
	return err
}

// TestTokenRefusesUnauthorisedChanges: a server that takes a token
// refuses the PUTs and DELETEs of clients that prove nothing, with
// ErrDenied and the table unchanged, though they still read; a client
// that tries to prove another token, or the token itself instead of its
// credential, is refused when it dials; the client that proves the token
// changes the table.
func TestTokenRefusesUnauthorisedChanges(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		cfg := small()
		cfg.Authorizer = TokenAuthorizer([]byte("the shared secret\n"))
		s := startServer(t, a, cfg)
		owner := dialWith(t, a, DialConfig{Credential: TokenCredential([]byte("the shared secret\n"))})
		big := bytes.Repeat([]byte("v"), 500) // a heap record
		for _, k := range []string{"small", "big"} {
			v := []byte("v")
			if k == "big" {
				v = big
			}
			if err := owner.Put([]byte(k), v); err != nil {
				t.Fatalf("the token holder's PUT: %v", err)
			}
		}
		for name, cred := range map[string][]byte{
			"another token":    TokenCredential([]byte("the shared secret")),
			"the token itself": []byte("the shared secret\n"),
		} {
			if err := dialErr(a, DialConfig{Credential: cred}); !errors.Is(err, ErrDenied) {
				t.Errorf("%s: Dial %v, want ErrDenied", name, err)
			}
		}
		anon := dial(t, a)
		if err := anon.Put([]byte("small"), []byte("forged")); !errors.Is(err, ErrDenied) {
			t.Errorf("no credential: PUT %v, want ErrDenied", err)
		}
		if err := anon.Put([]byte("new"), []byte("forged")); !errors.Is(err, ErrDenied) {
			t.Errorf("no credential: PUT of a new key %v, want ErrDenied", err)
		}
		if err := anon.Delete([]byte("big")); !errors.Is(err, ErrDenied) {
			t.Errorf("no credential: DELETE %v, want ErrDenied", err)
		}
		if v, err := anon.Get([]byte("big")); err != nil || !bytes.Equal(v, big) {
			t.Errorf("no credential: GET %d bytes, %v; want the owner's value", len(v), err)
		}
		if v, err := owner.Get([]byte("small")); err != nil || string(v) != "v" {
			t.Errorf("after refused PUTs the value is %q, %v", v, err)
		}
		if _, err := owner.Get([]byte("new")); !errors.Is(err, ErrNotFound) {
			t.Errorf("a refused PUT's key: %v, want ErrNotFound", err)
		}
		if err := owner.Delete([]byte("big")); err != nil {
			t.Errorf("the token holder's DELETE: %v", err)
		}
		if n := s.Puts.Load(); n != 2 {
			t.Errorf("the server applied %d PUTs, want the owner's 2", n)
		}
		if !strings.Contains(ErrDenied.Error(), "token-file") {
			t.Errorf("ErrDenied does not say what to do: %q", ErrDenied)
		}
	})
}

// rpc sends one request from the raw client's region and returns the
// server's reply (the receive rawDial posted, posted again after it).
func (r *rawClient) rpc(t *testing.T, b []byte) reply {
	t.Helper()
	n := copy(r.mr.Bytes(), b)
	if _, err := r.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{r.mr.SGE(0, n)}}}); err != nil {
		t.Fatalf("post a request: %v", err)
	}
	return r.awaitReply(t)
}

// awaitReply waits for the next reply the raw client receives.
func (r *rawClient) awaitReply(t *testing.T) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a hang guard
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 4)
	for {
		n, err := r.cq.Wait(ctx, wcs)
		if err != nil {
			t.Fatalf("no reply: %v", err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.WCSuccess {
				t.Fatalf("completion %+v", wc)
			}
			if wc.Opcode != verbs.WCRecv {
				continue
			}
			got, err := verbs.Received(&wc, r.mr.Bytes()[1<<19:])
			if err != nil || !reply(got).valid() {
				t.Fatalf("a reply that is not one: %x, %v", got, err)
			}
			out := append(reply(nil), got...)
			if _, err := r.qp.PostRecv([]verbs.RecvWR{{WRID: 99, SGList: []verbs.SGE{r.mr.SGE(1<<19, 1<<19)}}}); err != nil {
				t.Fatal(err)
			}
			return out
		}
	}
}

// rawRequest lays out a request.
func rawRequest(op uint8, id uint64, key, val []byte) []byte {
	b := make([]byte, requestHeader+len(key)+len(val))
	return b[:putRequest(b, op, id, key, val)]
}

// TestCapturedHandshakeRefused: an attacker that recorded an honest
// client's whole handshake — its connection request, the server's
// acceptance and the client's proof — and replays the request and the
// proof on a connection of its own is refused, and its PUTs with it;
// the honest client's connection is unaffected.
func TestCapturedHandshakeRefused(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		cfg := small()
		token := []byte("the shared secret\n")
		cfg.Authorizer = TokenAuthorizer(token)
		s := startServer(t, a, cfg)
		honest := dialWith(t, a, DialConfig{Identity: []byte("honest"), Credential: TokenCredential(token)})
		if err := honest.Put([]byte("k"), []byte("honest")); err != nil {
			t.Fatalf("the honest client's PUT: %v", err)
		}
		// What crossed the network on the honest client's connection.
		captured := append(hello(nil), honest.hello...)
		mac := proof(TokenCredential(token), labelClient, honest.hello, honest.acceptance)

		r := rawDialWith(t, a, func(uint32) []byte { return captured })
		if r := r.rpc(t, rawRequest(opAuth, 1, nil, mac)); r.status() != statusDenied {
			t.Fatalf("the replayed proof: status %d, want %d (denied)", r.status(), statusDenied)
		}
		if r := r.rpc(t, rawRequest(opPut, 2, []byte("k"), []byte("forged"))); r.status() != statusDenied {
			t.Fatalf("a PUT after the replayed proof: status %d, want %d (denied)", r.status(), statusDenied)
		}
		// A second attempt on the same connection is refused whatever it
		// carries.
		if r := r.rpc(t, rawRequest(opAuth, 3, nil, mac)); r.status() != statusDenied {
			t.Fatalf("a second proof: status %d, want %d (denied)", r.status(), statusDenied)
		}
		if v, err := honest.Get([]byte("k")); err != nil || string(v) != "honest" {
			t.Fatalf("the value is %q, %v; want the honest client's", v, err)
		}
		if err := honest.Put([]byte("k"), []byte("still")); err != nil {
			t.Fatalf("the honest client's PUT after the attack: %v", err)
		}
		if n := s.Puts.Load(); n != 2 {
			t.Errorf("the server applied %d PUTs, want the honest client's 2", n)
		}
	})
}

// keyring lets each identity change the keys that begin with it, once it
// proved it holds its secret.
type keyring struct {
	secrets map[string]string
	seen    []string
}

func (k *keyring) Secret(id []byte) ([]byte, bool) {
	s, ok := k.secrets[string(id)]
	return []byte(s), ok
}

func (k *keyring) Authorize(id []byte, op Op, key []byte) error {
	k.seen = append(k.seen, string(id)+" "+op.String())
	if !bytes.HasPrefix(key, id) {
		return errors.New("not your key")
	}
	return nil
}

// TestAuthorizerSeesProvenIdentityOpAndKey: a Keyring Authorizer is asked
// about each PUT and DELETE of a client that proved its identity, with
// that identity, the operation and the key — not about GETs, nor about a
// fallback GET RPC, nor about clients that proved nothing (refused); a
// client that names an identity with the wrong secret, or one the
// Keyring lacks, is refused when it dials.
func TestAuthorizerSeesProvenIdentityOpAndKey(t *testing.T) {
	a := addrs()["loop"]()
	auth := &keyring{secrets: map[string]string{"alice/": "alice's secret key", "bob/": "bob's secret key!"}}
	cfg := small()
	cfg.Authorizer = auth
	startServer(t, a, cfg)
	alice := dialWith(t, a, DialConfig{Identity: []byte("alice/"), Credential: []byte("alice's secret key")})
	bob := dialWith(t, a, DialConfig{Identity: []byte("bob/"), Credential: []byte("bob's secret key!")})
	anon := dial(t, a)
	if err := dialErr(a, DialConfig{Identity: []byte("alice/"), Credential: []byte("bob's secret key!")}); !errors.Is(err, ErrDenied) {
		t.Fatalf("alice's identity with bob's secret: Dial %v, want ErrDenied", err)
	}
	if err := dialErr(a, DialConfig{Identity: []byte("mallory/"), Credential: []byte("mallory's secret")}); !errors.Is(err, ErrDenied) {
		t.Fatalf("an identity the Keyring lacks: Dial %v, want ErrDenied", err)
	}
	if err := alice.Put([]byte("alice/x"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := bob.Put([]byte("alice/x"), []byte("2")); !errors.Is(err, ErrDenied) {
		t.Fatalf("bob's PUT of alice's key: %v, want ErrDenied", err)
	}
	if err := bob.Delete([]byte("alice/x")); !errors.Is(err, ErrDenied) {
		t.Fatalf("bob's DELETE of alice's key: %v, want ErrDenied", err)
	}
	if err := anon.Put([]byte("alice/x"), []byte("3")); !errors.Is(err, ErrDenied) {
		t.Fatalf("an anonymous PUT: %v, want ErrDenied", err)
	}
	if v, err := bob.Get([]byte("alice/x")); err != nil || string(v) != "1" {
		t.Fatalf("bob's GET: %q, %v", v, err)
	}
	if _, err := bob.rpcLocked(opGet, []byte("alice/x")); err != nil {
		t.Fatalf("bob's fallback GET: %v", err)
	}
	if err := alice.Delete([]byte("alice/x")); err != nil {
		t.Fatal(err)
	}
	want := []string{"alice/ PUT", "bob/ PUT", "bob/ DELETE", "alice/ DELETE"}
	if strings.Join(auth.seen, ",") != strings.Join(want, ",") {
		t.Fatalf("the Authorizer saw %q, want %q", auth.seen, want)
	}
}

// TestCredentialNeedsAKeyring: a client that would prove a credential to
// a server whose Authorizer holds no secrets (the default) is refused
// when it dials, rather than connecting with changes it believes
// authorised; without one it connects.
func TestCredentialNeedsAKeyring(t *testing.T) {
	a := addrs()["loop"]()
	startServer(t, a, small())
	if err := dialErr(a, DialConfig{Credential: TokenCredential([]byte("t"))}); !errors.Is(err, ErrDenied) {
		t.Fatalf("Dial with a credential: %v, want ErrDenied", err)
	}
	if err := dial(t, a).Put([]byte("k"), []byte("v")); err != nil {
		t.Fatalf("an anonymous PUT to a server that allows all: %v", err)
	}
}

// rpcLocked makes one RPC as the client's methods do.
func (c *Client) rpcLocked(op uint8, key []byte) (reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkedRPC(op, key, nil)
}

// TestDialConfigChecked: an identity longer than a connection request
// carries, a credential too short to be a secret, and an identity
// without a credential are refused before dialling, each saying what to
// do.
func TestDialConfigChecked(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  DialConfig
		want string
	}{
		"long identity":    {DialConfig{Identity: make([]byte, MaxIdentity+1), Credential: make([]byte, MinCredential)}, "MaxIdentity"},
		"short credential": {DialConfig{Credential: make([]byte, MinCredential-1)}, "TokenCredential"},
		"no credential":    {DialConfig{Identity: []byte("alice")}, "DialConfig.Credential"},
	} {
		if err := dialErr(addrs()["loop"](), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Dial %v, want an error naming %s", name, err, tc.want)
		}
	}
}

// TestHelloRoundTrip: a connection request's identity is read back as
// it was laid out, with a fresh nonce each time; requests of other shapes
// prove nothing.
func TestHelloRoundTrip(t *testing.T) {
	id := []byte("0123456789")
	h1, h2 := encodeHello(5, id), encodeHello(5, id)
	if got := hello(h1).canonical(); !bytes.Equal(got.identity(), id) || !bytes.Equal(got, h1) {
		t.Fatalf("identity %q of %x, want %q", got.identity(), got, id)
	}
	if bytes.Equal(h1, h2) {
		t.Fatal("two requests carry the same nonce")
	}
	long := encodeHello(5, make([]byte, MaxIdentity))
	long[6]++ // says one byte more than MaxIdentity
	v1 := encodeHello(5, id)
	v1[4] = 1 // an earlier version's request
	for name, b := range map[string][]byte{
		"none":            nil,
		"short":           h1[:helloHeader-1],
		"truncated":       h1[:helloHeader+3],
		"too long":        append(long, 0),
		"earlier version": v1,
		"not kv":          []byte("some other application's data, longer than a header"),
	} {
		if got := hello(b).canonical(); got != nil {
			t.Errorf("%s: canonical %x, want none", name, got)
		}
	}
}
