package testkit

import (
	"testing"
	"time"
)

// pollInterval is how often Eventually asks its condition again.
const pollInterval = 5 * time.Millisecond

// Eventually polls cond until it holds. If it still does not hold once
// within has passed, the test fails with a message naming what it waited
// for. cond runs on the caller's goroutine, so it may call t.Fatal.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(pollInterval)
	}
}
