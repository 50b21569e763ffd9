package loglimit

import (
	"sync"
	"time"
)

// Limiter lets through at most Burst lines per Per (a second when zero)
// and counts the rest, which the next line let through reports. The zero
// value is not usable: set Burst. A nil *Limiter lets everything through.
type Limiter struct {
	Burst int
	// Per is the window Burst counts in: a second when zero; longer for a
	// retry that goes on for as long as something is down.
	Per time.Duration

	mu         sync.Mutex // guards the fields below
	window     time.Time
	n          int
	suppressed int
}

// Allow reports whether a line may be written at now, and how many were
// suppressed since the last one that was.
func (l *Limiter) Allow(now time.Time) (ok bool, suppressed int) {
	if l == nil {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	per := l.Per
	if per <= 0 {
		per = time.Second
	}
	if now.Sub(l.window) >= per {
		l.window, l.n = now, 0
	}
	if l.n >= l.Burst {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}
