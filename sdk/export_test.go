package sdk

import "time"

// WithKeepAliveAlign sets the grid of session keepalives (0: each exactly
// when due), for tests and benchmarks that compare the two.
func WithKeepAliveAlign(d time.Duration) Option {
	return func(c *config) { c.keepAliveAlign = d }
}

// WithAttemptHook observes every attempt (withAttemptHook).
func WithAttemptHook(f func(op string, attempt int, err error)) Option {
	return withAttemptHook(f)
}
