package core

// SetRequestLimitForTest makes m's request records full at n instead of
// MaxRequestRecords, so that tests reach a full table with a few records.
// Every replica of one test must be given the same limit.
func (m *Machine) SetRequestLimitForTest(n int) { m.req.limit = n }

// SetSessionLimitsForTest makes m's sessions full at sessions instead of
// MaxSessions, a session's locks at locksPerSession instead of
// MaxLocksPerSession and the delayed keys at delays instead of
// MaxDelayedKeys (0: the real bound). Every replica of one test must be
// given the same limits.
func (m *Machine) SetSessionLimitsForTest(sessions, locksPerSession, delays int) {
	m.sess.limits = sessionLimits{sessions, locksPerSession, delays}
}

// The smallest encodings the decoders assume, for a test to check.
const (
	MinSessionSizeForTest = minSessionSize
	MinDelaySizeForTest   = minDelaySize
)

// SetMaxHoldersForTest makes a read/write key full at n shared holders
// and delayed slots instead of MaxHoldersPerKey (0: the real bound).
// Every replica of one test must be given the same limit.
func (m *Machine) SetMaxHoldersForTest(n int) { m.kinds.maxHolders = n }
