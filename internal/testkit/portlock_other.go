//go:build !unix

package testkit

// claimPort claims nothing where there is no flock: the pid-chosen blocks
// alone keep test processes apart.
func claimPort(int) bool { return true }
