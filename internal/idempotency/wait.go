package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// notifyChannel is the PostgreSQL NOTIFY channel on which a record's move
// (completed, failed retryably, taken over) is announced to the duplicates
// waiting for it, on every instance.
const notifyChannel = "idempotency_record_moved"

// scopeID is the NOTIFY payload naming a scope: fixed length, whatever the
// key holds. The trigger that sends it computes the same in SQL
// (migrations/006_record_waiters.up.sql).
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
	// a missed outcome; and how long that connection may stay silent
	// before it must carry a heartbeat there and back (see listen).
	Poll   time.Duration
	Logger *slog.Logger
	// Observe, when set, is told how each Await ended (for metrics).
	Observe func(Wake)

	mu        sync.Mutex
	waiters   map[string]map[chan Wake]struct{}
	listening bool
}

// Wake is how one Await ended. Counted, it tells an operator whether
// duplicates hear of their outcomes (Notified) or have to look for them
// (Looked: the LISTEN connection is down, and each waits up to Poll longer).
type Wake string

const (
	// Notified: the transaction that moved the record announced it.
	Notified Wake = "notified"
	// Relistened: the LISTEN connection (re)started, and every waiter reads
	// its record again, since what was announced before was not heard.
	Relistened Wake = "relistened"
	// Looked: no word could reach the waiter (no LISTEN connection, or its
	// flag could not be set), so it looked after Poll.
	Looked Wake = "looked"
	// NotInFlight: the record was not PROCESSING when the wait began (it
	// had moved on, or was not committed yet).
	NotInFlight Wake = "not_in_flight"
	// GaveUp: the wait ran out, the client hung up, or the service began
	// to stop; the duplicate is answered 409.
	GaveUp Wake = "gave_up"
)

// Wakes is every Wake, in the order a dashboard lists them.
var Wakes = []Wake{Notified, Relistened, Looked, NotInFlight, GaveUp}

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
	// Connecting is bounded too: a connection opened while the path to the
	// server is half-open would otherwise wait for an answer that never
	// comes, and the listener would never come back once the path does.
	start, cancel := context.WithTimeout(ctx, 4*w.poll())
	defer cancel()
	conn, err := pgx.Connect(start, w.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(start, "LISTEN "+notifyChannel); err != nil {
		return err
	}
	w.setListening(true)
	w.wakeAll() // anything announced before we listened is read by the waiters
	for {
		heard, err := w.next(ctx, conn, w.poll())
		if err != nil {
			return err
		}
		if heard {
			continue
		}
		// Nothing heard for a poll. A connection whose server vanished
		// without a word (a half-open TCP connection, after a failover or a
		// partition) would stay silent like this until TCP gave up, minutes
		// later, while every waiter trusted it: so it must carry a
		// notification of its own there and back within a poll, or it is
		// given up and listened again. (What it hears meanwhile, its own
		// or another's, proves it as well.)
		sent, cancel := context.WithTimeout(ctx, 2*w.poll())
		_, err = conn.Exec(sent, "SELECT pg_notify($1, $2)", notifyChannel, heartbeat)
		cancel()
		if err != nil {
			return fmt.Errorf("the LISTEN connection did not carry a heartbeat within %s: %w", 2*w.poll(), err)
		}
		if heard, err := w.next(ctx, conn, 2*w.poll()); err != nil || !heard {
			return fmt.Errorf("the LISTEN connection carried no notification back within %s (err: %v)", 2*w.poll(), err)
		}
	}
}

// heartbeat is the payload of the notification a quiet listener sends
// itself; no scope is named so.
const heartbeat = "heartbeat"

// next waits up to d for a notification and wakes its waiters; heard is
// false when none came. A connection error ends the listening.
func (w *Waiter) next(ctx context.Context, conn *pgx.Conn, d time.Duration) (heard bool, err error) {
	wait, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	n, err := conn.WaitForNotification(wait)
	switch {
	case err == nil:
		w.wakeScope(n.Payload)
		return true, nil
	case ctx.Err() == nil && pgconn.Timeout(err):
		return false, nil // the connection is intact: a timeout does not close it
	}
	return false, err
}

