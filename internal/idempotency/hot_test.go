package idempotency_test

import (
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

// unique makes a key no other run of the test used (-count > 1).
func unique(name string) string { return fmt.Sprintf("%s-%d", name, time.Now().UnixNano()) }

// updates reads, inside tx, how many updates of idempotency_records this
// backend counted and has not yet reported (its own transactions since its
// last report: a difference within one transaction is that transaction's).
func updates(t *testing.T, tx *gorm.DB) (all, hot int64) {
	t.Helper()
	var row struct{ Upd, Hot int64 }
	if err := tx.Raw(`SELECT n_tup_upd AS upd, n_tup_hot_upd AS hot FROM pg_stat_xact_user_tables
		WHERE relid = 'idempotency_records'::regclass`).Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	return row.Upd, row.Hot
}

// Migration 010: a one-transaction intent has no lease, so its completion
// changes no indexed column and is a HOT update; a resumable intent's
// completion drops its lease and so leaves the sweeper's index.
func TestCompletionOfAOneTransactionIntentIsHOT(t *testing.T) {
	s := newStore()
	result := idempotency.Created("r", []byte(`{"id":"hot"}`))
	for _, c := range []struct {
		name    string
		oneTx   bool
		wantHOT int64
	}{{"one transaction", true, 1}, {"resumable", false, 0}} {
		t.Run(c.name, func(t *testing.T) {
			in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t-hot", Operation: "op.hot", Key: unique(c.name)}, Fingerprint: fp(c.name), OneTransaction: c.oneTx}
			tx(t, func(tx *gorm.DB) error {
				all0, hot0 := updates(t, tx)
				claim, err := s.ClaimOrReplay(tx, in)
				if err != nil {
					return err
				}
				if err := s.Complete(tx, in.Scope, claim.Token(), result); err != nil {
					return err
				}
				if all, hot := updates(t, tx); all-all0 != 1 || hot-hot0 != c.wantHOT {
					t.Errorf("updates in the transaction = %d, HOT %d; want 1, HOT %d", all-all0, hot-hot0, c.wantHOT)
				}
				return nil
			})
			rec, err := s.Get(db, in.Scope)
			if err != nil {
				t.Fatal(err)
			}
			if rec.LeaseExpiresAt != nil || rec.Expiry() == nil || rec.Resumable == c.oneTx {
				t.Errorf("finished record: lease %v, expiry %v, resumable %v", rec.LeaseExpiresAt, rec.Expiry(), rec.Resumable)
			}
		})
	}
}

func TestReplayReadsOnlyDefinitiveOutcomes(t *testing.T) {
	s := newStore()
	in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t-read", Operation: "op.read", Key: unique("k")}, Fingerprint: fp("read")}
	if r, err := s.Replay(db, in); r != nil || err != nil {
		t.Fatalf("absent key: %+v, %v; want nothing", r, err)
	}
	var claim idempotency.Claim
	tx(t, func(tx *gorm.DB) error { var err error; claim, err = s.ClaimOrReplay(tx, in); return err })
	if r, err := s.Replay(db, in); r != nil || err != nil {
		t.Fatalf("PROCESSING key: %+v, %v; want nothing (the claim decides)", r, err)
	}
	tx(t, func(tx *gorm.DB) error {
		return s.Complete(tx, in.Scope, claim.Token(), idempotency.Failed("", problem.Errorf(problem.NotFound, "gone")))
	})
	r, err := s.Replay(db, in)
	if err != nil || r == nil || r.Outcome != idempotency.OutcomeFailed || r.Failure == nil || r.Failure.Code != problem.NotFound || !r.Replayed {
		t.Fatalf("definitive key: %+v, %v", r, err)
	}
	other := in
	other.Fingerprint = fp("other")
	if _, err := s.Replay(db, other); problem.CodeOf(err) != problem.KeyReused {
		t.Fatalf("another fingerprint: %v, want idempotency_key_reused", err)
	}
}

func TestGaugesCountUnfinishedRecordsExactly(t *testing.T) {
	s := newStore()
	// The gauges are table-wide: let every lease the package's other tests
	// left run out now, so none expires between the two readings.
	if err := db.Exec(`UPDATE idempotency_records SET lease_expires_at = now() - interval '1 hour' WHERE lease_expires_at IS NOT NULL`).Error; err != nil {
		t.Fatal(err)
	}
	before, err := s.Gauges(db)
	if err != nil {
		t.Fatal(err)
	}
	in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t-gauge", Operation: "op.money", Key: unique("stuck")}, Fingerprint: fp("gauge")}
	tx(t, func(tx *gorm.DB) error { _, err := s.ClaimOrReplay(tx, in); return err })
	expire(t, in.Scope)
	failed := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t-gauge", Operation: "op.money", Key: unique("failed")}, Fingerprint: fp("gauge")}
	tx(t, func(tx *gorm.DB) error {
		c, err := s.ClaimOrReplay(tx, failed)
		if err != nil {
			return err
		}
		return s.Fail(tx, failed.Scope, c.Token(), 0)
	})
	after, err := s.Gauges(db)
	if err != nil {
		t.Fatal(err)
	}
	if d := after.Records[idempotency.Processing] - before.Records[idempotency.Processing]; d != 1 {
		t.Errorf("PROCESSING grew by %d, want 1", d)
	}
	if d := after.Records[idempotency.FailedRetryable] - before.Records[idempotency.FailedRetryable]; d != 1 {
		t.Errorf("FAILED_RETRYABLE grew by %d, want 1", d)
	}
	if d := after.ExpiredProcessing - before.ExpiredProcessing; d != 1 {
		t.Errorf("expired PROCESSING grew by %d, want 1", d)
	}
	if after.TableBytes <= 0 || after.Records[idempotency.Succeeded] < 0 || after.Records[idempotency.FailedFinal] < 0 {
		t.Errorf("gauges = %+v", after)
	}
}
