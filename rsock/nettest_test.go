package rsock

import (
	"net"
	"testing"

	"golang.org/x/net/nettest"
)

// TestConnConformance runs x/net/nettest's net.Conn suite (deadlines,
// close while blocked, concurrent calls, ...) on every provider, with
// control messages as immediate data and as Sends.
func TestConnConformance(t *testing.T) {
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{{"imm", Config{}}, {"send", Config{noImm: true}}} {
			t.Run(scheme+"/"+mode.name, func(t *testing.T) {
				nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
					cfg := mode.cfg
					l, err := cfg.Listen(listenAddr(t, scheme))
					if err != nil {
						return nil, nil, nil, err
					}
					defer l.Close()
					a, d, err := connectVia(l, &cfg)
					if err != nil {
						return nil, nil, nil, err
					}
					return d, a, func() { d.Close(); a.Close() }, nil
				})
			})
		}
	}
}
