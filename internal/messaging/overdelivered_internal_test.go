package messaging

import (
	"strings"
	"testing"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// A command delivered more often than COMMAND_MAX_DELIVER is judged by its
// intent's record: answered or retryable, it goes on (replayed, or run
// again); in flight or never begun, it is dead-lettered with what the
// record shows.
func TestAnOverDeliveredCommandIsJudgedByItsRecord(t *testing.T) {
	for state, want := range map[idempotency.State]string{
		idempotency.Succeeded:       "",
		idempotency.FailedFinal:     "",
		idempotency.FailedRetryable: "",
		idempotency.Processing:      "still PROCESSING",
		"":                          "no run recorded its intent",
	} {
		got := overDelivered(6, state)
		if (want == "") != (got == "") || !strings.Contains(got, want) || want != "" && !strings.Contains(got, "delivered 6 times") {
			t.Errorf("%q: reason %q, want one saying %q", state, got, want)
		}
	}
}
