package order_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
)

// A step taken in a transaction is recorded inside it, before it commits
// (so that conflicting transactions are recorded in the order the database
// serialized them). When that commit then fails, or the transaction is
// rerun after a serialization failure, the step did not happen: the run
// the checker reads must hold each step once, and only for the attempt
// that committed.
func TestAStepStandsOnlyIfItsTransactionCommits(t *testing.T) {
	const lease = 3 * time.Second
	cases := []struct {
		name     string
		on, when string // the statements on the pay's record whose first commit fails (%s: its key)
		errcode  string // what that commit fails with
		step     string // the step recorded in that transaction
		retry    bool   // the client must send the key again
		clean    bool   // the record expires and the cleanup removes it
	}{
		{"phase 3's store, rerun after a serialization failure at its commit",
			"INSERT OR UPDATE", "NEW.idempotency_key = '%s' AND NEW.state = 'SUCCEEDED'", "40001", "store", false, false},
		{"phase 1's claim, whose commit fails",
			"INSERT OR UPDATE", "NEW.idempotency_key = '%s' AND NEW.state = 'PROCESSING'", "P0001", "claim", true, false},
		{"the cleanup's removal, rerun after a deadlock at its commit",
			"DELETE", "OLD.idempotency_key = '%s'", "40P01", "cleanup", false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newAcquirer()
			s, log := recordedUseCases(t, a.channel(), lease)
			id, key := placeOrder(t, s), newKey("R50-commit")
			commits := failFirstCommit(t, s.DB, c.on, fmt.Sprintf(c.when, key), c.errcode)

			res, err := s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
			if c.retry {
				if err == nil {
					t.Fatalf("the pay whose claim could not commit = %s, want an error", res.Outcome)
				}
				res, err = s.Pay(t.Context(), acme(key), id, payWith(payment.MethodOK))
			}
			wantOutcome(t, "the pay", res, err, idempotency.OutcomeDone)
			wantCounted(t, a, ledger{charges: 1, requests: 1})
			want := map[string]int{"claim": 1, "store": 1}
			if c.clean {
				expireAndClean(t, s, 1, key)
				want["cleanup"] = 1
			}
			if n := commits(); n < 2 {
				t.Fatalf("the trigger saw %d commits, want the failed one and one after it", n)
			}

			got := map[string][]string{}
			for _, l := range log.Lines() {
				var in steps.Intent
				if err := json.Unmarshal(l.Data, &in); err == nil && in.Key == key {
					got[l.Step] = append(got[l.Step], string(l.Data))
				}
			}
			for step, n := range want {
				if len(got[step]) != n {
					t.Errorf("the run holds %d %s steps of the pay, want %d (the %s of the attempt that rolled back stood?): %q",
						len(got[step]), step, n, c.step, got[step])
				}
			}
		})
	}
}

// recordedUseCases is useCases recording its steps: into the log the trace
// check reads when the run is recorded (ORDERSERVICE_TRACE_DIR), else into
// one of the test's own.
func recordedUseCases(t *testing.T, ch order.Channel, lease time.Duration) (*order.Service, *steps.Log) {
	s := useCases(t, ch, lease)
	if log := recorded(t); log != nil {
		return s, log
	}
	log := &steps.Log{}
	deps := s.Deps
	records := *deps.Records
	deps.Steps, records.Removed, deps.Records = log, order.CleanupSteps(log), &records
	return order.NewService(deps), log
}

// failFirstCommit makes the first commit of a transaction that ran a
// statement on (INSERT, UPDATE, DELETE) of a record of which when holds
// fail with errcode: a deferred constraint trigger raises at the commit,
// after all the transaction did (its step recorded included), as a commit
// the database refuses. commits is how many such commits the trigger saw.
func failFirstCommit(t *testing.T, db *gorm.DB, on, when, errcode string) (commits func() int64) {
	t.Helper()
	for _, stmt := range []string{
		`CREATE SEQUENCE test_commits`,
		fmt.Sprintf(`CREATE FUNCTION test_fail_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('test_commits') = 1 THEN
				RAISE EXCEPTION 'injected: the commit fails' USING ERRCODE = '%s';
			END IF;
			RETURN NULL;
		END $$`, errcode),
		fmt.Sprintf(`CREATE CONSTRAINT TRIGGER test_fail_first_commit AFTER %s ON idempotency_records
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (%s) EXECUTE FUNCTION test_fail_first_commit()`, on, when),
	} {
		if err := db.Exec(stmt).Error; err != nil {
			t.Fatalf("injecting the failed commit: %v", err)
		}
	}
	t.Cleanup(func() {
		db.Exec(`DROP TRIGGER test_fail_first_commit ON idempotency_records`)
		db.Exec(`DROP FUNCTION test_fail_first_commit()`)
		db.Exec(`DROP SEQUENCE test_commits`)
	})
	return func() int64 {
		return count(t, db, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM test_commits`)
	}
}
