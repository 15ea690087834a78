package idempotency

import (
	"context"
	"errors"
	"math"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/problem"
)

// ErrFenced is returned when a write names a lease token that is no longer
// current: another owner took the intent over, and this one must stop.
var ErrFenced = errors.New("idempotency: lease superseded by a newer owner")

// Store reads and writes idempotency records. Every method takes the
// transaction (or *gorm.DB) it runs in, chosen by the caller. Raw
// statements read their rows with Find, not Scan: GORM's Scan renders
// every statement with its values for its logger (logger.Recorder),
// whether anything logs or not, and these run on every request.
type Store struct {
	// Lease is how long an owner may work on an intent before a retry or
	// the sweeper may take it over.
	Lease time.Duration
	// PhaseTimeout bounds the in-flight phase of an intent that stays
	// PROCESSING between transactions (a payment's channel call): its
	// outcome is expected by then, which is what Retry-After tells a
	// duplicate. Zero means only the lease is known.
	PhaseTimeout time.Duration
	Policy       Policy
	// Removed, when set, is told each record the cleanup removes
	// (CleanupBatch), in the transaction that removes it: the order tests
	// record it as a step of the protocol (internal/order/steps). Nil in
	// production, where the cleanup only counts what it removed.
	Removed func(ctx context.Context, r Removed)
	// Attempt, when set, marks each attempt of the transaction the
	// Cleaner removes a batch in (database.TransactAttempts): the order
	// tests set it to steps.Attempt, so that a removal Removed was told of
	// stands only if its batch committed. Nil in production.
	Attempt database.Attempt
}

// Claim is the answer of ClaimOrReplay: either a stored outcome to replay,
// or the right to execute, fenced by Token.
type Claim struct {
	Record Record
	// Replay, when set, is the definitive outcome to send back unchanged.
	Replay *Result
	// ResumedFrom is set when an earlier attempt of this intent exists and
	// the caller resumes it rather than starting a new one: it is the state
	// the intent was taken over from. Processing means its owner died
	// mid-flight, FailedRetryable that it gave up cleanly on an unknown
	// outcome.
	ResumedFrom State
}

// Resumes reports whether the claim took over an earlier attempt.
func (c Claim) Resumes() bool { return c.ResumedFrom != "" }

// Token is the fencing token the caller must present to complete the intent.
func (c Claim) Token() int64 { return c.Record.LeaseToken }

// observed is a record with the database clock's view of its lease and of
// the time since its current owner took it (its in-flight phase began).
type observed struct {
	Record
	LeaseSecondsLeft float64
	OwnedForSeconds  float64
}

// ClaimOrReplay is the first step of an idempotent operation that spans
// several transactions (a payment: its record commits PROCESSING before the
// channel is called). It inserts a PROCESSING record for the intent under a
// lease; the primary key decides the race. When the scope is already taken it:
//   - refuses a different fingerprint (422 idempotency_key_reused),
//   - returns a definitive outcome for replay,
//   - answers 409 request_in_progress while another owner's lease runs,
//   - takes the intent over when the lease expired or the last attempt failed
//     retryably, bumping the fencing token.
//
// Inside a transaction, a duplicate of an uncommitted claim waits on the
// unique index until the first commits (then replays) or rolls back (then
// claims); lock_timeout bounds that wait and turns it into a 409. An
// operation done in one transaction does not claim: see Insert.
func (s *Store) ClaimOrReplay(tx *gorm.DB, in Intent) (Claim, error) {
	var rec Record
	res := tx.Raw(`
		INSERT INTO idempotency_records
			(tenant_id, operation, idempotency_key, fingerprint, state, resource_id, lease_token, lease_expires_at, attempts,
			 expires_at)
		VALUES (?, ?, ?, ?, 'PROCESSING', NULLIF(?, ''), 1, now() + make_interval(secs => ?), 1,
			now() + make_interval(secs => ?))
		ON CONFLICT DO NOTHING
		RETURNING lease_token, lease_expires_at, created_at`,
		in.TenantID, in.Operation, in.Key, in.Fingerprint, in.ResourceID, s.Lease.Seconds(),
		s.Policy.RetentionFor(in.Operation).Seconds()).Find(&rec)
	if res.Error != nil {
		return Claim{}, s.waitError(res.Error)
	}
	if res.RowsAffected == 1 { // ours: the rest of the row is what we just wrote
		rec.TenantID, rec.Operation, rec.IdempotencyKey = in.TenantID, in.Operation, in.Key
		rec.Fingerprint, rec.State, rec.Attempts, rec.UpdatedAt = in.Fingerprint, Processing, 1, rec.CreatedAt
		rec.RecoveryPoint = Started
		rec.Resumable = true
		if in.ResourceID != "" {
			rec.ResourceID = &in.ResourceID
		}
		return Claim{Record: rec}, nil
	}

	// The scope is taken: read it and decide.
	cur, err := s.current(tx, in.Scope)
	if err != nil {
		return Claim{}, err
	}
	return s.resolve(tx, in, cur)
}

