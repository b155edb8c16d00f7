package kv

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
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

// TestTokenRefusesUnauthorisedChanges: a server that takes a token
// refuses the PUTs and DELETEs of clients without it, or with another,
// with ErrDenied and the table unchanged; they still read; the client
// with the token changes the table.
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
		for name, c := range map[string]*Client{
			"no credential":    dial(t, a),
			"another token":    dialWith(t, a, DialConfig{Credential: TokenCredential([]byte("the shared secret"))}),
			"the token itself": dialWith(t, a, DialConfig{Credential: []byte("the shared secret\n")}),
		} {
			if err := c.Put([]byte("small"), []byte("forged")); !errors.Is(err, ErrDenied) {
				t.Errorf("%s: PUT %v, want ErrDenied", name, err)
			}
			if err := c.Put([]byte("new"), []byte("forged")); !errors.Is(err, ErrDenied) {
				t.Errorf("%s: PUT of a new key %v, want ErrDenied", name, err)
			}
			if err := c.Delete([]byte("big")); !errors.Is(err, ErrDenied) {
				t.Errorf("%s: DELETE %v, want ErrDenied", name, err)
			}
			if v, err := c.Get([]byte("big")); err != nil || !bytes.Equal(v, big) {
				t.Errorf("%s: GET %d bytes, %v; want the owner's value", name, len(v), err)
			}
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

// prefixAuthorizer lets a client change the keys that begin with its
// credential.
type prefixAuthorizer struct{ seen []Op }

func (p *prefixAuthorizer) Authorize(cred []byte, op Op, key []byte) error {
	p.seen = append(p.seen, op)
	if len(cred) == 0 || !bytes.HasPrefix(key, cred) {
		return errors.New("not your key")
	}
	return nil
}

// TestAuthorizerSeesCredentialOpAndKey: the Authorizer is asked about
// each PUT and DELETE with the client's credential, the operation and
// the key — not about GETs, nor about a fallback GET RPC.
func TestAuthorizerSeesCredentialOpAndKey(t *testing.T) {
	a := addrs()["loop"]()
	auth := &prefixAuthorizer{}
	cfg := small()
	cfg.Authorizer = auth
	startServer(t, a, cfg)
	alice := dialWith(t, a, DialConfig{Credential: []byte("alice/")})
	bob := dialWith(t, a, DialConfig{Credential: []byte("bob/")})
	if err := alice.Put([]byte("alice/x"), []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := bob.Put([]byte("alice/x"), []byte("2")); !errors.Is(err, ErrDenied) {
		t.Fatalf("bob's PUT of alice's key: %v, want ErrDenied", err)
	}
	if err := bob.Delete([]byte("alice/x")); !errors.Is(err, ErrDenied) {
		t.Fatalf("bob's DELETE of alice's key: %v, want ErrDenied", err)
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
	want := []Op{OpPut, OpPut, OpDelete, OpDelete}
	if len(auth.seen) != len(want) {
		t.Fatalf("the Authorizer saw %v, want %v", auth.seen, want)
	}
	for i := range want {
		if auth.seen[i] != want[i] {
			t.Fatalf("the Authorizer saw %v, want %v", auth.seen, want)
		}
	}
}

// rpcLocked makes one RPC as the client's methods do.
func (c *Client) rpcLocked(op uint8, key []byte) (reply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkedRPC(op, key, nil)
}

// TestCredentialTooLong: a credential longer than a connection request
// carries is refused before dialling, pointing at TokenCredential.
func TestCredentialTooLong(t *testing.T) {
	_, err := DialConfig{Credential: make([]byte, MaxCredential+1)}.Dial(context.Background(), addrs()["loop"]())
	if err == nil || !strings.Contains(err.Error(), "TokenCredential") {
		t.Fatalf("Dial with a %d-byte credential: %v", MaxCredential+1, err)
	}
}

// TestHelloCredential: a connection request's credential is read back as
// it was laid out; requests of other shapes present none.
func TestHelloCredential(t *testing.T) {
	cred := []byte("0123456789")
	if got := hello(encodeHello(cred)).credential(); !bytes.Equal(got, cred) {
		t.Fatalf("credential %q, want %q", got, cred)
	}
	long := encodeHello(make([]byte, MaxCredential))
	long[6]++ // says one byte more than MaxCredential
	for name, b := range map[string][]byte{
		"none":      nil,
		"short":     encodeHello(cred)[:helloHeader-1],
		"truncated": encodeHello(cred)[:helloHeader+3],
		"too long":  append(long, 0),
		"not kv":    []byte("some other application's data"),
	} {
		if got := hello(b).credential(); got != nil {
			t.Errorf("%s: credential %q, want none", name, got)
		}
	}
}
