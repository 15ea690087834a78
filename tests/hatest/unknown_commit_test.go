//go:build ha

package hatest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/orderservice/orderservice/client"
)

// Scenario 2: the unknown commit on purpose. The proxy in front of the
// primary traps the COMMIT of a create; the primary's node is killed
// there; the service cannot know whether the order exists. The client's
// retry under the same key must replay the order if the commit survived
// and create it once if it did not.
func TestUnknownCommitResolvedByTheKey(t *testing.T) {
	m, other := startInstance(t, nil), startInstance(t, nil)
	for _, mode := range []trapMode{dropCommit, holdReply, raceKill} {
		t.Run(mode.String(), func(t *testing.T) {
			healthy(t)
			leader, err := ha.cluster.leader()
			if err != nil {
				t.Fatal(err)
			}
			// The backends the create will use exist already: find them now,
			// so that the kill lands right after the trap springs.
			m.DB.Exec("SELECT 1")
			crash := ha.cluster.crasher(leader)
			trap := newCommitTrap(mode)
			ha.proxies[leader.name].arm(trap)
			released := false
			release := func() {
				if !released {
					close(trap.release)
					released = true
				}
			}
			defer release()
			before := countOrders(t, "unknown")

			// The first call makes one attempt, through m: its answer is what
			// the service says about a commit it cannot know. The retry goes
			// through the other instance, as a load balancer may send it.
			log := &attemptLog{}
			c := newClientWith(m.URL(), tenants["unknown"], log, client.RetryPolicy{MaxAttempts: 1})
			retry := newClient(other.URL(), tenants["unknown"], &attemptLog{})
			key := client.NewKey()
			type result struct {
				res client.Result[client.Order]
				err error
			}
			done := make(chan result, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				first, err := c.CreateOrder(ctx, createRequest(1), client.WithKey(key))
				if err == nil {
					done <- result{first, nil}
					return
				}
				res, err := retry.CreateOrder(ctx, createRequest(1), client.WithKey(key))
				res.Attempts += first.Attempts
				done <- result{res, err}
			}()

			select {
			case <-trap.caught:
			case <-time.After(30 * time.Second):
				t.Fatal("the create's COMMIT never reached the trap")
			}
			if mode == holdReply {
				select {
				case <-trap.replied: // committed, and on the synchronous standby
				case <-time.After(30 * time.Second):
					t.Fatal("the primary never answered the trapped COMMIT")
				}
			}
			killAt := time.Now()
			if err := crash(); err != nil {
				t.Fatal(err)
			}
			release()
			var r result
			select {
			case r = <-done:
			case <-time.After(90 * time.Second):
				t.Fatal("the create never ended")
			}
			if r.err != nil {
				t.Fatalf("create under key %s never succeeded: %v", key, r.err)
			}

			attempts := log.attempts()
			first := attempts[0]
			t.Run("the unknown commit is answered 503 with Retry-After", func(t *testing.T) {
				if first.status != http.StatusServiceUnavailable || first.retryAfter == "" {
					t.Errorf("the first attempt got %d (Retry-After %q, err %v), want 503 with Retry-After", first.status, first.retryAfter, first.err)
				}
			})
			t.Run("one order for the key, the one the client got", func(t *testing.T) {
				if n := countOrders(t, "unknown") - before; n != 1 {
					t.Errorf("%d orders made for one key", n)
				}
				if got := orderOfKey(t, "unknown", key); got != r.res.Value.ID {
					t.Errorf("the record names %q, the client got %q", got, r.res.Value.ID)
				}
			})
			branch := "did not survive: the retry created the order once"
			if r.res.Replayed {
				branch = "survived: the retry replayed the order"
			}
			t.Run("the branch the trap forces", func(t *testing.T) {
				switch {
				case mode == dropCommit && r.res.Replayed:
					t.Error("a COMMIT the server never saw survived")
				case mode == holdReply && !r.res.Replayed:
					t.Error("a COMMIT the primary had answered (synchronously replicated) was lost")
				}
			})
			figure(t, "scenario 2 [%s]: the commit %s; first answer (instance 1) %d Retry-After %s; %d attempts in all, the retries through instance 2; 201 %s after the kill",
				mode, branch, first.status, first.retryAfter, r.res.Attempts, time.Since(killAt).Round(10*time.Millisecond))
		})
	}
}

func countOrders(t *testing.T, tenant string) int {
	t.Helper()
	var n int
	queryRow(t, "SELECT count(*) FROM orders WHERE tenant_id = $1", []any{tenant}, &n)
	return n
}

func orderOfKey(t *testing.T, tenant, key string) string {
	t.Helper()
	var id string
	queryRow(t, "SELECT coalesce(resource_id, '') FROM idempotency_records WHERE tenant_id = $1 AND operation = 'order.create' AND idempotency_key = $2",
		[]any{tenant, key}, &id)
	return id
}

// queryRow reads one row from the current primary.
func queryRow(t *testing.T, sql string, args []any, dest ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	for attempt := 0; attempt < 60; attempt++ { // the primary may still be on its way
		var conn *pgx.Conn
		if conn, err = pgx.Connect(ctx, ha.directURL); err == nil {
			err = conn.QueryRow(ctx, sql, args...).Scan(dest...)
			conn.Close(ctx)
			if err == nil {
				return
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%s: %v", sql, err)
}
