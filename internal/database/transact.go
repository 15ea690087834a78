package database

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"gorm.io/gorm"
)

// maxAttempts bounds how often Transact reruns a transaction the database
// aborted to resolve a conflict.
const maxAttempts = 3

// Transact runs fn in one transaction: committed when fn returns nil, rolled
// back when it returns an error or panics. Serialization failures (40001) and
// deadlocks (40P01) are retried here, and only here, because the database
// chose a victim and a rerun is the documented cure.
func Transact(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error) error {
	return TransactAttempts(ctx, db, nil, fn)
}

// An Attempt marks one attempt of a transaction: it returns the context
// the attempt runs under (fn's tx carries it, tx.Statement.Context), and
// end, which is told whether the attempt committed. An attempt that
// panicked is never told.
type Attempt func(ctx context.Context) (attemptCtx context.Context, end func(committed bool))

// TransactAttempts is Transact with each attempt marked by attempt (nil:
// none, which is Transact). The order tests mark them so that a step they
// record inside a transaction stands only if that attempt commits
// (internal/order/steps.Attempt): an attempt rerun here, or whose commit
// failed, did not happen.
func TransactAttempts(ctx context.Context, db *gorm.DB, attempt Attempt, fn func(tx *gorm.DB) error) error {
	if attempt == nil {
		attempt = unmarked
	}
	var err error
	for n := 1; n <= maxAttempts; n++ {
		actx, end := attempt(ctx)
		err = ended(ctx, db.WithContext(actx).Transaction(fn))
		end(err == nil)
		if !Retryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// unmarked is the Attempt of a transaction nobody marks: it runs under
// the caller's context, and its end is no one's business.
func unmarked(ctx context.Context) (context.Context, func(bool)) { return ctx, func(bool) {} }

// ended names the context's end as the cause of a transaction that
// database/sql rolled back because its context ended: the statement or
// commit after that fails with sql.ErrTxDone, which says nothing of why,
// and would be answered as the service's own failure (500) instead of a
// cancelled or timed-out request (503, retry with the same key).
func ended(ctx context.Context, err error) error {
	if ctx.Err() != nil && errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return err
}

// Retryable says whether err is a conflict the database resolved by
// aborting this transaction (a serialization failure or a deadlock), for
// which a rerun is the cure.
func Retryable(err error) bool {
	code := SQLState(err)
	return code == "40001" || code == "40P01"
}

// Snapshot runs fn in one read-only REPEATABLE READ transaction, so every
// statement of a read sees the same committed state: a read racing a
// settlement shows the order and its payment both before or both after it.
func Snapshot(ctx context.Context, db *gorm.DB, fn func(tx *gorm.DB) error) error {
	return ended(ctx, db.WithContext(ctx).Transaction(fn, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}))
}
