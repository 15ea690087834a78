package idempotency

import (
	"context"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
)

// CleanupResult says what one cleanup batch did.
type CleanupResult struct {
	Deleted  int // records removed, archived ones included
	Archived int // of those, copied to idempotency_archive first
	Forgot   int // webhook deliveries removed from the inbox
}

// Removed is one record the cleanup removed: its scope, the resource it
// named and the state it was in. Store.Removed is told each one.
type Removed struct {
	Scope
	ResourceID string
	State      State
}

// CleanupBatch removes up to limit finished records whose retention has
// run out, in one statement: the records of money operations are copied to
// the archive in the same transaction as their delete, so none is lost
// between the two. PROCESSING and FAILED_RETRYABLE records are never
// touched, nor anything not yet expired. SKIP LOCKED lets every instance
// clean at once, and keeps the batch off rows a request is using.
//
// The rows are found through the expiry index and deleted by the ctid the
// locking read returned: a row locked FOR UPDATE keeps its ctid until we
// commit, so the delete needs no second lookup through the primary key
// (expired rows are scattered over the table, one page read each).
//
// When s.Removed is set, the statement also returns each removed record,
// and s.Removed is told of it before the transaction commits (the removed
// rows stay locked until then, so no claim of their scope comes between;
// s.Attempt tells whether that commit came).
// Unset (production), the statement returns the counts alone.
func (s *Store) CleanupBatch(tx *gorm.DB, limit int) (CleanupResult, error) {
	money := s.Policy.MoneyOperations
	const remove = `
		WITH gone AS (
			DELETE FROM idempotency_records
			WHERE ctid = ANY (ARRAY(
				SELECT ctid FROM idempotency_records
				WHERE state IN ('SUCCEEDED', 'FAILED_FINAL') AND expires_at < now()
				ORDER BY expires_at
				LIMIT ?
				FOR UPDATE SKIP LOCKED))
			RETURNING *
		), archived AS (
			INSERT INTO idempotency_archive
				(tenant_id, operation, idempotency_key, fingerprint, state, resource_id,
				 outcome, result_code, result_sha256, attempts, created_at, completed_at, expires_at)
			SELECT tenant_id, operation, idempotency_key, fingerprint, state, resource_id,
			       outcome, result_code, sha256(result_body), attempts, created_at, completed_at, expires_at
			FROM gone
			WHERE operation IN ?
			RETURNING 1
		)`
	if s.Removed == nil {
		var res CleanupResult
		err := tx.Raw(remove+`
		SELECT (SELECT count(*) FROM gone) AS deleted, (SELECT count(*) FROM archived) AS archived`,
			limit, money).Find(&res).Error
		return res, err
	}
	// PostgreSQL runs a data-modifying CTE to completion whatever the main
	// query reads of it: reading gone's rows instead of counting them
	// deletes and archives the same records.
	var rows []struct {
		TenantID       string
		Operation      string
		IdempotencyKey string
		ResourceID     *string
		State          State
		Archived       int
	}
	if err := tx.Raw(remove+`
		SELECT tenant_id, operation, idempotency_key, resource_id, state,
		       (SELECT count(*) FROM archived) AS archived
		FROM gone`, limit, money).Scan(&rows).Error; err != nil {
		return CleanupResult{}, err
	}
	res := CleanupResult{Deleted: len(rows)}
	for _, r := range rows {
		res.Archived = r.Archived
		gone := Removed{Scope: Scope{TenantID: r.TenantID, Operation: r.Operation, Key: r.IdempotencyKey}, State: r.State}
		if r.ResourceID != nil {
			gone.ResourceID = *r.ResourceID
		}
		s.Removed(tx.Statement.Context, gone)
	}
	return res, nil
}

// Cleaner runs the cleanup job: expired records go in bounded batches with
// a pause between them, so a large backlog never holds many locks at once,
// and each batch's commit flushes little WAL (deleting from a page first
// touched since the last checkpoint logs the whole page): the creates that
// commit meanwhile do not queue behind a big flush.
type Cleaner struct {
	DB    *gorm.DB
	Store *Store
	// Inbox, when set, is cleaned in the same pass, after the records.
	Inbox *Inbox
	Batch int
	Pause time.Duration
	// Observe, when set, is told what each batch did (for metrics).
	Observe func(CleanupResult)
	Logger  *slog.Logger
}

// Pass removes every record expired now, batch by batch, and returns the
// totals. It stops early, with what it did so far, when ctx ends.
func (c *Cleaner) Pass(ctx context.Context) (CleanupResult, error) {
	var total CleanupResult
	for {
		var res CleanupResult
		err := database.TransactAttempts(ctx, c.DB, c.Store.Attempt, func(tx *gorm.DB) error {
			var err error
			res, err = c.Store.CleanupBatch(tx, c.Batch)
			return err
		})
		if err != nil {
			return total, err
		}
		total.Deleted += res.Deleted
		total.Archived += res.Archived
		if c.Observe != nil {
			c.Observe(res)
		}
		if res.Deleted < c.Batch {
			break
		}
		if err := c.pause(ctx); err != nil {
			return total, err
		}
	}
	for c.Inbox != nil {
		var n int
		err := database.Transact(ctx, c.DB, func(tx *gorm.DB) error {
			var err error
			n, err = c.Inbox.CleanupBatch(tx, c.Batch)
			return err
		})
		total.Forgot += n
		if err != nil || n < c.Batch {
			return total, err
		}
		if err := c.pause(ctx); err != nil {
			return total, err
		}
	}
	return total, nil
}

// pause waits between two batches, or returns ctx's error when it ends.
func (c *Cleaner) pause(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(c.Pause):
		return nil
	}
}

// Run makes a pass every interval until ctx ends.
func (c *Cleaner) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			res, err := c.Pass(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				c.Logger.WarnContext(ctx, "cleanup pass failed", "err", err)
			case res.Deleted > 0 || res.Forgot > 0:
				c.Logger.InfoContext(ctx, "cleanup pass", "deleted", res.Deleted, "archived", res.Archived, "webhooks_forgotten", res.Forgot)
			}
		}
	}
}
