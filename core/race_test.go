//go:build race

package core_test

// raceEnabled is true under -race. Nothing in core runs concurrently, so
// the race detector only slows the long randomized tests; they run a
// prefix of their sequences there (the full set runs without -race).
const raceEnabled = true
