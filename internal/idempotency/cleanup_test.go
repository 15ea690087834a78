package idempotency_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
)

func TestCleanupPass(t *testing.T) {
	const expired, live = 100_000, 10_000
	s := newStore()
	// Expired finished records: every fourth is a money operation. Live
	// ones: unexpired finished records, PROCESSING with an expired lease (a
	// dead owner's work, which must survive for its takeover) and
	// FAILED_RETRYABLE.
	seed := fmt.Sprintf(`
		INSERT INTO idempotency_records (tenant_id, operation, idempotency_key, fingerprint, state, resource_id,
			outcome, result_code, result_body, lease_token, lease_expires_at, attempts, created_at, completed_at, expires_at)
		SELECT 'clean', CASE WHEN i %% 4 = 0 THEN 'op.money' ELSE 'op.plain' END, 'old-' || i, repeat('a', 64),
		       CASE WHEN i %% 10 = 0 THEN 'FAILED_FINAL' ELSE 'SUCCEEDED' END, 'r-' || i,
		       CASE WHEN i %% 10 = 0 THEN 'failed' ELSE 'done' END, CASE WHEN i %% 10 = 0 THEN 'refused' END,
		       '{"ok":true}'::bytea, 1, NULL, 1,
		       now() - interval '40 days', now() - interval '40 days', now() - interval '1 day'
		FROM generate_series(1, %d) AS i;
		INSERT INTO idempotency_records (tenant_id, operation, idempotency_key, fingerprint, state, outcome, result_body,
			lease_expires_at, completed_at, expires_at)
		SELECT 'clean', 'op.money', 'live-' || i, repeat('a', 64),
		       (ARRAY['SUCCEEDED', 'PROCESSING', 'FAILED_RETRYABLE'])[1 + i %% 3],
		       CASE WHEN i %% 3 = 0 THEN 'done' END, CASE WHEN i %% 3 = 0 THEN '{}'::bytea END,
		       CASE WHEN i %% 3 = 0 THEN NULL ELSE now() - interval '1 hour' END,
		       CASE WHEN i %% 3 = 0 THEN now() END,
		       CASE WHEN i %% 3 = 0 THEN now() + interval '1 day' END
		FROM generate_series(1, %d) AS i;`, expired, live)
	if err := db.Exec(seed).Error; err != nil {
		t.Fatal(err)
	}

	var batches atomic.Int64
	c := &idempotency.Cleaner{DB: db, Store: s, Batch: 1000, Pause: 5 * time.Millisecond, Logger: nil,
		Observe: func(idempotency.CleanupResult) { batches.Add(1) }}

	// While the pass runs, a live key keeps replaying and new keys keep
	// being claimed; each insert notes how many batches had finished when
	// it did. Meanwhile PostgreSQL is asked every few milliseconds whether
	// any session of this database waits for a lock: no work of the
	// pass's may block a claim.
	liveKey := idempotency.Intent{Scope: idempotency.Scope{TenantID: "clean", Operation: "op.money", Key: "live-3"}, Fingerprint: repeatA()}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var replays, inserts atomic.Int64
	var insertedAfter sync.Map // batches finished → true, at some insert's end
	var lockWaits atomic.Int64
	var failure atomic.Value
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			var n int64
			if err := db.Raw(`SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n).Error; err != nil {
				failure.Store(err)
				return
			}
			lockWaits.Add(n)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			err := db.Transaction(func(tx *gorm.DB) error {
				c, err := s.ClaimOrReplay(tx, liveKey)
				if err == nil && c.Replay == nil {
					err = fmt.Errorf("live key did not replay: %+v", c.Record)
				}
				return err
			})
			if err != nil {
				failure.Store(err)
				return
			}
			replays.Add(1)
			err = db.Transaction(func(tx *gorm.DB) error {
				_, err := s.ClaimOrReplay(tx, idempotency.Intent{Scope: idempotency.Scope{TenantID: "clean", Operation: "op.plain", Key: fmt.Sprintf("new-%d", i)}, Fingerprint: repeatA()})
				return err
			})
			if err != nil {
				failure.Store(err)
				return
			}
			inserts.Add(1)
			insertedAfter.Store(batches.Load(), true)
		}
	}()

	res, err := c.Pass(context.Background())
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if f := failure.Load(); f != nil {
		t.Fatalf("during the pass: %v", f)
	}

	t.Run("removes exactly the expired finished records", func(t *testing.T) {
		if res.Deleted != expired {
			t.Errorf("deleted = %d, want %d", res.Deleted, expired)
		}
		if n := countWhere(t, "tenant_id = 'clean' AND idempotency_key LIKE 'old-%'"); n != 0 {
			t.Errorf("%d expired records left", n)
		}
	})
	t.Run("archives the money ones, without their body", func(t *testing.T) {
		if res.Archived != expired/4 {
			t.Errorf("archived = %d, want %d", res.Archived, expired/4)
		}
		var n int64
		db.Raw("SELECT count(*) FROM idempotency_archive WHERE tenant_id = 'clean' AND operation = 'op.money' AND result_sha256 = sha256('{\"ok\":true}'::bytea)").Scan(&n)
		if n != expired/4 {
			t.Errorf("archive rows = %d, want %d", n, expired/4)
		}
	})
	t.Run("leaves every live, PROCESSING and FAILED_RETRYABLE record", func(t *testing.T) {
		if n := countWhere(t, "tenant_id = 'clean' AND idempotency_key LIKE 'live-%'"); n != live {
			t.Errorf("live records = %d, want %d", n, live)
		}
	})
	t.Run("a live key replayed and new keys were claimed throughout", func(t *testing.T) {
		// Claims finished between batches, not only before the first or
		// after the last: the pass holds nothing across its batches.
		between := 0
		insertedAfter.Range(func(k, _ any) bool {
			if n := k.(int64); n > 0 && n < batches.Load() {
				between++
			}
			return true
		})
		t.Logf("replays %d, inserts %d, finished after %d different counts of the %d batches", replays.Load(), inserts.Load(), between, batches.Load())
		if replays.Load() == 0 || inserts.Load() == 0 || between == 0 {
			t.Fatal("no claim finished while the pass was between its batches")
		}
		if n := lockWaits.Load(); n != 0 {
			t.Errorf("a session waited for a lock %d times while the pass ran", n)
		}
	})
}

func countWhere(t *testing.T, where string) int64 {
	t.Helper()
	var n int64
	if err := db.Raw("SELECT count(*) FROM idempotency_records WHERE " + where).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func repeatA() string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = 'a'
	}
	return string(b)
}
