package main

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/goverbs/goverbs/internal/listenwait"
)

func TestMain(m *testing.M) {
	// Tests dial listeners of this process: see package listenwait.
	listenwait.Set(listenwait.TestTimeout)
	goleak.VerifyTestMain(m)
}

// TestServerSpeaksFirst runs the example's server and client against
// each other over tcp0 on loopback: the server sends first on every
// connection, the client answers, and both see every message.
func TestServerSpeaksFirst(t *testing.T) { exchange(t, false) }

// TestClientSpeaksFirst is TestServerSpeaksFirst in the order of
// rdma_client and rdma_server (-answer).
func TestClientSpeaksFirst(t *testing.T) { exchange(t, true) }

func exchange(t *testing.T, answer bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	addrs := make(chan string, 1)
	srvCfg := config{bind: "127.0.0.1", port: 0, connections: 4, messages: 5, size: 100, answer: answer,
		ready: func(a string) { addrs <- a }}
	srvErr := make(chan error, 1)
	go func() { srvErr <- run(ctx, srvCfg, io.Discard) }()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-srvErr:
		t.Fatalf("server: %v", err)
	}
	host, port, err := net.SplitHostPort(strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	cliCfg := config{server: host, port: p, connections: 4, messages: 5, size: 100, answer: answer}
	if err := run(ctx, cliCfg, io.Discard); err != nil {
		t.Errorf("client: %v", err)
	}
	if err := <-srvErr; err != nil {
		t.Errorf("server: %v", err)
	}
}
