package idempotency_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// An intent in flight is never cleaned up, whatever its expires_at says.
// The claim writes a provisional expires_at (now plus the retention), so a
// money intent that stays unfinished past its retention (a long channel
// outage, a sweeper down for weeks) has a real expiry in the past; its
// record is then the only trace that its payment is unfinished, and
// removing it leaves the order waiting for ever (model/idempotency.pml,
// variant CLEANUP_INFLIGHT). Only the state filter of CleanupBatch keeps
// it: the records here are seeded as the service writes them, not with a
// NULL expiry that would hide a missing filter.
func TestCleanupNeverRemovesAnIntentInFlightWhateverItsExpiry(t *testing.T) {
	s := newStore()
	tenant := "inflight-" + uuid.NewString()[:8]
	t.Cleanup(func() { db.Exec("DELETE FROM idempotency_records WHERE tenant_id = ?", tenant) })
	intent := func(key string) idempotency.Intent {
		return idempotency.Intent{Scope: idempotency.Scope{TenantID: tenant, Operation: "op.money", Key: key}, Fingerprint: repeatA()}
	}
	claim := func(key string) idempotency.Claim {
		t.Helper()
		var c idempotency.Claim
		tx(t, func(tx *gorm.DB) error {
			var err error
			c, err = s.ClaimOrReplay(tx, intent(key))
			return err
		})
		return c
	}

	// Three intents in flight, as the service leaves them: an owner at
	// work, an owner that died (its lease ran out), and an intent whose
	// channel answer was lost (FAILED_RETRYABLE); and one finished.
	claim("working")
	dead := claim("dead")
	lost := claim("lost")
	finished := claim("finished")
	tx(t, func(tx *gorm.DB) error { return s.Fail(tx, lost.Record.Scope(), lost.Token(), time.Second) })
	tx(t, func(tx *gorm.DB) error {
		return s.Complete(tx, finished.Record.Scope(), finished.Token(), idempotency.Done("r-1", []byte(`{"ok":true}`)))
	})
	if n := countWhere(t, "tenant_id = '"+tenant+"' AND expires_at IS NOT NULL AND expires_at > now()"); n != 4 {
		t.Fatalf("%d of the 4 records have the expiry their claim or completion wrote, want 4", n)
	}
	// Then their retention passes: 40 days on, every expiry is behind us,
	// and the dead owner's lease with it.
	if err := db.Exec(`UPDATE idempotency_records
		SET created_at = created_at - interval '40 days', expires_at = now() - interval '1 day',
		    lease_expires_at = CASE WHEN idempotency_key = 'dead' THEN now() - interval '1 hour' ELSE lease_expires_at END
		WHERE tenant_id = ?`, tenant).Error; err != nil {
		t.Fatal(err)
	}

	// Each removal is told to Store.Removed (the order tests record it as a
	// step the model must explain): the finished record, and nothing else.
	var removed []idempotency.Removed
	s.Removed = func(_ context.Context, r idempotency.Removed) {
		if r.TenantID == tenant {
			removed = append(removed, r)
		}
	}
	c := &idempotency.Cleaner{DB: db, Store: s, Batch: 100, Pause: time.Millisecond}
	if _, err := c.Pass(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0].Key != "finished" || removed[0].State != idempotency.Succeeded {
		t.Errorf("the cleanup told of removing %+v, want the finished record alone, SUCCEEDED", removed)
	}

	for key, state := range map[string]idempotency.State{"working": idempotency.Processing, "dead": idempotency.Processing, "lost": idempotency.FailedRetryable} {
		if n := countWhere(t, "tenant_id = '"+tenant+"' AND idempotency_key = '"+key+"' AND state = '"+string(state)+"'"); n != 1 {
			t.Errorf("the cleanup removed the %s intent %q (expired, in flight): its payment would never be finished", state, key)
		}
	}
	if n := countWhere(t, "tenant_id = '"+tenant+"' AND idempotency_key = 'finished'"); n != 0 {
		t.Error("the cleanup kept the finished record whose retention had passed")
	}

	// What was kept can still be finished: the dead owner's intent is taken over.
	next := claim("dead")
	if !next.Resumes() || next.Token() != dead.Token()+1 {
		t.Errorf("after the cleanup the dead owner's intent was not taken over: %+v", next.Record)
	}
}
