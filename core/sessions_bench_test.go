package core_test

import (
	"fmt"
	"testing"

	"github.com/ticketd/ticketd/core"
)

// sessionFull is a cluster version 4 machine with one session holding
// MaxLocksPerSession locks (lock-delay delayMS) beside 100,000 plain locks.
func sessionFull(b *testing.B, delayMS uint64) *core.Machine {
	m := core.NewMachine()
	m.Apply(core.SetClusterVersion(4))
	for i := range 100_000 {
		m.Apply(core.Grant(fmt.Sprintf("plain/%06d", i), "o", 60_000, 1))
	}
	if r := m.Apply(core.OpenSession("acct", 10_000, delayMS)); r.Kind != core.ResultSessionOpened {
		b.Fatal(r)
	}
	for i := range core.MaxLocksPerSession {
		if r := m.Apply(core.Grant(fmt.Sprintf("sess/%05d", i), "o", 0, 1).InSession(1)); r.Kind != core.ResultGranted {
			b.Fatal(r)
		}
	}
	return m
}

// BenchmarkExpireSessionFull is the apply of the largest ExpireSession:
// MaxLocksPerSession locks ended and delayed in one command, on the raft
// loop of every replica.
func BenchmarkExpireSessionFull(b *testing.B) {
	for _, delay := range []uint64{0, 15_000} {
		b.Run(fmt.Sprintf("delay=%dms", delay), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				m := sessionFull(b, delay)
				b.StartTimer()
				if r := m.Apply(core.ExpireSession(1, 1)); r.Count != core.MaxLocksPerSession {
					b.Fatal(r)
				}
			}
		})
	}
}
