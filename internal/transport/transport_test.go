package transport_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/internal/transport"
)

func TestACancelledRequestIsRetryableNotAnInternalError(t *testing.T) {
	for _, err := range []error{context.Canceled, fmt.Errorf("settle: %w", context.Canceled)} {
		p := transport.Problem(err)
		if p.Code != problem.ServiceUnavailable || p.RetryAfter <= 0 || !transport.Transient(p) {
			t.Errorf("Problem(%v) = %s (Retry-After %s), want a retryable service_unavailable", err, p.Code, p.RetryAfter)
		}
	}
}
