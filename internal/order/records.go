package order

import (
	"context"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// The teaching views of the idempotency layer: what the service remembers
// about an intent, and for how long it remembers.

// IdempotencyRecords returns the tenant's records for one key, one per
// operation it was sent with: "what did the service remember about this
// intent?". The key is taken literally, in its stored, unquoted form.
func (s *Service) IdempotencyRecords(ctx context.Context, tenantID, key string) ([]idempotency.Record, error) {
	if err := idempotency.CheckKey(key); err != nil {
		return nil, invalid("key", "must be an idempotency key")
	}
	return s.Records.Find(s.DB.WithContext(ctx), tenantID, key)
}

// PolicyView is the retention policy in force, with where each replay
// window comes from and how long published outbox events are kept.
type PolicyView struct {
	idempotency.PolicyView
	WindowSources   map[string]string `json:"window_sources,omitempty"`
	OutboxRetention string            `json:"outbox_retention,omitempty"`
}

// IdempotencyPolicy shows the retention policy in force and how it follows
// from the replay windows.
func (s *Service) IdempotencyPolicy() PolicyView {
	v := PolicyView{PolicyView: s.Records.Policy.Describe(s.Records.Lease), WindowSources: s.WindowSources}
	if s.OutboxRetention > 0 {
		v.OutboxRetention = s.OutboxRetention.String()
	}
	return v
}