// ErrTaken is Insert's answer when another transaction recorded the same
// intent first and committed: the caller's transaction holds a duplicate's
// work and must roll back; the request is then answered from that record.
var ErrTaken = errors.New("idempotency: the intent was recorded by another transaction first")

// Insert stores the definitive result of an intent executed in ONE
// transaction (a create, a ship, a deliver), inside the transaction that
// executes it. Nobody else can ever see such an intent unfinished (its
// writes and its record commit together or not at all), so it skips
// PROCESSING: the record is inserted SUCCEEDED (FAILED_FINAL for a refusal)
// with its result, one write and no lease, and the sweeper never needs to
// find it. When the result is known before the business write (a create),
// the record goes first, so a concurrent duplicate waits at its key before it
// does any work; otherwise (a transition) it goes last.
//
// The primary key still decides every race. A concurrent duplicate's insert
// waits on the first's uncommitted key: when the first commits, the insert
// does nothing and Insert returns ErrTaken (the caller rolls back and
// replays the first's result); when it rolls back, this insert goes ahead.
// lock_timeout bounds the wait and turns it into a 409.
func (s *Store) Insert(tx *gorm.DB, in Intent, result Result) error {
	outcome, code, body, err := result.stored()
	if err != nil {
		return err
	}
	res := tx.Exec(`
		INSERT INTO idempotency_records
			(tenant_id, operation, idempotency_key, fingerprint, state, resource_id, outcome, result_code, result_body,
			 lease_token, attempts, completed_at, expires_at, resumable, recovery_point)
		VALUES (?, ?, ?, ?, ?, NULLIF(?, ''), ?, ?, ?,
			1, 1, now(), now() + make_interval(secs => ?), false, 'finished')
		ON CONFLICT DO NOTHING`,
		in.TenantID, in.Operation, in.Key, in.Fingerprint, result.state(), result.Resource, outcome, code, body,
		s.Policy.RetentionFor(in.Operation).Seconds())
	if res.Error != nil {
		return s.waitError(res.Error)
	}
	if res.RowsAffected == 0 {
		return ErrTaken
	}
	return nil
}

// Replay is the read-only first look of a request: when the intent already
// has a definitive outcome, it returns that outcome to replay (or refuses a
// different fingerprint as idempotency_key_reused), in one autocommit SELECT
// by primary key, with no transaction and no write. When it returns nil, nil
// the caller goes on to execute (Record) or claim (ClaimOrReplay), whose
// unique insert still decides every execution: Replay only ever answers
// from an outcome already committed.
func (s *Store) Replay(db *gorm.DB, in Intent) (*Result, error) {
	var rec Record
	res := db.Raw(`
		SELECT tenant_id, operation, idempotency_key, fingerprint, state, resource_id, outcome, result_code, result_body
		FROM idempotency_records
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ? AND state IN ('SUCCEEDED', 'FAILED_FINAL')`,
		in.TenantID, in.Operation, in.Key).Find(&rec)
	if res.Error != nil || res.RowsAffected == 0 {
		return nil, res.Error
	}
	if rec.Fingerprint != in.Fingerprint {
		return nil, keyReused(in.Operation)
	}
	result, err := rec.Result()
	if err != nil {
		return nil, err
	}
	return &result, nil
}

// resolve decides what a request gets for a scope that is taken, from what
// was read of it. A lost takeover race means someone else moved the record
// since, so it is read again: the winner may already have finished, and then
// its outcome is the answer, not a 409.
func (s *Store) resolve(tx *gorm.DB, in Intent, cur observed) (Claim, error) {
	for race := 1; ; race++ {
		switch {
		case cur.TenantID == "": // removed by the cleanup since the insert saw it: come back and claim it
			return Claim{}, inProgress(1)
		case cur.Fingerprint != in.Fingerprint:
			return Claim{}, keyReused(in.Operation)
		case cur.State.Definitive():
			res, err := cur.Result()
			if err != nil {
				return Claim{}, err
			}
			return Claim{Record: cur.Record, Replay: &res}, nil
		case cur.State == Processing && cur.LeaseSecondsLeft > 0:
			return Claim{}, inProgress(s.expectedIn(cur))
		}
		claim, won, err := s.takeOver(tx, cur.Record)
		if err != nil || won {
			return claim, err
		}
		if race == maxTakeoverRaces {
			return Claim{}, inProgress(1)
		}
		if cur, err = s.current(tx, in.Scope); err != nil {
			return Claim{}, err
		}
	}
}

