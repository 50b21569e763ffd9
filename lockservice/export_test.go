package lockservice

// IndexesDiff (tests of other packages' clusters) says how this leader's
// timers, multi-holder views and session timers differ from its applied
// state: "" when they agree (leaderIndexesDiff).
func (s *Service) IndexesDiff() string { return leaderIndexesDiff(s) }
