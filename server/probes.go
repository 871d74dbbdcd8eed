package server

// What tests and in-process benchmarks ask a running Server: its metrics,
// fan-out's backlog, and a hold on the notifier. Operators read the same
// metrics from the metrics listener (docs/operations.md).

// MetricSum returns the sum of every sample of the named metric in this
// process's registry (counters and gauges; 0 if absent).
func (s *Server) MetricSum(name string) float64 { return s.MetricWith(name, "", "") }

// MetricWith is MetricSum over the samples whose label has value (every
// sample if label is "").
func (s *Server) MetricWith(name, label, value string) float64 {
	mfs, err := s.reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == label && l.GetValue() == value)
			}
			if match {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// FanoutPending is how many committed events wait for fan-out (tests use
// it to wait until pushes went out).
func (s *Server) FanoutPending() int64 { return s.fan.Pending() }

// HoldNotifications keeps the notifier from claiming notification jobs
// until release is called (notify.Notifier.Hold): for tests that must let
// acks commit before notify_delay matters, whatever the host's speed.
func (s *Server) HoldNotifications() (release func()) { return s.notify.Hold() }
