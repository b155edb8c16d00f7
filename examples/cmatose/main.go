// Command cmatose is a goverbs peer for librdmacm's cmatose (packaged as
// ucmatose in Debian's rdmacm-utils), written with goverbs' public API
// only (cm and verbs), so that either end may be the Linux tool. Over
// goverbs' iWARP device tcp0 (the default) its peer is cmatose on a host
// with an iWARP device (siw); with -d naming a kernel RDMA device (rxe0,
// siw0, mlx5_0, ...), which the ibverbs provider reaches through
// rdma-core, it connects through librdmacm (rdma://) and its peer is
// cmatose on any device the kernel routes the address to.
//
// Its server is a server that speaks first: once every connection is up
// it sends its messages before it has received anything, as cmatose's
// does, and then takes the client's replies. A client of cmatose (one
// that, like Linux siw's, does not ask for iWARP's peer-to-peer mode)
// sends nothing until it has received all of them, so this is the
// example to read for a protocol whose server opens the conversation.
//
//	cmatose -b 10.77.0.1 -c 10 -C 10       serve 10 connections, 10 messages each way
//	cmatose -s 10.77.0.1 -c 10 -C 10       connect 10 times to such a server
//	cmatose -d rxe0 -s 10.77.0.2           the same through rdma-core and librdmacm
//
// On each connection both sides post their receives before connecting
// (iWARP has no retry for a Send that finds no receive); the server
// sends its messages, the client receives them and sends as many back,
// the server receives those and disconnects, and the client waits for
// that disconnect. With -answer the client sends first, the server
// answers, and each side disconnects when done: with -c 1 -C 1 -S 16
// that is the exchange of librdmacm's rdma_client and rdma_server
// (rdma_server -p 7471 against cmatose -answer -s HOST -c 1 -C 1 -S 16). Every completion must be a success and every message
// exactly -S bytes; the exit status is 0 only then. cmatose's messages
// are unset memory, so contents are not compared.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/goverbs/goverbs/cm"
	_ "github.com/goverbs/goverbs/provider/ibverbs" // rdma://, the kernel's devices
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// config is what the flags set.
type config struct {
	device      string // -d: the device
	server      string // -s: connect to this server
	bind        string // -b: serve on this address
	port        int
	connections int
	messages    int
	size        int
	timeout     time.Duration
	answer      bool              // the client speaks first
	ready       func(addr string) // called once the server listens (tests)
}

func main() {
	var cfg config
	crc := false
	flag.StringVar(&cfg.device, "d", iwarp.DeviceName, "the `device`: tcp0, or a kernel RDMA device reached through librdmacm (rxe0, siw0, ...)")
	flag.StringVar(&cfg.server, "s", "", "connect to the cmatose server at this address (client)")
	flag.StringVar(&cfg.bind, "b", "", "serve on this address (server; 0.0.0.0 for all)")
	flag.IntVar(&cfg.port, "p", 7471, "the TCP port")
	flag.IntVar(&cfg.connections, "c", 1, "connections")
	flag.IntVar(&cfg.messages, "C", 10, "messages each way on each connection")
	flag.IntVar(&cfg.size, "S", 100, "bytes in each message")
	flag.DurationVar(&cfg.timeout, "timeout", time.Minute, "give up when a step takes longer than this")
	flag.BoolVar(&cfg.answer, "answer", false, "the client sends first and the server answers (with -c 1 -C 1 -S 16,\nthe exchange of librdmacm's rdma_client and rdma_server)")
	flag.BoolVar(&crc, "crc", false, "ask for MPA CRC32c (the peer may ask for it either way)")
	flag.Parse()
	if flag.NArg() > 0 || (cfg.server == "") == (cfg.bind == "") || cfg.connections < 1 || cfg.messages < 1 || cfg.size < 1 {
		fmt.Fprintln(os.Stderr, "usage: cmatose (-s server | -b bind_address) [-d device] [-p port] [-c connections] [-C messages] [-S size] [-answer] [-crc] [-timeout d]")
		os.Exit(2)
	}
	iwarp.SetCRC(crc)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "cmatose:", err)
		os.Exit(1)
	}
}

