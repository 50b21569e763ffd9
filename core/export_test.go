package core

// SetRequestLimitForTest makes m's request records full at n instead of
// MaxRequestRecords, so that tests reach a full table with a few records.
// Every replica of one test must be given the same limit.
func (m *Machine) SetRequestLimitForTest(n int) { m.req.limit = n }
