package main

import (
	"strings"
	"testing"

	"github.com/parley-im/parley/loadtest"
)

// TestUsageDescribesEveryScenario: the usage text (parley-load -h) gives
// every scenario the tool runs a description, and describes no other.
func TestUsageDescribesEveryScenario(t *testing.T) {
	names := loadtest.Scenarios()
	for _, name := range names {
		if strings.TrimSpace(scenarioHelp[name]) == "" {
			t.Errorf("scenario %q has no description in the usage text", name)
		}
	}
	if len(scenarioHelp) != len(names) {
		t.Errorf("the usage text describes %d scenarios, the tool runs %d (%v)", len(scenarioHelp), len(names), names)
	}
}
