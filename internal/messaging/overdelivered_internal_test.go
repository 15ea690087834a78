package messaging

import (
	"strings"
	"testing"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// A command delivered more often than COMMAND_MAX_DELIVER is judged by its
// intent's record: answered or retryable, it goes on (replayed, or run
// again); in flight, it waits for its owner or the sweeper, unrun; never
// begun, it is dead-lettered with what the record shows.
func TestAnOverDeliveredCommandIsJudgedByItsRecord(t *testing.T) {
	for state, want := range map[idempotency.State]struct {
		reason   string
		inFlight bool
	}{
		idempotency.Succeeded:       {},
		idempotency.FailedFinal:     {},
		idempotency.FailedRetryable: {},
		idempotency.Processing:      {inFlight: true},
		"":                          {reason: "no run recorded its intent"},
	} {
		got, inFlight := overDelivered(6, state)
		if inFlight != want.inFlight || (want.reason == "") != (got == "") || !strings.Contains(got, want.reason) ||
			want.reason != "" && !strings.Contains(got, "delivered 6 times") {
			t.Errorf("%q: reason %q, in flight %v; want %q, %v", state, got, inFlight, want.reason, want.inFlight)
		}
	}
}