// run is the server (cfg.bind) or the client (cfg.server) until ctx ends.
func run(ctx context.Context, cfg config, out io.Writer) error {
	if cfg.device == "" {
		cfg.device = iwarp.DeviceName
	}
	dev, err := verbs.Open(cfg.device)
	if err != nil {
		return fmt.Errorf("open %s: %w", cfg.device, err)
	}
	defer dev.Close()
	pd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	nodes := make([]*node, cfg.connections)
	defer func() {
		for _, n := range nodes {
			if n != nil {
				n.close()
			}
		}
	}()
	for i := range nodes {
		if nodes[i], err = newNode(dev, pd, cfg); err != nil {
			return err
		}
	}
	if cfg.bind != "" {
		return serve(ctx, cfg, nodes, out)
	}
	return dial(ctx, cfg, nodes, out)
}

// url is the cm address of host and cfg.port on cfg.device: tcp:// for
// tcp0, rdma:// (librdmacm, which picks the kernel device the address
// routes to) for a kernel device.
func (cfg config) url(host string) string {
	scheme := "tcp://"
	if cfg.device != iwarp.DeviceName {
		scheme = "rdma://"
	}
	return scheme + net.JoinHostPort(host, strconv.Itoa(cfg.port))
}

// serve accepts a connection for each node, sends first (or, with
// cfg.answer, receives first and answers), then disconnects.
func serve(ctx context.Context, cfg config, nodes []*node, out io.Writer) error {
	addr := cfg.url(cfg.bind)
	l, err := cm.Listen(addr)
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(out, "cmatose: serving %d connections on %s\n", len(nodes), l.Addr())
	if cfg.ready != nil {
		cfg.ready(l.Addr())
	}
	for i, n := range nodes {
		req, err := l.Accept(ctx)
		if err != nil {
			return fmt.Errorf("waiting for connection %d of %d: %w", i+1, len(nodes), err)
		}
		if n.conn, err = req.Accept(n.qp, &cm.Param{ResponderResources: 1, InitiatorDepth: 1}); err != nil {
			return fmt.Errorf("accept connection %d: %w", i+1, err)
		}
	}
	if cfg.answer {
		if err := receiveAll(ctx, nodes, out); err != nil {
			return err
		}
	}
	if err := sendAll(ctx, nodes, out); err != nil {
		return err
	}
	if !cfg.answer {
		if err := receiveAll(ctx, nodes, out); err != nil {
			return err
		}
	}
	for _, n := range nodes {
		n.conn.Close()
	}
	fmt.Fprintf(out, "cmatose: %d connections, %d messages of %d bytes each way on each: ok\n", len(nodes), cfg.messages, cfg.size)
	return nil
}

// dial connects each node, receives the server's messages and replies
// (or, with cfg.answer, sends first and receives the answers), and
// waits for the server to disconnect (with cfg.answer: disconnects).
func dial(ctx context.Context, cfg config, nodes []*node, out io.Writer) error {
	addr := cfg.url(cfg.server)
	fmt.Fprintf(out, "cmatose: connecting %d times to %s\n", len(nodes), addr)
	for i, n := range nodes {
		var err error
		if n.conn, err = cm.Dial(ctx, addr, n.qp, &cm.Param{ResponderResources: 1, InitiatorDepth: 1}); err != nil {
			return fmt.Errorf("connection %d: %w", i+1, err)
		}
	}
	if !cfg.answer {
		if err := receiveAll(ctx, nodes, out); err != nil {
			return err
		}
	}
	if err := sendAll(ctx, nodes, out); err != nil {
		return err
	}
	if cfg.answer {
		if err := receiveAll(ctx, nodes, out); err != nil {
			return err
		}
	}
	for i, n := range nodes {
		if cfg.answer {
			n.conn.Close()
			continue
		}
		select {
		case <-n.conn.Done():
			n.conn.Close()
		case <-ctx.Done():
			return fmt.Errorf("connection %d: the server did not disconnect: %w", i+1, ctx.Err())
		}
	}
	fmt.Fprintf(out, "cmatose: %d connections, %d messages of %d bytes each way on each: ok\n", len(nodes), cfg.messages, cfg.size)
	return nil
}

