package faults

import (
	"testing"
	"time"
)

// TestProcessSessions: sessions under kill -9 of the leader with real
// `ticketd serve` processes (issue 24 item 4). Every crash-leader kills a
// session holder's client first, so that session is neither kept alive
// nor closed: the new leader must re-arm it with its full TTL, end it
// after that, and keep its key through the lock-delay; the other holders'
// sessions must survive the leader change. The lock workload runs beside
// it and the usual checkers judge it too. TestProcessFaults (and its long
// run) runs the same sessions workload under every process-level fault.
func TestProcessSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("process-level sessions run skipped in -short mode")
	}
	cfg := testConfig(t, modeProcess)
	cfg.Name = "process-sessions"
	cfg.Rounds, cfg.RoundDuration, cfg.Clients = 1, 14*time.Second, 4
	cfg.Kinds, cfg.MaxFaultsPerRound = []string{FaultCrashLeader}, 3
	cfg.Sessions = true
	c := mustStartProcesses(t, cfg.OutDir, cfg.Nodes)
	h := NewHistory()
	rep := run(cfg, c, h)
	c.close()
	if rep.Faults[FaultCrashLeader] == 0 {
		t.Errorf("no leader was killed")
	}
	finish(t, cfg, h, rep)
	// The run must have exercised what it claims: a session whose client
	// died with the leader, and grants judged against holds.
	if rep.sessions == nil {
		t.Fatal("no sessions history")
	}
	res := CheckSessions(*rep.sessions)
	withLeader := 0
	for _, hd := range rep.sessions.Holds {
		if hd.DiedWithLeader {
			withLeader++
		}
	}
	if withLeader == 0 || res.Judged == 0 || len(res.Regrants) == 0 {
		t.Errorf("the run exercised too little: %d holders died with the leader, %d grant/hold pairs judged, %d dead holders' keys regranted", withLeader, res.Judged, len(res.Regrants))
	}
}
