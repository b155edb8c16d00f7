package soft

import "github.com/goverbs/goverbs/verbs/driver"

// Admit checks that a context (or PD) may take one more object of a kind
// of which it holds n and its device allows max: ErrClosed once closed
// (or released), ErrNoResources at the limit.
func Admit(closed bool, n, max int) error {
	if closed {
		return driver.ErrClosed
	}
	if n >= max {
		return driver.ErrNoResources
	}
	return nil
}

// Release ends an object counted in n, once: it marks it released and
// counts it out, or returns ErrClosed if it already was released.
func Release(released *bool, n *int) error {
	if *released {
		return driver.ErrClosed
	}
	*released = true
	*n--
	return nil
}