// poll is Poll, or a second when unset.
func (w *Waiter) poll() time.Duration {
	if w.Poll <= 0 {
		return time.Second
	}
	return w.Poll
}

func (w *Waiter) setListening(up bool) {
	w.mu.Lock()
	w.listening = up
	w.mu.Unlock()
}

// register adds a waiter for scope; the returned func removes it.
func (w *Waiter) register(id string) (chan Wake, func()) {
	ch := make(chan Wake, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters == nil {
		w.waiters = map[string]map[chan Wake]struct{}{}
	}
	if w.waiters[id] == nil {
		w.waiters[id] = map[chan Wake]struct{}{}
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

// wakeScope wakes the waiters of the scope a notification named.
func (w *Waiter) wakeScope(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.waiters[id] {
		signal(ch, Notified)
	}
}

// wakeAll wakes every waiter once the LISTEN connection is (back) up.
func (w *Waiter) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, chs := range w.waiters {
		for ch := range chs {
			signal(ch, Relistened)
		}
	}
}

// signal wakes ch's waiter for why, unless something woke it already.
func signal(ch chan Wake, why Wake) {
	select {
	case ch <- why:
	default: // already signalled
	}
}

// Listening reports whether the LISTEN connection is up: while it is not,
// waiters look at their records every Poll instead of being told.
func (w *Waiter) Listening() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.listening
}

// Await waits until the intent of scope has moved on from PROCESSING
// (completed, failed retryably, or taken over by a new owner), then returns
// true: the caller asks again and gets the replay, or the next answer. It
// returns false when ctx ends first (the wait ran out, the client hung up,
// or the service is stopping). It marks the record as waited for, so that
// whoever moves it notifies; a record that is not PROCESSING (any more, or
// not yet visible) returns true at once or after one poll. Observe hears
// how it ended.
func (w *Waiter) Await(ctx context.Context, db *gorm.DB, scope Scope) bool {
	why := w.await(ctx, db, scope)
	if w.Observe != nil {
		w.Observe(why)
	}
	return why != GaveUp
}

func (w *Waiter) await(ctx context.Context, db *gorm.DB, scope Scope) Wake {
	ch, unregister := w.register(scopeID(scope))
	defer unregister()
	inFlight, err := flagWaiting(db.WithContext(ctx), scope)
	switch {
	case ctx.Err() != nil:
		return GaveUp
	case err == nil && !inFlight: // it moved on already
		return NotInFlight
	}
	tick := time.NewTicker(w.poll())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return GaveUp
		case why := <-ch:
			return why
		case <-tick.C:
			if !w.Listening() || err != nil {
				return Looked // no word can reach us: look for ourselves
			}
		}
	}
}

// flagWaiting marks the record of scope as waited for, so that whoever
// moves it notifies, and reports whether it is still in flight. The caller
// registers for the notification first, so no announcement can slip between
// the two.
//
// Only the first of many waiters writes: once the flag is set, the others
// find it set and take no row lock. Those read it in a statement of their
// own: a waiter whose UPDATE waited for another's flag to commit must read
// it with a snapshot taken after that commit, which a second part of the
// same statement would not (it would see the record unflagged, and the
// waiter would give up its wait as if the outcome were stored).
func flagWaiting(db *gorm.DB, scope Scope) (bool, error) {
	res := db.Exec(`
		UPDATE idempotency_records SET waiting = true
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ? AND state = 'PROCESSING' AND NOT waiting`,
		scope.TenantID, scope.Operation, scope.Key)
	if res.Error != nil || res.RowsAffected == 1 {
		return res.RowsAffected == 1, res.Error
	}
	var flagged bool
	err := db.Raw(`
		SELECT EXISTS (SELECT 1 FROM idempotency_records
			WHERE tenant_id = ? AND operation = ? AND idempotency_key = ? AND state = 'PROCESSING' AND waiting)`,
		scope.TenantID, scope.Operation, scope.Key).Find(&flagged).Error
	return flagged, err
}