// sendAll posts every node's messages and waits for their completions.
func sendAll(ctx context.Context, nodes []*node, out io.Writer) error {
	fmt.Fprintln(out, "sending")
	for _, n := range nodes {
		if err := n.postSends(); err != nil {
			return err
		}
	}
	for i, n := range nodes {
		if err := n.await(ctx, n.scq, "send", i); err != nil {
			return err
		}
	}
	return nil
}

// receiveAll waits for every node's messages.
func receiveAll(ctx context.Context, nodes []*node, out io.Writer) error {
	fmt.Fprintln(out, "receiving")
	for i, n := range nodes {
		if err := n.await(ctx, n.rcq, "receive", i); err != nil {
			return err
		}
	}
	return nil
}

// node is one connection's verbs objects: a CQ for sends and one for
// receives, a QP, and the message buffer (cmatose's struct cmatest_node).
type node struct {
	cfg      config
	scq, rcq *verbs.CQ
	qp       *verbs.QP
	mr       *verbs.MR
	conn     *cm.Conn
	wc       []verbs.WorkCompletion
}

// newNode makes a node's objects and posts its receives, with the QP in
// Init, before it is connected: the peer may send as soon as it is.
func newNode(dev *verbs.Context, pd *verbs.PD, cfg config) (n *node, err error) {
	n = &node{cfg: cfg, wc: make([]verbs.WorkCompletion, 8)}
	defer func() {
		if err != nil {
			n.close()
		}
	}()
	if n.scq, err = dev.CreateCQ(cfg.messages); err != nil {
		return nil, err
	}
	if n.rcq, err = dev.CreateCQ(cfg.messages); err != nil {
		return nil, err
	}
	if n.qp, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: n.scq, RecvCQ: n.rcq,
		Cap: verbs.QPCap{MaxSendWR: uint32(cfg.messages), MaxRecvWR: uint32(cfg.messages), MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	if err = n.qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite},
		verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
		return nil, err
	}
	if n.mr, err = pd.AllocMR(cfg.size, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	recvs := make([]verbs.RecvWR, cfg.messages)
	for i := range recvs {
		recvs[i] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{n.mr.SGE(0, cfg.size)}}
	}
	if _, err = n.qp.PostRecv(recvs); err != nil {
		return nil, fmt.Errorf("post receives: %w", err)
	}
	return n, nil
}

// postSends posts the node's messages, each signaled (cmatose's QPs
// signal every send).
func (n *node) postSends() error {
	sends := make([]verbs.SendWR, n.cfg.messages)
	for i := range sends {
		sends[i] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{n.mr.SGE(0, n.cfg.size)}}
	}
	_, err := n.qp.PostSend(sends)
	return err
}

// await takes the node's cfg.messages completions from cq, each a
// success and, for receives, of a whole message.
func (n *node) await(ctx context.Context, cq *verbs.CQ, what string, conn int) error {
	for got := 0; got < n.cfg.messages; {
		k, err := cq.Wait(ctx, n.wc[:min(len(n.wc), n.cfg.messages-got)])
		if err != nil {
			return fmt.Errorf("connection %d: %d of %d %s completions: %w", conn+1, got, n.cfg.messages, what, err)
		}
		for _, wc := range n.wc[:k] {
			switch {
			case wc.Status != verbs.WCSuccess:
				return fmt.Errorf("connection %d: %s %d failed: %v", conn+1, what, wc.WRID, wc.Status)
			case wc.Opcode == verbs.WCRecv && wc.ByteLen != uint32(n.cfg.size):
				return fmt.Errorf("connection %d: received %d bytes, want %d", conn+1, wc.ByteLen, n.cfg.size)
			}
		}
		got += k
	}
	return nil
}

// close disconnects and releases the node's objects.
func (n *node) close() {
	if n.conn != nil {
		n.conn.Close()
	}
	var errs []error
	if n.qp != nil {
		errs = append(errs, n.qp.Destroy())
	}
	if n.mr != nil {
		errs = append(errs, n.mr.Dereg())
	}
	for _, cq := range []*verbs.CQ{n.scq, n.rcq} {
		if cq != nil {
			errs = append(errs, cq.Destroy())
		}
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "cmatose: releasing a connection's objects:", err)
	}
}
