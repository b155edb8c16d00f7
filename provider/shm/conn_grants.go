package shm

import "github.com/goverbs/goverbs/verbs/driver"

// Grants over the control socket: a requester asks for a key its peer's
// grant table lacks, and the owner grants it or counts a strike.

// serveKey answers the peer's request for a key its grant table lacks
// (the table is filled as regions become reachable, so this is a key
// that races its registration, or a wrong one): granted, and written into
// the QP's grant table, if it names a region of the QP's PD that peers
// may reach; refused otherwise, which counts against the peer in the
// listener's guard, and once the guard refuses the peer, the connection
// ends.
func (c *conn) serveKey(key uint32) {
	q, ctx := c.q, c.q.ctx
	ctx.mu.RLock()
	m := ctx.lookupMR(key)
	ok := m != nil && q.reaches(m)
	if ok {
		q.grantMu.Lock()
		ok = q.grantConn == c && q.grantLocked(key)
		q.grantMu.Unlock()
	}
	ctx.mu.RUnlock()
	c.answerKey(msgKey, key, ok)
}

// answerKey answers the peer's ask about key with msg (granted or not),
// and counts a refusal against the peer: once its guard cuts it off, its
// QP fails, and this side's with it when the socket ends (handleEvents).
func (c *conn) answerKey(msg uint8, key uint32, ok bool) {
	granted := uint32(0)
	if ok {
		granted = 1
	}
	c.sendCtrl(msg, key, granted)
	if !ok && c.guard != nil && c.guard.Fail(c.peerID) > 0 {
		c.peerError(driver.EventQPAccessErr)
		c.sock.CloseWrite()
		c.sock.CloseRead()
	}
}

// askKey asks the peer to grant key and waits for the answer, within the
// WR's bound on waits (segWait); true if the peer granted it, which it
// then wrote into its grant table. q.mu is held.
func (c *conn) askKey(key uint32) bool {
	if c.refusedSet && c.refused == key {
		return false
	}
	for len(c.keyAck) > 0 {
		<-c.keyAck // an answer that came too late for an earlier ask
	}
	c.sendCtrl(msgGetKey, key, 0)
	t := c.waitTimer()
	defer t.Stop()
	for {
		select {
		case a := <-c.keyAck:
			if a[0] == key {
				if a[1] != 1 {
					c.refused, c.refusedSet = key, true
				}
				return a[1] == 1
			}
		case <-c.done:
			return false
		case <-c.gone:
			return false
		case <-t.C:
			return false
		}
	}
}
