package daemon

// WatchInterest is the watch publisher's interest check on subject; false
// when the node has none.
func (d *Daemon) WatchInterest(subject string) bool {
	f := d.watchInterest()
	return f != nil && f(subject)
}

// GrepLines is the lines of out that contain s (logs_join_test.go).
func GrepLines(out, s string) string { return grepLines(out, s) }
