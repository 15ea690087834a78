package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
)

// notifyChannel is the PostgreSQL NOTIFY channel on which a record's move
// (completed, failed retryably, taken over) is announced to the duplicates
// waiting for it, on every instance.
const notifyChannel = "idempotency_record_moved"

// wake announces, from the transaction that moved the record, that scope
// moved on. PostgreSQL delivers the notification only if and when that
// transaction commits, so a waiter never sees an outcome that rolled back.
func wake(tx *gorm.DB, waiting bool, scope Scope) error {
	if !waiting {
		return nil
	}
	return tx.Exec("SELECT pg_notify(?, ?)", notifyChannel, scopeID(scope)).Error
}

// scopeID is the NOTIFY payload naming a scope: fixed length, whatever the
// key holds.
func scopeID(scope Scope) string {
	sum := sha256.Sum256([]byte(scope.TenantID + "\x00" + scope.Operation + "\x00" + scope.Key))
	return hex.EncodeToString(sum[:16])
}

// Waiter lets a duplicate wait for the outcome of an intent in flight,
// wherever its first attempt runs: one LISTEN connection per process
// receives every record's move and wakes the duplicates waiting for that
// scope. Waiting holds no pooled connection and no transaction.
type Waiter struct {
	// URL is the database to LISTEN on (DATABASE_URL).
	URL string
	// Poll is how often a waiter looks at its record itself while the
	// LISTEN connection is down, so a broken listener costs latency, never
	// a missed outcome.
	Poll   time.Duration
	Logger *slog.Logger

	mu        sync.Mutex
	waiters   map[string]map[chan struct{}]struct{}
	listening bool
}

// Run keeps the LISTEN connection up until ctx ends, reconnecting with a
// bounded backoff. Every reconnect wakes every waiter: what was announced
// while the connection was down is then read from the records themselves.
func (w *Waiter) Run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := w.listen(ctx)
		w.setListening(false)
		if ctx.Err() != nil {
			return
		}
		w.Logger.WarnContext(ctx, "idempotency waiter lost its LISTEN connection; waiters poll until it is back", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (w *Waiter) listen(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, w.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	w.setListening(true)
	w.wakeAll() // anything announced before we listened is read by the waiters
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		w.wakeScope(n.Payload)
	}
}

func (w *Waiter) setListening(up bool) {
	w.mu.Lock()
	w.listening = up
	w.mu.Unlock()
}

// register adds a waiter for scope; the returned func removes it.
func (w *Waiter) register(id string) (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters == nil {
		w.waiters = map[string]map[chan struct{}]struct{}{}
	}
	if w.waiters[id] == nil {
		w.waiters[id] = map[chan struct{}]struct{}{}
	}
	w.waiters[id][ch] = struct{}{}
	return ch, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.waiters[id], ch)
		if len(w.waiters[id]) == 0 {
			delete(w.waiters, id)
		}
	}
}

func (w *Waiter) wakeScope(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.waiters[id] {
		signal(ch)
	}
}

func (w *Waiter) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, chs := range w.waiters {
		for ch := range chs {
			signal(ch)
		}
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // already signalled
	}
}

// Await waits until the intent of scope has moved on from PROCESSING
// (completed, failed retryably, or taken over by a new owner), then returns
// true: the caller asks again and gets the replay, or the next answer. It
// returns false when ctx ends first (the wait ran out, the client hung up,
// or the service is stopping). It marks the record as waited for, so that
// whoever moves it notifies; a record that is not PROCESSING (any more, or
// not yet visible) returns true at once or after one poll.
func (w *Waiter) Await(ctx context.Context, db *gorm.DB, scope Scope) bool {
	ch, unregister := w.register(scopeID(scope))
	defer unregister()
	// Flag the record after registering, so no announcement can slip
	// between the two; the UPDATE waits for an owner's uncommitted move.
	// Only the first of many waiters writes: once the flag is set, the
	// others find it set and take no row lock.
	var inFlight bool
	err := db.WithContext(ctx).Raw(`
		WITH flagged AS (
			UPDATE idempotency_records SET waiting = true
			WHERE tenant_id = ? AND operation = ? AND idempotency_key = ? AND state = 'PROCESSING' AND NOT waiting
			RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM flagged) OR EXISTS (
			SELECT 1 FROM idempotency_records
			WHERE tenant_id = ? AND operation = ? AND idempotency_key = ? AND state = 'PROCESSING' AND waiting)`,
		scope.TenantID, scope.Operation, scope.Key, scope.TenantID, scope.Operation, scope.Key).Find(&inFlight).Error
	switch {
	case ctx.Err() != nil:
		return false
	case err == nil && !inFlight: // it moved on already
		return true
	}
	poll := w.Poll
	if poll <= 0 {
		poll = time.Second
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-ch:
			return true
		case <-tick.C:
			w.mu.Lock()
			listening := w.listening
			w.mu.Unlock()
			if !listening || err != nil {
				return true // no word can reach us: look for ourselves
			}
		}
	}
}
