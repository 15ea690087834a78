package idempotency_test

import (
	"errors"
	"testing"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/tests/apptest"
)

func TestClaimOrReplay(t *testing.T) {
	s := newStore()
	in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t1", Operation: "op.test", Key: "k1"}, Fingerprint: fp("a")}
	res := idempotency.Created("res-1", []byte(`{"id":1}`))

	var first idempotency.Claim
	t.Run("the first claim owns the intent with token 1", func(t *testing.T) {
		tx(t, func(tx *gorm.DB) error {
			var err error
			first, err = s.ClaimOrReplay(tx, in)
			return err
		})
		if first.Replay != nil || first.Resumes() || first.Token() != 1 || first.Record.State != idempotency.Processing {
			t.Fatalf("claim = %+v", first)
		}
	})

	t.Run("a live lease is 409 request_in_progress with Retry-After", func(t *testing.T) {
		err := db.Transaction(func(tx *gorm.DB) error { _, err := s.ClaimOrReplay(tx, in); return err })
		var p *problem.Error
		if !errors.As(err, &p) || p.Code != problem.RequestInProgress || p.RetryAfter < 1e9 || p.RetryAfter > 5e9 {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("another fingerprint is 422 whatever the state", func(t *testing.T) {
		other := in
		other.Fingerprint = fp("b")
		err := db.Transaction(func(tx *gorm.DB) error { _, err := s.ClaimOrReplay(tx, other); return err })
		if problem.CodeOf(err) != problem.KeyReused {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("completing stores the result; a duplicate replays it", func(t *testing.T) {
		tx(t, func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, first.Token(), res)
		})
		var c idempotency.Claim
		tx(t, func(tx *gorm.DB) error { var err error; c, err = s.ClaimOrReplay(tx, in); return err })
		if c.Replay == nil || c.Replay.Outcome != idempotency.OutcomeCreated || string(c.Replay.Body) != `{"id":1}` || c.Replay.Resource != "res-1" || !c.Replay.Replayed {
			t.Fatalf("replay = %+v", c.Replay)
		}
		if c.Record.Resource() != "res-1" || c.Record.ExpiresAt == nil {
			t.Errorf("record = %+v", c.Record)
		}
	})

	t.Run("a second Complete is fenced: the outcome is written once", func(t *testing.T) {
		err := db.Transaction(func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, first.Token(), idempotency.Failed("", problem.Errorf(problem.NotFound, "gone")))
		})
		if !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("the same key in another scope is another intent", func(t *testing.T) {
		for _, scope := range []idempotency.Scope{{TenantID: "t2", Operation: "op.test", Key: "k1"}, {TenantID: "t1", Operation: "op.other", Key: "k1"}} {
			var c idempotency.Claim
			tx(t, func(tx *gorm.DB) error {
				var err error
				c, err = s.ClaimOrReplay(tx, idempotency.Intent{Scope: scope, Fingerprint: fp("z")})
				return err
			})
			if c.Replay != nil || c.Token() != 1 {
				t.Errorf("%v: claim = %+v", scope, c)
			}
		}
	})
}

func TestTakeoverAndFencing(t *testing.T) {
	s := newStore()
	in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t1", Operation: "op.fence", Key: "take-1"}, Fingerprint: fp("a")}
	var old idempotency.Claim
	tx(t, func(tx *gorm.DB) error { var err error; old, err = s.ClaimOrReplay(tx, in); return err })
	expire(t, in.Scope)

	var next idempotency.Claim
	t.Run("an expired lease is taken over with a new token", func(t *testing.T) {
		tx(t, func(tx *gorm.DB) error { var err error; next, err = s.ClaimOrReplay(tx, in); return err })
		if !next.Resumes() || next.ResumedFrom != idempotency.Processing || next.Token() != old.Token()+1 || next.Record.Attempts != 2 {
			t.Fatalf("takeover = %+v", next)
		}
	})
	t.Run("the superseded owner's write affects 0 rows", func(t *testing.T) {
		before := apptest.RecordRow(t, db, in.Scope)
		err := db.Transaction(func(tx *gorm.DB) error {
			return s.Complete(tx, in.Scope, old.Token(), idempotency.Done("", []byte("{}")))
		})
		if !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("err = %v", err)
		}
		if err := db.Transaction(func(tx *gorm.DB) error { return s.Fail(tx, in.Scope, old.Token(), 1e9) }); !errors.Is(err, idempotency.ErrFenced) {
			t.Fatalf("Fail err = %v", err)
		}
		if after := apptest.RecordRow(t, db, in.Scope); after != before {
			t.Errorf("record changed:\n%s\n%s", before, after)
		}
	})
	t.Run("FAILED_RETRYABLE is resumed by the next retry at once", func(t *testing.T) {
		tx(t, func(tx *gorm.DB) error { return s.Fail(tx, in.Scope, next.Token(), 60e9) })
		var again idempotency.Claim
		tx(t, func(tx *gorm.DB) error { var err error; again, err = s.ClaimOrReplay(tx, in); return err })
		if !again.Resumes() || again.ResumedFrom != idempotency.FailedRetryable || again.Token() != next.Token()+1 {
			t.Fatalf("resume = %+v", again)
		}
	})
	t.Run("the sweeper's ClaimDue takes only expired unfinished records of its operations", func(t *testing.T) {
		expire(t, in.Scope)
		var due []idempotency.Record
		tx(t, func(tx *gorm.DB) error {
			var err error
			due, err = s.ClaimDue(tx, []string{"op.fence"}, 10)
			return err
		})
		if len(due) != 1 || due[0].IdempotencyKey != "take-1" || due[0].LeaseToken != 4 {
			t.Fatalf("due = %+v", due)
		}
		tx(t, func(tx *gorm.DB) error {
			var err error
			due, err = s.ClaimDue(tx, []string{"op.fence"}, 10)
			return err
		})
		if len(due) != 0 {
			t.Fatalf("a live lease was taken again: %+v", due)
		}
	})
}

func expire(t *testing.T, sc idempotency.Scope) {
	t.Helper()
	if err := db.Exec("UPDATE idempotency_records SET lease_expires_at = now() - interval '1 second' WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?",
		sc.TenantID, sc.Operation, sc.Key).Error; err != nil {
		t.Fatal(err)
	}
}

func fp(s string) string {
	f, _ := idempotency.Fingerprint("op", "", s)
	return f
}

// Issue 11.4: a retry that lost the takeover compare-and-swap to an owner
// that has just finished used to be told 409; it now gets that outcome.
func TestARetryLosingTheTakeoverToAFinishedOwnerReplaysItsOutcome(t *testing.T) {
	s := newStore()
	in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "t1", Operation: "op.race", Key: "k-race"}, Fingerprint: fp("race")}
	res := idempotency.Done("res", []byte(`{"paid":true}`))
	var first idempotency.Claim
	tx(t, func(tx *gorm.DB) error { var err error; first, err = s.ClaimOrReplay(tx, in); return err })
	tx(t, func(tx *gorm.DB) error { return s.Fail(tx, in.Scope, first.Token(), 0) })

	// The loser has read the record (FAILED_RETRYABLE, token 1) and is about
	// to take it over when the winner takes it, finishes and commits.
	stale, err := s.ReadForTest(db, in.Scope)
	if err != nil {
		t.Fatal(err)
	}
	tx(t, func(tx *gorm.DB) error {
		won, err := s.ClaimOrReplay(tx, in)
		if err != nil || !won.Resumes() || won.Token() != 2 {
			t.Fatalf("winner's takeover = %+v, %v", won, err)
		}
		return s.Complete(tx, in.Scope, won.Token(), res)
	})
	var lost idempotency.Claim
	tx(t, func(tx *gorm.DB) error { var err error; lost, err = s.ResolveForTest(tx, in, stale); return err })
	if lost.Replay == nil || string(lost.Replay.Body) != `{"paid":true}` || !lost.Replay.Replayed {
		t.Fatalf("the loser's claim = %+v, want the winner's outcome replayed", lost)
	}
}
