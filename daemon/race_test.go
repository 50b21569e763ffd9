//go:build race

package daemon_test

// raceEnabled is true under -race, which makes every request several
// times as costly: latency comparisons under a CPU-bound flood measure the
// detector there, not the node, and are skipped.
const raceEnabled = true
