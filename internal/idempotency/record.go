// Package idempotency makes an operation run at most once per intent.
//
// An intent is named by its Scope: the tenant, the operation and the
// client's Idempotency-Key. The first request claims the scope with a unique
// insert and executes; later requests with the same scope replay the stored
// outcome, are told the first is still in flight, or are refused when their
// parameters differ. The package knows nothing of orders: the use cases call
// ClaimOrReplay and Complete inside their own transaction, so the record and
// the business write commit together.
package idempotency

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/orderservice/orderservice/internal/problem"
)

// State is where a record is in its life:
//
//	ABSENT -> PROCESSING -> SUCCEEDED | FAILED_RETRYABLE | FAILED_FINAL
//
// FAILED_RETRYABLE goes back to PROCESSING when a retry or the sweeper takes
// the intent over.
type State string

// The four stored states.
const (
	Processing      State = "PROCESSING"
	Succeeded       State = "SUCCEEDED"
	FailedRetryable State = "FAILED_RETRYABLE"
	FailedFinal     State = "FAILED_FINAL"
)

// Definitive reports whether s holds an outcome that is replayed as it is.
func (s State) Definitive() bool { return s == Succeeded || s == FailedFinal }

// RecoveryPoint is the last step of an intent that committed, stored on its
// record in the transaction that made the step: whoever resumes the intent
// (a retry, the sweeper) picks it up there, switching on the stored value
// rather than inferring it from what else is in the database (the atomic
// phases of Brandur Leach's "Implementing Stripe-like Idempotency Keys in
// Postgres"). The package names the first and the last point; the steps
// between are the use case's own (order's paymentCreated), written with
// Store.Advance.
type RecoveryPoint string

const (
	// Started: the intent is claimed and nothing else of it committed.
	Started RecoveryPoint = "started"
	// Finished: the outcome is stored (Complete, Insert); only a definitive
	// record is finished.
	Finished RecoveryPoint = "finished"
)

// Scope names one intent. The database's primary key is exactly this triple.
type Scope struct {
	TenantID  string
	Operation string
	Key       string
}

// Intent is a Scope with what the request asks for: its fingerprint, and the
// resource it acts on when that is known before execution.
type Intent struct {
	Scope
	Fingerprint string
	ResourceID  string
}

// Record is one row of idempotency_records.
type Record struct {
	TenantID       string `gorm:"primaryKey"`
	Operation      string `gorm:"primaryKey"`
	IdempotencyKey string `gorm:"primaryKey"`
	Fingerprint    string
	State          State
	ResourceID     *string
	// Outcome, ResultCode and ResultBody hold the stored Result of a
	// definitive record (see Result).
	Outcome        *Outcome
	ResultCode     *string
	ResultBody     []byte
	LeaseToken     int64
	LeaseExpiresAt *time.Time
	Attempts       int
	// RecoveryPoint is where a resumed attempt picks the intent up.
	RecoveryPoint RecoveryPoint
	// Waiting is set by a duplicate that waits for the outcome (Prefer:
	// wait): moving the record on then notifies it (a trigger:
	// migrations/006_record_waiters.up.sql).
	Waiting     bool
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt *time.Time
	ExpiresAt   *time.Time
	// Resumable is false for an intent executed in one transaction (see
	// Store.Insert): it never had a lease or a PROCESSING version.
	Resumable bool
}

// TableName tells GORM the table the migration created.
func (Record) TableName() string { return "idempotency_records" }

// Scope returns the triple that names the record's intent.
func (r *Record) Scope() Scope {
	return Scope{TenantID: r.TenantID, Operation: r.Operation, Key: r.IdempotencyKey}
}

// Resource is the bound resource id, or "".
func (r *Record) Resource() string { return deref(r.ResourceID) }

// Expiry is when a finished record may be removed, or nil while it is
// unfinished (the claim already wrote a provisional expires_at).
func (r *Record) Expiry() *time.Time {
	if !r.State.Definitive() {
		return nil
	}
	return r.ExpiresAt
}

// Result returns the stored outcome of a definitive record, as it was
// first returned, marked Replayed.
func (r *Record) Result() (Result, error) {
	if r.Outcome == nil {
		return Result{}, fmt.Errorf("idempotency: record %s/%s holds no result", r.Operation, r.IdempotencyKey)
	}
	res := Result{Outcome: *r.Outcome, Resource: r.Resource(), Replayed: true}
	if res.Outcome != OutcomeFailed {
		res.Body = r.ResultBody
		return res, nil
	}
	res.Failure = &problem.Error{}
	if err := json.Unmarshal(r.ResultBody, res.Failure); err != nil {
		return Result{}, fmt.Errorf("idempotency: record %s/%s: stored failure: %w", r.Operation, r.IdempotencyKey, err)
	}
	return res, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
