package matcher

// BookedJob records a booking of job as a batch of this process does.
func (m *Matcher) BookedJob(job string) { m.bookedJob(job) }
