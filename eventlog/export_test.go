package eventlog

// MemberLookups reports the membership lookups the send path waited for
// and those refresh made in the background.
func (l *Log) MemberLookups() (waited, refreshed int64) {
	return l.members.waited.Load(), l.members.refreshed.Load()
}
