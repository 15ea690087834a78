package order_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/tests/testdb"
)

func TestCreateIsIdempotent(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	ctx := t.Context()
	customer, r1 := "cus_lost_response_"+uuid.NewString()[:8], newKey("R1")
	ordersOf := func(tenant string) int64 {
		return count(t, s.DB, "SELECT count(*) FROM orders WHERE tenant_id = ? AND customer_id = ?", tenant, customer)
	}

	first, err := s.Create(ctx, acme(r1), purchase(customer))
	wantOutcome(t, "create", first, err, idempotency.OutcomeCreated)
	wantExecuted(t, first)
	id := first.Resource

	t.Run("a retry after a lost response gets the same order, never a new one", func(t *testing.T) {
		again, err := s.Create(ctx, acme(r1), purchase(customer))
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
		if n := ordersOf("acme"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})

	t.Run("whitespace, case and trace data do not change the fingerprint", func(t *testing.T) {
		written := order.CreateRequest{CustomerID: " " + customer + " ", Currency: "eur", ClientTraceID: "trace-123",
			Items: []order.ItemRequest{{SKU: " SKU-1 ", Quantity: 2, UnitPrice: 1250}}}
		again, err := s.Create(ctx, acme(r1), written)
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
	})

	t.Run("the same key with other items is idempotency_key_reused and changes nothing", func(t *testing.T) {
		scope := idempotency.Scope{TenantID: "acme", Operation: order.OpCreate, Key: r1}
		before := recordRow(t, s.DB, scope)
		other := purchase(customer)
		other.Items[0].Quantity = 3
		_, err := s.Create(ctx, acme(r1), other)
		wantError(t, "the same key with other items", err, problem.KeyReused)
		if after := recordRow(t, s.DB, scope); after != before {
			t.Errorf("record changed:\nbefore %s\nafter  %s", before, after)
		}
		if n := ordersOf("acme"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})

	t.Run("a new key for the same purchase is a second real order", func(t *testing.T) {
		res, err := s.Create(ctx, acme(newKey("R1-second")), purchase(customer))
		wantOutcome(t, "second purchase", res, err, idempotency.OutcomeCreated)
		if res.Resource == id || res.Replayed {
			t.Fatalf("second purchase = %+v, want a new order", res)
		}
		if n := ordersOf("acme"); n != 2 {
			t.Errorf("orders = %d, want 2", n)
		}
	})

	t.Run("another tenant's R1 is its own intent and its own order", func(t *testing.T) {
		res, err := s.Create(ctx, globex(r1), purchase(customer))
		wantOutcome(t, "globex's create", res, err, idempotency.OutcomeCreated)
		if res.Replayed || res.Resource == id {
			t.Fatalf("other tenant = %+v, want its own new order", res)
		}
		if _, err := s.Get(ctx, "globex", id); problem.CodeOf(err) != order.CodeNotFound {
			t.Errorf("other tenant reads acme's order: %v", err)
		}
		if n := ordersOf("globex"); n != 1 {
			t.Errorf("globex orders = %d, want 1", n)
		}
	})

	t.Run("the record shows the intent", func(t *testing.T) {
		rec := recordOf(t, s, order.OpCreate, r1)
		if rec.State != idempotency.Succeeded || rec.Operation != "order.create" || rec.Resource() != id ||
			rec.Outcome == nil || *rec.Outcome != idempotency.OutcomeCreated || len(rec.Fingerprint) != 64 || rec.Expiry() == nil {
			t.Errorf("record = %+v", rec)
		}
	})
}

// recordRow is the whole stored row of scope's record as JSON text, to
// compare before and after.
func recordRow(t *testing.T, db *gorm.DB, scope idempotency.Scope) string {
	t.Helper()
	var row string
	err := db.Raw(`SELECT row_to_json(r)::text FROM idempotency_records r
		WHERE tenant_id = ? AND operation = ? AND idempotency_key = ?`, scope.TenantID, scope.Operation, scope.Key).Scan(&row).Error
	if err != nil || row == "" {
		t.Fatalf("record %+v: %v", scope, err)
	}
	return row
}

func TestReadingOrders(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	ctx := t.Context()
	// A tenant of its own, so that its list holds only these orders.
	reader := "reader-" + uuid.NewString()[:8]
	var ids []string
	for i := range 5 {
		customer := "cus_list_a"
		if i%2 == 1 {
			customer = "cus_list_b"
		}
		res, err := s.Create(ctx, order.Caller{TenantID: reader, Key: fmt.Sprintf("list-%d", i)}, purchase(customer))
		wantOutcome(t, "create", res, err, idempotency.OutcomeCreated)
		ids = append(ids, res.Resource)
	}

	t.Run("Get returns the order as created", func(t *testing.T) {
		o, err := s.Get(ctx, reader, ids[0])
		if err != nil || o.ID.String() != ids[0] || o.TotalAmount != purchaseTotal || o.Status != order.StatusCreated {
			t.Fatalf("get = %+v, %v", o, err)
		}
	})

	t.Run("the list pages newest first with a cursor", func(t *testing.T) {
		var seen []string
		cursor := ""
		for pages := 0; pages < 10; pages++ {
			page, err := s.List(ctx, reader, order.ListFilter{Page: order.PageRequest{Limit: 2, Cursor: cursor}})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range page.Orders {
				seen = append(seen, o.ID.String())
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
		if strings.Join(seen, ",") != strings.Join(want, ",") {
			t.Errorf("pages = %v, want %v", seen, want)
		}
	})

	t.Run("filters by customer and status", func(t *testing.T) {
		page, err := s.List(ctx, reader, order.ListFilter{CustomerID: "cus_list_b", Status: order.StatusCreated})
		if err != nil || len(page.Orders) != 2 {
			t.Fatalf("filtered = %d orders, %v; want 2", len(page.Orders), err)
		}
		page, err = s.List(ctx, reader, order.ListFilter{CustomerID: "cus_list_b", Status: order.StatusPaid})
		if err != nil || len(page.Orders) != 0 {
			t.Errorf("PAID filter = %d orders, %v; want 0", len(page.Orders), err)
		}
	})

	t.Run("a bad status, limit or cursor is invalid_request naming the field", func(t *testing.T) {
		for field, f := range map[string]order.ListFilter{
			"status": {Status: "LOST"},
			"limit":  {Page: order.PageRequest{Limit: 101}},
			"cursor": {Page: order.PageRequest{Cursor: "zzz"}},
		} {
			_, err := s.List(ctx, reader, f)
			if p := wantError(t, "list "+field, err, problem.InvalidRequest); p.Extensions["field"] != field {
				t.Errorf("list with a bad %s names the field %v", field, p.Extensions["field"])
			}
		}
		if _, err := s.List(ctx, reader, order.ListFilter{Page: order.PageRequest{Cursor: "not*base64"}}); problem.CodeOf(err) != problem.InvalidRequest {
			t.Errorf("a cursor that is not base64: %v, want invalid_request", err)
		}
	})
}

func TestConcurrentIdenticalCreatesMakeOneOrder(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	const n = 200
	customer, key := "cus_storm_"+uuid.NewString()[:8], newKey("storm")
	results, errs := make([]idempotency.Result, n), make([]error, n)
	atOnce(n, func(i int) { results[i], errs[i] = s.Create(t.Context(), acme(key), purchase(customer)) })

	var created []byte
	executed, inProgress := 0, 0
	for i, res := range results {
		switch err := errs[i]; {
		case err == nil && res.Outcome == idempotency.OutcomeCreated:
			if created == nil {
				created = res.Body
			} else if !bytes.Equal(res.Body, created) {
				t.Errorf("two different created orders:\n%s\n%s", created, res.Body)
			}
			if !res.Replayed {
				executed++
			}
		case problem.CodeOf(err) == problem.RequestInProgress:
			inProgress++
			wantRetryAfter(t, "request_in_progress", err)
		default:
			t.Errorf("create %d = %+v, %v", i, res, err)
		}
	}
	t.Logf("%d executed, %d replayed, %d told the first is in progress", executed, n-executed-inProgress, inProgress)
	if executed != 1 {
		t.Errorf("%d creates executed, want exactly 1 (the others replay it)", executed)
	}
	if got := count(t, s.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", customer); got != 1 {
		t.Errorf("orders = %d, want exactly 1", got)
	}
	if got := count(t, s.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = ? AND state = 'SUCCEEDED'", key); got != 1 {
		t.Errorf("SUCCEEDED records = %d, want exactly 1", got)
	}
}

// pausedCreate makes the first create a service runs stop inside its
// transaction, its record and order written but not committed, until resume
// is closed; calls counts the creates that got that far.
type pausedCreate struct {
	calls          atomic.Int32
	paused, resume chan struct{}
}

func pauseFirstCreate(s *order.Service) *pausedCreate {
	p := &pausedCreate{paused: make(chan struct{}), resume: make(chan struct{})}
	s.Hooks.AfterOrderInsert = func() error {
		if p.calls.Add(1) == 1 {
			close(p.paused)
			<-p.resume
		}
		return nil
	}
	return p
}

// answer is what a use case called in the background returned.
type answer struct {
	res idempotency.Result
	err error
}

// createInBackground runs a create; its answer comes on the channel.
func createInBackground(s *order.Service, c order.Caller, req order.CreateRequest) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		res, err := s.Create(context.Background(), c, req)
		out <- answer{res, err}
	}()
	return out
}

// A create's result is known before it writes, so its record is the first
// write of its transaction. A duplicate that arrives while the first is
// still inside that transaction waits at the record's key before doing any
// work; when the first commits, the duplicate's insert does nothing and it
// answers with the first's result, replayed.
func TestADuplicateOfACreateInFlightWaitsAtTheRecordAndDoesNoWork(t *testing.T) {
	for _, where := range []string{"on the same instance", "on another instance"} {
		t.Run(where, func(t *testing.T) {
			s := useCases(t, newAcquirer().channel(), 5*time.Second)
			p := pauseFirstCreate(s)
			dup := s
			if where == "on another instance" {
				dup = useCases(t, newAcquirer().channel(), 5*time.Second)
				dup.Hooks.AfterOrderInsert = func() error { p.calls.Add(1); return nil }
			}
			customer, key := "cus_in_flight_"+uuid.NewString()[:8], newKey("in-flight")
			firstAnswer := createInBackground(s, acme(key), purchase(customer))
			<-p.paused
			duplicateAnswer := createInBackground(dup, acme(key), purchase(customer))
			testdb.WaitForLockWaiter(t, s.DB, "the duplicate")
			if got := p.calls.Load(); got != 1 {
				t.Errorf("creates executed while the first was in flight = %d, want 1: the duplicate must wait before its work", got)
			}
			close(p.resume)
			first, duplicate := <-firstAnswer, <-duplicateAnswer

			wantOutcome(t, "first", first.res, first.err, idempotency.OutcomeCreated)
			wantExecuted(t, first.res)
			if duplicate.err != nil {
				t.Fatalf("duplicate: %v; want the first's result replayed", duplicate.err)
			}
			wantReplay(t, first.res, duplicate.res)
			if got := count(t, s.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", customer); got != 1 {
				t.Errorf("orders = %d, want exactly 1", got)
			}
			if got := count(t, s.DB, "SELECT count(*) FROM order_outbox o JOIN orders r ON r.id = o.order_id WHERE r.customer_id = ?", customer); got != 1 {
				t.Errorf("outbox events = %d, want exactly 1", got)
			}
			if got := p.calls.Load(); got != 1 {
				t.Errorf("creates executed = %d, want 1", got)
			}
		})
	}
}

// A duplicate waits at the record's key for at most DB_LOCK_TIMEOUT: past
// it, it is told the request is in progress (409 request_in_progress, with
// a Retry-After) and has recorded nothing, and once the first commits the
// same key replays it.
func TestADuplicateWaitingPastTheLockTimeoutGets409(t *testing.T) {
	s := useCasesOn(t, openDB(t, 300*time.Millisecond), newAcquirer().channel(), 5*time.Second)
	p := pauseFirstCreate(s)
	customer, key := "cus_lock_timeout_"+uuid.NewString()[:8], newKey("lock-timeout")
	firstAnswer := createInBackground(s, acme(key), purchase(customer))
	<-p.paused
	_, err := s.Create(t.Context(), acme(key), purchase(customer))
	wantError(t, "the duplicate past the lock timeout", err, problem.RequestInProgress)
	wantRetryAfter(t, "request_in_progress", err)
	if got := p.calls.Load(); got != 1 {
		t.Errorf("creates executed = %d, want 1: the duplicate must not have run", got)
	}
	close(p.resume)
	first := <-firstAnswer
	wantOutcome(t, "first", first.res, first.err, idempotency.OutcomeCreated)
	retry, err := s.Create(t.Context(), acme(key), purchase(customer))
	if err != nil {
		t.Fatalf("retry after the first committed: %v", err)
	}
	wantReplay(t, first.res, retry)
	if got := count(t, s.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", customer); got != 1 {
		t.Errorf("orders = %d, want exactly 1", got)
	}
}

// A one-transaction intent is never stored PROCESSING, so its key can be
// held by a record the create can neither replay (the read wants a
// definitive outcome) nor insert over (the key is taken) only if that
// record came from elsewhere: the state once's bound on lost record races
// exists for. The create must end with a 409 request_in_progress that
// records nothing, not loop, and not fail with an internal error.
func TestACreateWhoseKeyIsHeldByARecordItCannotReplayEndsIn409(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	key := newKey("held-by-a-stranger")
	if err := s.DB.Exec(`
		INSERT INTO idempotency_records
			(tenant_id, operation, idempotency_key, fingerprint, state, lease_token, lease_expires_at, attempts, expires_at)
		VALUES ('acme', ?, ?, repeat('0', 64), 'PROCESSING', 7, now() + interval '1 hour', 1, now() + interval '1 day')`,
		order.OpCreate, key).Error; err != nil {
		t.Fatal(err)
	}

	_, err := s.Create(t.Context(), acme(key), purchase(key))
	wantError(t, "create under a key it can neither replay nor take", err, problem.RequestInProgress)
	wantRetryAfter(t, "request_in_progress", err)
	if n := count(t, s.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", key); n != 0 {
		t.Errorf("orders = %d, want 0", n)
	}
	if n := count(t, s.DB, "SELECT count(*) FROM order_outbox WHERE convert_from(payload, 'UTF8')::jsonb ->> 'idempotency_key' = ?", key); n != 0 {
		t.Errorf("outbox events = %d, want 0", n)
	}
	if n := count(t, s.DB, `SELECT count(*) FROM idempotency_records
		WHERE idempotency_key = ? AND state = 'PROCESSING' AND lease_token = 7 AND result_body IS NULL`, key); n != 1 {
		t.Errorf("the stranger's record was changed (%d rows as it was, want 1)", n)
	}
}

func TestOneKeyTwoBodiesMakeOneOrder(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	const n = 100
	customer, key := "cus_two_bodies_"+uuid.NewString()[:8], newKey("two-bodies")
	bodies := []order.CreateRequest{purchase(customer), purchase(customer)}
	bodies[1].Currency = "USD"
	results, errs := make([]idempotency.Result, n), make([]error, n)
	atOnce(n, func(i int) { results[i], errs[i] = s.Create(t.Context(), acme(key), bodies[i%2]) })

	// The one create that executed decides which body the key stands for:
	// the same body replays it, the other is a reuse of the key.
	winner := -1
	for i, res := range results {
		if errs[i] == nil && !res.Replayed {
			if winner != -1 {
				t.Fatalf("two creates executed under one key: %d and %d", winner, i)
			}
			winner = i
		}
	}
	if winner == -1 {
		t.Fatal("no create executed")
	}
	tally := map[string]int{}
	for i, res := range results {
		sameBody := i%2 == winner%2
		switch code := problem.CodeOf(errs[i]); {
		case errs[i] == nil && sameBody && bytes.Equal(res.Body, results[winner].Body):
			tally["created or replayed"]++
		case code == problem.RequestInProgress:
			tally["in progress"]++
		case code == problem.KeyReused && !sameBody:
			tally["key reused"]++
		default:
			t.Errorf("create %d (the winner's body: %v) = %+v, %v", i, sameBody, res, errs[i])
		}
	}
	t.Logf("answers: %v", tally)
	if got := count(t, s.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", customer); got != 1 {
		t.Errorf("orders = %d, want exactly 1", got)
	}
	if tally["key reused"] == 0 {
		t.Error("no request was answered as a key reuse")
	}
}

func TestCrashInsideCreateLeavesNothing(t *testing.T) {
	for _, crash := range []struct {
		name   string
		panics bool
	}{
		{"an error after the order insert", false},
		{"a panic after the order insert", true},
	} {
		t.Run(crash.name+" rolls back the order and the record; the retry succeeds", func(t *testing.T) {
			s := useCases(t, newAcquirer().channel(), 5*time.Second)
			s.Hooks.AfterOrderInsert = func() error {
				if crash.panics {
					panic("injected panic")
				}
				return errors.New("injected crash")
			}
			key := newKey("crash")
			var err error
			panicked := panicOf(func() { _, err = s.Create(t.Context(), acme(key), purchase(key)) })
			switch {
			case crash.panics && panicked != "injected panic":
				t.Fatalf("the crashed create panicked with %v, want the injected panic", panicked)
			case !crash.panics && (panicked != nil || problem.CodeOf(err) != problem.Internal):
				t.Fatalf("the crashed create = %v (panic %v), want the injected error, an internal one", err, panicked)
			}
			if n := count(t, s.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", key); n != 0 {
				t.Errorf("orders after crash = %d, want 0", n)
			}
			if n := count(t, s.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = ?", key); n != 0 {
				t.Errorf("records after crash = %d, want 0", n)
			}
			s.Hooks.AfterOrderInsert = nil
			res, err := s.Create(t.Context(), acme(key), purchase(key))
			wantOutcome(t, "retry", res, err, idempotency.OutcomeCreated)
			wantExecuted(t, res)
			if n := count(t, s.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", key); n != 1 {
				t.Errorf("orders after retry = %d, want 1", n)
			}
		})
	}
}