// maxTakeoverRaces bounds how often one claim re-reads a record that other
// owners keep taking over under its feet.
const maxTakeoverRaces = 3

// current reads the record of scope with the database clock's view of its lease.
func (s *Store) current(tx *gorm.DB, scope Scope) (observed, error) {
	var cur observed
	err := tx.Raw(`
		SELECT *, COALESCE(EXTRACT(EPOCH FROM lease_expires_at - now()), 0)::float8 AS lease_seconds_left,
		       EXTRACT(EPOCH FROM now() - updated_at)::float8 AS owned_for_seconds
		FROM idempotency_records
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?`,
		scope.TenantID, scope.Operation, scope.Key).Find(&cur).Error
	return cur, s.waitError(err)
}

// expectedIn is how many seconds from now the outcome of an intent in
// flight is likely to be stored: when its phase's own deadline passes (plus
// a second to record it), never later than its lease. An owner past its
// phase deadline has probably died, and then only the lease's end (and a
// takeover) brings the outcome.
func (s *Store) expectedIn(cur observed) float64 {
	if s.PhaseTimeout > 0 {
		if left := s.PhaseTimeout.Seconds() - cur.OwnedForSeconds; left > 0 {
			return min(cur.LeaseSecondsLeft, left+1)
		}
	}
	return cur.LeaseSecondsLeft
}

// takeOver moves an unfinished intent to a new owner. The token in the WHERE
// clause makes it a compare-and-swap: of two racing retries, one wins, and
// the loser (won false) reads the record again.
func (s *Store) takeOver(tx *gorm.DB, rec Record) (claim Claim, won bool, err error) {
	var next Record
	res := tx.Raw(`
		UPDATE idempotency_records
		SET state = 'PROCESSING', lease_token = lease_token + 1,
		    lease_expires_at = now() + make_interval(secs => ?),
		    attempts = attempts + 1, updated_at = now()
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?
		  AND lease_token = ? AND state IN ('PROCESSING', 'FAILED_RETRYABLE')
		RETURNING *`,
		s.Lease.Seconds(), rec.TenantID, rec.Operation, rec.IdempotencyKey, rec.LeaseToken).Find(&next)
	if res.Error != nil {
		return Claim{}, false, s.waitError(res.Error)
	}
	if res.RowsAffected == 0 {
		return Claim{}, false, nil
	}
	return Claim{Record: next, ResumedFrom: rec.State}, true, nil
}

// Complete stores the definitive outcome of the intent owned with token:
// SUCCEEDED for a created or done result, FAILED_FINAL for a failed one.
// ErrFenced means a newer owner took over: the caller's transaction must
// roll back so its business write is undone too. Dropping the lease takes
// the record out of the sweeper's index.
func (s *Store) Complete(tx *gorm.DB, scope Scope, token int64, result Result) error {
	outcome, code, body, err := result.stored()
	if err != nil {
		return err
	}
	state, resourceID := result.state(), result.Resource
	res := tx.Exec(`
		UPDATE idempotency_records
		SET state = ?, resource_id = COALESCE(NULLIF(?, ''), resource_id),
		    outcome = ?, result_code = ?, result_body = ?,
		    completed_at = now(), expires_at = now() + make_interval(secs => ?),
		    lease_expires_at = NULL, updated_at = now(), recovery_point = 'finished'
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?
		  AND lease_token = ? AND state = 'PROCESSING'`,
		state, resourceID, outcome, code, body,
		s.Policy.RetentionFor(scope.Operation).Seconds(),
		scope.TenantID, scope.Operation, scope.Key, token)
	return fenced(res)
}

// Advance stores the recovery point the intent owned with token reached,
// in the transaction that made the step, so the step and its point commit
// together: a resumed attempt starts after the step, never before it
// (redoing it) nor past it (skipping it). ErrFenced means a newer owner
// took over. The lease and updated_at (when the current owner took the
// intent) are left as they are.
func (s *Store) Advance(tx *gorm.DB, scope Scope, token int64, point RecoveryPoint) error {
	res := tx.Exec(`
		UPDATE idempotency_records SET recovery_point = ?
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?
		  AND lease_token = ? AND state = 'PROCESSING'`,
		point, scope.TenantID, scope.Operation, scope.Key, token)
	return fenced(res)
}

// fenced is the error of a write that names a lease token: ErrFenced when
// it matched no row.
func fenced(res *gorm.DB) error {
	if res.Error == nil && res.RowsAffected == 0 {
		return ErrFenced
	}
	return res.Error
}

