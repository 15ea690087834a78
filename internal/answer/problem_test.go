package answer_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/problem"
)

func TestACancelledRequestIsRetryableNotAnInternalError(t *testing.T) {
	for _, err := range []error{context.Canceled, fmt.Errorf("settle: %w", context.Canceled)} {
		p := answer.Problem(err)
		if p.Code != problem.ServiceUnavailable || p.RetryAfter <= 0 || !answer.Transient(p) {
			t.Errorf("Problem(%v) = %s (Retry-After %s), want a retryable service_unavailable", err, p.Code, p.RetryAfter)
		}
	}
}
