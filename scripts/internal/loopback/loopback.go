// Package loopback opens the raw loopback TCP sockets on which the floor
// scripts (scripts/tcpfloor, scripts/tcprrfloor) measure, and starts the
// other process of a measurement: the same program, given its arguments.
package loopback

import (
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

// Listen opens a socket listening on 127.0.0.1, at a port the kernel
// picks, with room for backlog connections not yet accepted; the caller
// closes fd.
func Listen(backlog int) (fd, port int, err error) {
	fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	if err = unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err == nil {
		err = unix.Listen(fd, backlog)
	}
	var sa unix.Sockaddr
	if err == nil {
		sa, err = unix.Getsockname(fd)
	}
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, sa.(*unix.SockaddrInet4).Port, nil
}

// Dial connects a new socket, blocking, to 127.0.0.1:port; the caller
// closes it.
func Dial(port int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// StartChild starts this program again with args, its standard error
// this process's; the caller waits for it.
func StartChild(args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}