// Hold locks the record of an intent owned with token, for the rest of the
// caller's transaction, or returns ErrFenced when another owner took over.
// A phase that finishes an intent holds it first, so a superseded owner
// stops before it touches anything else.
func (s *Store) Hold(tx *gorm.DB, scope Scope, token int64) error {
	var held int
	err := tx.Raw(`
		SELECT 1 FROM idempotency_records
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?
		  AND lease_token = ? AND state = 'PROCESSING'
		FOR UPDATE`,
		scope.TenantID, scope.Operation, scope.Key, token).Find(&held).Error
	if err != nil {
		return s.waitError(err)
	}
	if held != 1 {
		return ErrFenced
	}
	return nil
}

// Fail marks the intent FAILED_RETRYABLE: the outcome is unknown or the
// failure transient. The same key may retry at once; the sweeper resumes
// the intent itself after retryAfter if no client does.
func (s *Store) Fail(tx *gorm.DB, scope Scope, token int64, retryAfter time.Duration) error {
	res := tx.Exec(`
		UPDATE idempotency_records
		SET state = 'FAILED_RETRYABLE', lease_expires_at = now() + make_interval(secs => ?), updated_at = now()
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?
		  AND lease_token = ? AND state = 'PROCESSING'`,
		retryAfter.Seconds(), scope.TenantID, scope.Operation, scope.Key, token)
	return fenced(res)
}

// CountDue is how many intents ClaimDue would take now, at most limit,
// without taking any: the sweeper asks first, so that it holds slots at
// the channel only for intents that are there.
func (s *Store) CountDue(db *gorm.DB, operations []string, limit int) (int, error) {
	var n int64
	err := db.Raw(`
		SELECT count(*) FROM (
			SELECT 1 FROM idempotency_records
			WHERE lease_expires_at IS NOT NULL AND lease_expires_at <= now()
			  AND state IN ('PROCESSING', 'FAILED_RETRYABLE') AND operation IN ?
			LIMIT ?) due`, operations, limit).Scan(&n).Error
	return int(n), err
}

// ClaimDue takes over, for the sweeper, up to limit unfinished intents of
// the given operations whose lease has expired. SKIP LOCKED lets every
// instance sweep at once without two of them taking the same record; each
// returned record carries its new fencing token.
func (s *Store) ClaimDue(tx *gorm.DB, operations []string, limit int) ([]Record, error) {
	var recs []Record
	err := tx.Raw(`
		WITH due AS (
			SELECT tenant_id, operation, idempotency_key
			FROM idempotency_records
			WHERE lease_expires_at IS NOT NULL AND lease_expires_at <= now()
			  AND state IN ('PROCESSING', 'FAILED_RETRYABLE') AND operation IN ?
			ORDER BY lease_expires_at
			LIMIT ?
			FOR UPDATE SKIP LOCKED)
		UPDATE idempotency_records r
		SET state = 'PROCESSING', lease_token = r.lease_token + 1,
		    lease_expires_at = now() + make_interval(secs => ?),
		    attempts = r.attempts + 1, updated_at = now()
		FROM due
		WHERE r.tenant_id = due.tenant_id AND r.operation = due.operation AND r.idempotency_key = due.idempotency_key
		RETURNING r.*`,
		operations, limit, s.Lease.Seconds()).Find(&recs).Error
	return recs, err
}

// Find returns the tenant's records for key, one per operation that used
// it. Naming the operations lets PostgreSQL probe the primary key for each.
func (s *Store) Find(db *gorm.DB, tenantID, key string) ([]Record, error) {
	var recs []Record
	err := db.Where("tenant_id = ? AND operation IN ? AND idempotency_key = ?", tenantID, s.Policy.Operations, key).
		Order("created_at, operation").Find(&recs).Error
	return recs, err
}

// Get returns one record, or gorm.ErrRecordNotFound.
func (s *Store) Get(db *gorm.DB, scope Scope) (Record, error) {
	var rec Record
	err := db.Where("tenant_id = ? AND operation = ? AND idempotency_key = ?", scope.TenantID, scope.Operation, scope.Key).
		Take(&rec).Error
	return rec, err
}

// waitError turns a lock wait that ran out into request_in_progress: the
// first request of this intent is still inside its transaction.
func (s *Store) waitError(err error) error {
	if database.IsLockTimeout(err) {
		return inProgress(1)
	}
	return err
}

func keyReused(operation string) error {
	return problem.Errorf(problem.KeyReused,
		"This Idempotency-Key was already used for a different %s request; use a new key for a new intent.", operation)
}

func inProgress(secondsLeft float64) error {
	e := problem.Errorf(problem.RequestInProgress,
		"A request with this Idempotency-Key is still being processed; retry after the Retry-After interval to receive its result.")
	e.RetryAfter = time.Duration(math.Max(1, math.Ceil(secondsLeft))) * time.Second
	return e
}
