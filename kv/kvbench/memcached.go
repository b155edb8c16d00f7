package kvbench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"time"
)

// Memcached is a minimal client of memcached's text protocol (get, set),
// for comparison: one connection, one request at a time.
type Memcached struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	line []byte
}

// DialMemcached connects to memcached at addr (host:port).
func DialMemcached(addr string) (*Memcached, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &Memcached{conn: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10)}, nil
}

// Close closes the connection.
func (m *Memcached) Close() error { return m.conn.Close() }

// Put stores value under key (set).
func (m *Memcached) Put(key, value []byte) error {
	m.line = append(m.line[:0], "set "...)
	m.line = append(m.line, key...)
	m.line = append(m.line, " 0 0 "...)
	m.line = strconv.AppendInt(m.line, int64(len(value)), 10)
	m.line = append(m.line, "\r\n"...)
	m.w.Write(m.line)
	m.w.Write(value)
	m.w.WriteString("\r\n")
	if err := m.w.Flush(); err != nil {
		return err
	}
	resp, err := m.r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.Equal(resp, []byte("STORED\r\n")) {
		return fmt.Errorf("memcached set: %q", resp)
	}
	return nil
}

// GetInto fetches key into dst (get) and returns the value's length.
func (m *Memcached) GetInto(key, dst []byte) (int, error) {
	m.line = append(m.line[:0], "get "...)
	m.line = append(m.line, key...)
	m.line = append(m.line, "\r\n"...)
	m.w.Write(m.line)
	if err := m.w.Flush(); err != nil {
		return 0, err
	}
	hdr, err := m.r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if bytes.Equal(hdr, []byte("END\r\n")) {
		return 0, errors.New("memcached: key not found")
	}
	// VALUE <key> <flags> <bytes>\r\n
	f := bytes.Fields(hdr)
	if len(f) < 4 || !bytes.Equal(f[0], []byte("VALUE")) {
		return 0, fmt.Errorf("memcached get: %q", hdr)
	}
	n, err := strconv.Atoi(string(f[3]))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("memcached get: %q", hdr)
	}
	if n > len(dst) {
		return 0, fmt.Errorf("memcached get: %d-byte value, buffer of %d", n, len(dst))
	}
	if _, err := io.ReadFull(m.r, dst[:n]); err != nil {
		return 0, err
	}
	if _, err := m.r.Discard(2 + len("END\r\n")); err != nil {
		return 0, err
	}
	return n, nil
}

// StartMemcached starts a memcached server on 127.0.0.1 at a free port,
// and returns its address and process. It fails if memcached is not
// installed (Debian package memcached).
func StartMemcached() (string, *exec.Cmd, error) {
	path, err := exec.LookPath("memcached")
	if err != nil {
		return "", nil, fmt.Errorf("memcached is not installed (apt-get install memcached): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := l.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	l.Close()
	cmd := exec.Command(path, "-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "1024", "-u", "root")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, cmd, nil
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			return "", nil, fmt.Errorf("memcached did not start listening on %s", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
