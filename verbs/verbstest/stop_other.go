//go:build !unix

package verbstest

import "errors"

// stopProcess reports that processes are not stopped here.
func stopProcess(int) (func(), error) {
	return nil, errors.New("stopping a process is not supported on this system")
}
