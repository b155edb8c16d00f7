package rlog

import "testing"

// TestHelloDuringFirstWriteOfEpoch: a receiver's HELLO is answered while
// the new primary writes the first record of its epoch. The receiver
// (the old primary) holds records 1-10 of epoch 1, the last two never
// committed; the primary of epoch 2 holds 1-8 and writes its own 9
// between hello's two reads (of what it has written, and of its log's
// history). START must keep 8: a receiver told to keep 9 keeps its own
// record 9 of epoch 1, reports it durable, and the primary counts it for
// its record 9 of epoch 2, which a later promotion of that receiver
// loses.
func TestHelloDuringFirstWriteOfEpoch(t *testing.T) {
	l := openTestLog(t, t.TempDir(), logOptions{noSync: true})
	if err := l.append(frames(1, 8, 1, recData)); err != nil {
		t.Fatal(err)
	}
	m := &Member{cfg: Config{Logf: t.Logf, Listen: "primary"}, log: l}
	p := &primary{m: m, epoch: 2, epochStart: 9, visible: 8, replicas: make([]ReplicaStatus, 3)}
	hello := putHello(make([]byte, ctrlSize), 1, 1, 10, 10, []epochStart{{epoch: 1, first: 1}})
	defer func(f func()) { testHookHelloReads = f }(testHookHelloReads)
	testHookHelloReads = func() {
		// The appender's first flush of epoch 2.
		if err := l.append(frames(9, 1, 2, recData)); err != nil {
			t.Error(err)
		}
		p.mu.Lock()
		p.visible = 9
		p.mu.Unlock()
	}
	s := &sender{m: m, p: p, idx: 1}
	helloUntilStart(s, hello)
	if s.truncate != 8 {
		t.Errorf("START keeps the receiver's records up to %d; its record 9 is of epoch 1, the primary's of epoch 2: want 8", s.truncate)
	}
}

// helloUntilStart runs s.hello as far as its START: s has no registered
// memory to send it from (the START panics or fails), and what the test
// looks at, s.truncate, is set before.
func helloUntilStart(s *sender, m msg) {
	defer func() { recover() }()
	s.hello(m)
}
