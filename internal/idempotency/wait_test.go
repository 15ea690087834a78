package idempotency_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/testdb"
)

// A wait reports how it ended, and only what ended it can: each case below
// leaves exactly one way open (a poll of an hour cannot end a wait in a test).
func TestAWaitSaysWhatEndedIt(t *testing.T) {
	s := newStore()
	claimed := func(t *testing.T, key string) (idempotency.Intent, idempotency.Claim) {
		t.Helper()
		key = fmt.Sprintf("%s-%d", key, time.Now().UnixNano()) // each run its own
		in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "waits", Operation: "op.money", Key: key}, Fingerprint: fp("a")}
		var c idempotency.Claim
		tx(t, func(tx *gorm.DB) (err error) { c, err = s.ClaimOrReplay(tx, in); return err })
		return in, c
	}
	// await runs w.Await in the background; its channel yields how it
	// ended and what it returned.
	await := func(ctx context.Context, w *idempotency.Waiter, scope idempotency.Scope) <-chan string {
		ended := make(chan idempotency.Wake, 1)
		w.Observe = func(how idempotency.Wake) { ended <- how }
		out := make(chan string, 1)
		go func() {
			again := w.Await(ctx, db, scope)
			out <- fmt.Sprintf("%s %t", <-ended, again)
		}()
		return out
	}
	// flagged waits until a waiter has flagged scope's record, which it
	// does after registering for its notification.
	flagged := func(t *testing.T, scope idempotency.Scope) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			rec, err := s.Get(db, scope)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Waiting {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no waiter flagged the record within 10s")
			}
		}
	}
	want := func(t *testing.T, got <-chan string, want string) {
		t.Helper()
		select {
		case g := <-got:
			if g != want {
				t.Errorf("the wait ended %q, want %q", g, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the wait had not ended after 10s, want %q", want)
		}
	}
	run := func(t *testing.T, w *idempotency.Waiter) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan struct{})
		go func() { w.Run(ctx); close(stopped) }()
		t.Cleanup(func() { cancel(); <-stopped })
	}
	// listening runs w until the test ends, from the moment it listens.
	listening := func(t *testing.T, w *idempotency.Waiter) {
		t.Helper()
		run(t, w)
		for deadline := time.Now().Add(10 * time.Second); !w.Listening(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the waiter did not LISTEN within 10s")
			}
		}
	}
	waiter := func(poll time.Duration) *idempotency.Waiter {
		return &idempotency.Waiter{URL: dbURL, Poll: poll, Logger: slog.New(slog.DiscardHandler)}
	}

	t.Run("notified by the commit that moved the record", func(t *testing.T) {
		w := waiter(time.Hour)
		listening(t, w)
		in, c := claimed(t, "notified")
		got := await(context.Background(), w, in.Scope)
		flagged(t, in.Scope)
		tx(t, func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, c.Token(), idempotency.Done("", []byte("{}")))
		})
		want(t, got, "notified true")
	})

	// Another waiter's flag is being set as this one begins: its own UPDATE
	// waits for that to commit, and it must then see the flag and wait, not
	// take the record for stored.
	t.Run("notified, after waiting for another waiter's flag", func(t *testing.T) {
		w := waiter(time.Hour)
		listening(t, w)
		in, c := claimed(t, "flag-race")
		other := db.Begin()
		defer other.Rollback()
		if err := other.Exec(`UPDATE idempotency_records SET waiting = true WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?`,
			in.TenantID, in.Operation, in.Key).Error; err != nil {
			t.Fatal(err)
		}
		got := await(context.Background(), w, in.Scope)
		testdb.WaitForLockWaiter(t, db, "the waiter's flag")
		if err := other.Commit().Error; err != nil {
			t.Fatal(err)
		}
		// The record moves on only once the waiter has read the flag (or
		// ended): moved on first, "not in flight" would be its right answer.
		for deadline := time.Now().Add(10 * time.Second); len(got) == 0; time.Sleep(5 * time.Millisecond) {
			buf := make([]byte, 1<<20)
			stacks := string(buf[:runtime.Stack(buf, true)])
			if strings.Contains(stacks, "idempotency.(*Waiter).await(") && !strings.Contains(stacks, "idempotency.flagWaiting(") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the waiter was neither waiting nor done within 10s")
			}
		}
		tx(t, func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, c.Token(), idempotency.Done("", []byte("{}")))
		})
		want(t, got, "notified true")
	})

	t.Run("relistened: what was announced before the LISTEN is read again", func(t *testing.T) {
		w := waiter(time.Hour)
		in, _ := claimed(t, "relistened")
		got := await(context.Background(), w, in.Scope)
		flagged(t, in.Scope)
		run(t, w)
		want(t, got, "relistened true")
	})

	t.Run("looked: with no LISTEN connection, after Poll", func(t *testing.T) {
		in, _ := claimed(t, "looked")
		want(t, await(context.Background(), waiter(20*time.Millisecond), in.Scope), "looked true")
	})

	t.Run("not in flight: nothing to wait for", func(t *testing.T) {
		in, c := claimed(t, "done")
		tx(t, func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, c.Token(), idempotency.Done("", []byte("{}")))
		})
		want(t, await(context.Background(), waiter(time.Hour), in.Scope), "not_in_flight true")
	})

	t.Run("gave up when its context ended", func(t *testing.T) {
		in, _ := claimed(t, "gave-up")
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		want(t, await(ctx, waiter(time.Hour), in.Scope), "gave_up false")
	})
}
