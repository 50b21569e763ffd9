package natsapi

// SubscribeLockSubjects subscribes s to the lock subjects whatever its
// role, as a deposed leader still is until its next check: tests of the
// hand-over window use it (the next check undoes it on a follower).
func SubscribeLockSubjects(s *Service) error { return s.reconcileLeaderSubs(true) }
