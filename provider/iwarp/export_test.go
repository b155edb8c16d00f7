package iwarp

// SetMaxPayload makes FPDUs carry at most n bytes of payload, so that
// tests can cut messages into many segments; it returns a function that
// restores the default.
func SetMaxPayload(n int) (restore func()) {
	prev := maxPayload
	maxPayload = n
	return func() { maxPayload = prev }
}
