package idempotency_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/tests/testdb"
)

// unique makes a key no other run of the test used (-count > 1).
func unique(name string) string { return fmt.Sprintf("%s-%d", name, time.Now().UnixNano()) }

// writes reads, inside tx, how many rows of idempotency_records this backend
// inserted and updated and has not yet reported (its own transactions since
// its last report: a difference within one transaction is that
// transaction's).
func writes(t *testing.T, tx *gorm.DB) (inserted, updated int64) {
	t.Helper()
	var row struct{ Ins, Upd int64 }
	if err := tx.Raw(`SELECT n_tup_ins AS ins, n_tup_upd AS upd FROM pg_stat_xact_user_tables
		WHERE relid = 'idempotency_records'::regclass`).Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	return row.Ins, row.Upd
}

// An intent executed in one transaction costs its transaction one write:
// the record is inserted with its result, never PROCESSING, with no lease
// for the sweeper to find, and a replay reads it back.
func TestAnIntentOfOneTransactionIsRecordedByOneInsert(t *testing.T) {
	s := newStore()
	in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t-rec", Operation: "op.rec", Key: unique("once")}, Fingerprint: fp("once")}
	tx(t, func(tx *gorm.DB) error {
		ins0, upd0 := writes(t, tx)
		if err := s.Insert(tx, in, idempotency.Created("r-1", []byte(`{"id":"r-1"}`))); err != nil {
			return err
		}
		if ins, upd := writes(t, tx); ins-ins0 != 1 || upd-upd0 != 0 {
			t.Errorf("writes in the transaction: %d inserts, %d updates; want 1 insert, no update", ins-ins0, upd-upd0)
		}
		return nil
	})
	rec, err := s.Get(db, in.Scope)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idempotency.Succeeded || rec.LeaseExpiresAt != nil || rec.Expiry() == nil || rec.Resumable || rec.Resource() != "r-1" {
		t.Errorf("record: state %s, lease %v, expiry %v, resumable %v, resource %q", rec.State, rec.LeaseExpiresAt, rec.Expiry(), rec.Resumable, rec.Resource())
	}
	r, err := s.Replay(db, in)
	if err != nil || r == nil || string(r.Body) != `{"id":"r-1"}` || !r.Replayed {
		t.Fatalf("replay = %+v, %v", r, err)
	}
}

// Two transactions record one intent at once: the second insert waits on
// the first's uncommitted key. When the first commits, the second gets
// ErrTaken (its caller rolls back and replays); when the first rolls back,
// the second's insert goes ahead.
func TestTheFirstOfTwoConcurrentRecordsWins(t *testing.T) {
	s := newStore()
	for _, c := range []struct {
		name  string
		first error // what the first transaction returns: nil commits it
		want  error // what the second's Record returns
	}{{"the first commits", nil, idempotency.ErrTaken}, {"the first rolls back", errors.New("rolled back"), nil}} {
		t.Run(c.name, func(t *testing.T) {
			in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t-rec", Operation: "op.rec", Key: unique("race")}, Fingerprint: fp("race")}
			recorded, second := make(chan struct{}), make(chan error, 1)
			go func() {
				<-recorded
				second <- db.Transaction(func(tx *gorm.DB) error {
					return s.Insert(tx, in, idempotency.Created("second", []byte(`{"id":"second"}`)))
				})
			}()
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := s.Insert(tx, in, idempotency.Created("first", []byte(`{"id":"first"}`))); err != nil {
					return err
				}
				close(recorded)
				testdb.WaitForLockWaiter(t, db, "the second Record")
				return c.first
			})
			if !errors.Is(err, c.first) {
				t.Fatalf("first transaction: %v", err)
			}
			if err := <-second; !errors.Is(err, c.want) {
				t.Fatalf("second Record: %v, want %v", err, c.want)
			}
			want := map[bool]string{true: "first", false: "second"}[c.first == nil]
			if rec, err := s.Get(db, in.Scope); err != nil || rec.Resource() != want {
				t.Fatalf("the record holds %q (%v), want %q", rec.Resource(), err, want)
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
