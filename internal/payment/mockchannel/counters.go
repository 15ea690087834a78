package mockchannel

import (
	"context"
	"math/rand/v2"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/payment"
)

// Stats counts what the channel did; tests assert on exact numbers.
type Stats struct {
	// Charges counts succeeded charges made.
	Charges int64 `json:"charges"`
	// Declined counts declined charges made.
	Declined int64 `json:"declined"`
	// Pending counts charges taken on (pending, or requiring action) and
	// not settled yet.
	Pending int64 `json:"pending"`
	// Refunds counts refunds that succeeded.
	Refunds int64 `json:"refunds"`
	// RefundsPending counts refunds made pending and not settled yet.
	RefundsPending int64 `json:"refunds_pending"`
	// RefundsFailed counts refunds made with status failed.
	RefundsFailed int64 `json:"refunds_failed"`
	// DuplicatesAbsorbed counts POSTs answered from an idempotency record.
	DuplicatesAbsorbed int64 `json:"duplicates_absorbed"`
	// Lookups counts GET /v1/charges and GET /v1/refunds requests.
	Lookups int64 `json:"lookups"`
	// Requests counts every POST to /v1.
	Requests int64 `json:"requests"`
	// LostResponses counts responses dropped on purpose.
	LostResponses int64 `json:"lost_responses"`
	// UnavailableResponses counts 503s given on purpose.
	UnavailableResponses int64 `json:"unavailable_responses"`
	// AmountCharged sums the amounts of succeeded charges.
	AmountCharged int64 `json:"amount_charged"`
	// AmountRefunded sums the amounts of the refunds that succeeded.
	AmountRefunded int64 `json:"amount_refunded"`
}

// ChargeRecord is a charge with how the channel saw it used, for tests.
type ChargeRecord struct {
	payment.Charge
	// Requests counts the POSTs made with the charge's idempotency key.
	Requests int `json:"requests"`
	// AmountRefunded sums the refunds made against the charge, pending ones
	// included.
	AmountRefunded int64 `json:"amount_refunded"`
}

// The counters that are not rows of the ledger (see the counters table).
const (
	counterRequests    = "requests"
	counterLookups     = "lookups"
	counterDuplicates  = "duplicates_absorbed"
	counterLost        = "lost_responses"
	counterUnavailable = "unavailable_responses"
)

// counterShards is how many rows one counter is spread over, so that
// concurrent requests rarely wait for each other's increment.
const counterShards = 8

// post is one POST as the counters see it. It is counted exactly once: in
// the transaction that records its effect when it has one, so that a charge
// costs one commit, or else on its own before its answer is written.
type post struct {
	kind    opKind
	key     string // empty when the key is invalid: then not counted per key
	counted bool
}

// count adds one to a counter.
func (s *store) count(ctx context.Context, name string) error {
	return ledgerErr(countIn(s.db.WithContext(ctx), name))
}

func countIn(tx *gorm.DB, name string) error {
	return tx.Exec(`INSERT INTO counters (name, shard, value) VALUES (?, ?, 1)
		ON CONFLICT (name, shard) DO UPDATE SET value = counters.value + 1`, name, rand.IntN(counterShards)).Error
}

// countPostIn counts p, and the POSTs of its key, in tx; the caller marks it
// counted once tx has committed.
func countPostIn(tx *gorm.DB, p *post) error {
	if p.key != "" {
		err := tx.Exec(`INSERT INTO attempts (kind, idempotency_key, requests) VALUES (?, ?, 1)
			ON CONFLICT (kind, idempotency_key) DO UPDATE SET requests = attempts.requests + 1`, p.kind, p.key).Error
		if err != nil {
			return err
		}
	}
	return countIn(tx, counterRequests)
}

// countPost counts p unless it was counted with its effect.
func (s *store) countPost(ctx context.Context, p *post) error {
	if p.counted {
		return nil
	}
	if err := database.Transact(ctx, s.db, func(tx *gorm.DB) error { return countPostIn(tx, p) }); err != nil {
		return ledgerErr(err)
	}
	p.counted = true
	return nil
}

// countReplay counts p as a duplicate answered from its idempotency record.
func (s *store) countReplay(ctx context.Context, p *post) error {
	err := database.Transact(ctx, s.db, func(tx *gorm.DB) error {
		if !p.counted {
			if err := countPostIn(tx, p); err != nil {
				return err
			}
		}
		return countIn(tx, counterDuplicates)
	})
	if err != nil {
		return ledgerErr(err)
	}
	p.counted = true
	return nil
}

// stats reads every counter in one statement, so they agree with each other.
func (s *store) stats(ctx context.Context) (Stats, error) {
	var st Stats
	err := s.db.WithContext(ctx).Raw(`SELECT
			(SELECT count(*) FROM charges WHERE status = 'succeeded') AS charges,
			(SELECT count(*) FROM charges WHERE status = 'declined') AS declined,
			(SELECT count(*) FROM charges WHERE status IN ('pending', 'requires_action')) AS pending,
			(SELECT count(*) FROM refunds WHERE status = 'succeeded') AS refunds,
			(SELECT count(*) FROM refunds WHERE status = 'pending') AS refunds_pending,
			(SELECT count(*) FROM refunds WHERE status = 'failed') AS refunds_failed,
			(SELECT coalesce(sum(amount), 0) FROM charges WHERE status = 'succeeded') AS amount_charged,
			(SELECT coalesce(sum(amount), 0) FROM refunds WHERE status = 'succeeded') AS amount_refunded,
			coalesce(sum(value) FILTER (WHERE name = ?), 0) AS duplicates_absorbed,
			coalesce(sum(value) FILTER (WHERE name = ?), 0) AS lookups,
			coalesce(sum(value) FILTER (WHERE name = ?), 0) AS requests,
			coalesce(sum(value) FILTER (WHERE name = ?), 0) AS lost_responses,
			coalesce(sum(value) FILTER (WHERE name = ?), 0) AS unavailable_responses
		FROM counters`, counterDuplicates, counterLookups, counterRequests, counterLost, counterUnavailable).Scan(&st).Error
	return st, ledgerErr(err)
}

// chargeRecords lists the charges made, oldest first.
func (s *store) chargeRecords(ctx context.Context) ([]ChargeRecord, error) {
	var rows []struct {
		Row      chargeRow `gorm:"embedded"`
		Requests int
	}
	err := s.db.WithContext(ctx).Raw(`SELECT c.idempotency_key, c.id, c.status, c.amount, c.currency, c.reference,
			c.payment_method, c.amount_refunded, c.created_at, coalesce(a.requests, 0) AS requests
		FROM charges c LEFT JOIN attempts a ON a.kind = ? AND a.idempotency_key = c.idempotency_key
		ORDER BY c.seq`, opCharge).Scan(&rows).Error
	if err != nil {
		return nil, ledgerErr(err)
	}
	out := make([]ChargeRecord, 0, len(rows))
	for _, r := range rows {
		out = append(out, ChargeRecord{Charge: r.Row.charge(), Requests: r.Requests, AmountRefunded: r.Row.AmountRefunded})
	}
	return out, nil
}
