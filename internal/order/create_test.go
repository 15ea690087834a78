package order_test

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/testdb"
)

func TestCreateIsIdempotent(t *testing.T) {
	m, acme := start(t, nil)
	globex := apptest.NewClient(m, apptest.KeyGlobex)
	body := createBody("cus_lost_response")

	first := acme.Do(t, http.MethodPost, "/v1/orders", "R1", body)
	if first.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", first.Status, first.Body)
	}
	id := first.JSON(t)["id"].(string)

	t.Run("sends 201 with Location and no replay header the first time", func(t *testing.T) {
		if got, want := first.Header.Get("Location"), "/v1/orders/"+id; got != want {
			t.Errorf("Location = %q, want %q", got, want)
		}
		if first.Header.Get("Idempotent-Replayed") != "" {
			t.Error("first response is marked replayed")
		}
	})

	t.Run("a retry after a lost response gets the same order, never a new one", func(t *testing.T) {
		again := acme.Do(t, http.MethodPost, "/v1/orders", "R1", body)
		if again.Status != http.StatusCreated || !bytes.Equal(again.Body, first.Body) {
			t.Fatalf("replay = %d %s, want 201 %s", again.Status, again.Body, first.Body)
		}
		if again.Header.Get("Location") != first.Header.Get("Location") || again.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay headers = %v", again.Header)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = 'cus_lost_response'"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})

	t.Run("field order, whitespace, case and trace data do not change the fingerprint", func(t *testing.T) {
		raw := `{ "items" : [ {"unit_price":1250, "quantity":2, "sku":" SKU-1 "} ],
		          "currency":"eur", "customer_id":"cus_lost_response", "client_trace_id":"trace-123" }`
		h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, "X-Request-Id": {"abc"}}
		again, err := acme.Send(http.MethodPost, "/v1/orders", "R1", raw, h)
		if err != nil || again.Status != http.StatusCreated || !bytes.Equal(again.Body, first.Body) {
			t.Fatalf("replay = %d %s (%v)", again.Status, again.Body, err)
		}
	})

	t.Run("the quoted structured-field form names the same key", func(t *testing.T) {
		again := acme.Do(t, http.MethodPost, "/v1/orders", `"R1"`, body)
		if again.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.Body, first.Body) {
			t.Fatalf("quoted key did not replay: %d %s", again.Status, again.Body)
		}
	})

	t.Run("the same key with other items is 422 and changes nothing", func(t *testing.T) {
		before := apptest.RecordRow(t, m.DB, idempotency.Scope{TenantID: "acme", Operation: order.OpCreate, Key: "R1"})
		other := createBody("cus_lost_response")
		other["items"] = []map[string]any{{"sku": "SKU-1", "quantity": 3, "unit_price": 1250}}
		r := acme.Do(t, http.MethodPost, "/v1/orders", "R1", other)
		apptest.WantProblem(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
		if after := apptest.RecordRow(t, m.DB, idempotency.Scope{TenantID: "acme", Operation: order.OpCreate, Key: "R1"}); after != before {
			t.Errorf("record changed:\nbefore %s\nafter  %s", before, after)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = 'cus_lost_response'"); n != 1 {
			t.Errorf("orders = %d, want 1", n)
		}
	})

	t.Run("a new key for the same purchase is a second real order", func(t *testing.T) {
		r := acme.Do(t, http.MethodPost, "/v1/orders", "R1-second", body)
		if r.Status != http.StatusCreated || r.JSON(t)["id"] == id {
			t.Fatalf("second purchase = %d %s", r.Status, r.Body)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = 'cus_lost_response'"); n != 2 {
			t.Errorf("orders = %d, want 2", n)
		}
	})

	t.Run("another tenant's R1 is its own intent and its own order", func(t *testing.T) {
		r := globex.Do(t, http.MethodPost, "/v1/orders", "R1", body)
		if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" || r.JSON(t)["id"] == id {
			t.Fatalf("other tenant = %d %v %s", r.Status, r.Header, r.Body)
		}
		if got := globex.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil); got.Status != http.StatusNotFound {
			t.Errorf("other tenant reads acme's order: %d", got.Status)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE tenant_id = 'globex'"); n != 1 {
			t.Errorf("globex orders = %d, want 1", n)
		}
	})

	t.Run("the record shows the intent", func(t *testing.T) {
		r := acme.Do(t, http.MethodGet, "/v1/idempotency-records?key=R1", "", nil)
		recs := r.JSON(t)["records"].([]any)
		if r.Status != http.StatusOK || len(recs) != 1 {
			t.Fatalf("records = %d %s", r.Status, r.Body)
		}
		rec := recs[0].(map[string]any)
		if rec["state"] != string(idempotency.Succeeded) || rec["operation"] != "order.create" || rec["resource_id"] != id ||
			rec["response_status"] != float64(201) || len(rec["fingerprint"].(string)) != 64 || rec["expires_at"] == nil {
			t.Errorf("record = %v", rec)
		}
	})
}

func TestReadingOrders(t *testing.T) {
	m, _ := start(t, map[string]string{"API_KEYS": "reader=reader-key-1"})
	acme := apptest.NewClient(m, "reader-key-1")
	var ids []string
	for i := range 5 {
		customer := "cus_list_a"
		if i%2 == 1 {
			customer = "cus_list_b"
		}
		r := acme.Do(t, http.MethodPost, "/v1/orders", fmt.Sprintf("list-%d", i), createBody(customer))
		ids = append(ids, r.JSON(t)["id"].(string))
	}

	t.Run("GET returns the order as created", func(t *testing.T) {
		r := acme.Do(t, http.MethodGet, "/v1/orders/"+ids[0], "", nil)
		o := r.JSON(t)
		if r.Status != http.StatusOK || o["id"] != ids[0] || o["total_amount"] != float64(2500) || o["status"] != "CREATED" {
			t.Fatalf("get = %d %s", r.Status, r.Body)
		}
	})

	t.Run("the list pages newest first with a cursor", func(t *testing.T) {
		var seen []string
		cursor := ""
		for pages := 0; pages < 10; pages++ {
			r := acme.Do(t, http.MethodGet, "/v1/orders?limit=2&cursor="+cursor, "", nil)
			page := r.JSON(t)
			for _, o := range page["orders"].([]any) {
				seen = append(seen, o.(map[string]any)["id"].(string))
			}
			next, _ := page["next_cursor"].(string)
			if next == "" {
				break
			}
			cursor = next
		}
		want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
		if strings.Join(seen, ",") != strings.Join(want, ",") {
			t.Errorf("pages = %v, want %v", seen, want)
		}
	})

	t.Run("filters by customer and status", func(t *testing.T) {
		r := acme.Do(t, http.MethodGet, "/v1/orders?customer_id=cus_list_b&status=CREATED", "", nil)
		orders := r.JSON(t)["orders"].([]any)
		if len(orders) != 2 {
			t.Fatalf("filtered = %s", r.Body)
		}
		r = acme.Do(t, http.MethodGet, "/v1/orders?status=PAID&customer_id=cus_list_b", "", nil)
		if n := len(r.JSON(t)["orders"].([]any)); n != 0 {
			t.Errorf("PAID filter returned %d orders", n)
		}
	})

	t.Run("bad list parameters are 400 naming the field", func(t *testing.T) {
		for _, q := range []string{"limit=0", "limit=101", "limit=x", "status=LOST", "cursor=zzz", "cursor=not*base64"} {
			r := acme.Do(t, http.MethodGet, "/v1/orders?"+q, "", nil)
			if r.Status != http.StatusBadRequest {
				t.Errorf("%s: status %d", q, r.Status)
				continue
			}
			apptest.WantProblem(t, r, http.StatusBadRequest, "invalid_request")
		}
	})
}

func TestConcurrentIdenticalCreatesMakeOneOrder(t *testing.T) {
	m, acme := start(t, nil)
	const n = 200
	body := createBody("cus_storm")
	results := atOnce(t, n, func(int) (apptest.Response, error) {
		return acme.Send(http.MethodPost, "/v1/orders", "storm", body, nil)
	})

	var created []byte
	counts := map[int]int{}
	for _, r := range results {
		counts[r.Status]++
		switch r.Status {
		case http.StatusCreated:
			if created == nil {
				created = r.Body
			} else if !bytes.Equal(r.Body, created) {
				t.Errorf("two different 201 bodies:\n%s\n%s", created, r.Body)
			}
		case http.StatusConflict:
			apptest.WantProblem(t, r, http.StatusConflict, "request_in_progress")
			if r.Header.Get("Retry-After") == "" {
				t.Error("409 without Retry-After")
			}
		default:
			t.Errorf("status %d: %s", r.Status, r.Body)
		}
	}
	t.Logf("statuses: %v", counts)
	if got := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = 'cus_storm'"); got != 1 {
		t.Errorf("orders = %d, want exactly 1", got)
	}
	if got := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'storm' AND state = 'SUCCEEDED'"); got != 1 {
		t.Errorf("SUCCEEDED records = %d, want exactly 1", got)
	}
}

// pausedCreate makes the first create the service runs stop inside its
// transaction, its record and order written but not committed, until resume
// is closed; calls counts the creates that got that far.
type pausedCreate struct {
	calls          atomic.Int32
	paused, resume chan struct{}
}

func pauseFirstCreate(m *app.Main) *pausedCreate {
	p := &pausedCreate{paused: make(chan struct{}), resume: make(chan struct{})}
	m.Orders.Hooks.AfterOrderInsert = func() error {
		if p.calls.Add(1) == 1 {
			close(p.paused)
			<-p.resume
		}
		return nil
	}
	return p
}

// sendCreate posts a create in the background; the answer comes on the channel.
func sendCreate(acme *apptest.Client, key string, body any) <-chan apptest.Response {
	answer := make(chan apptest.Response, 1)
	go func() {
		r, err := acme.Send(http.MethodPost, "/v1/orders", key, body, nil)
		if err != nil {
			r.Status = -1
		}
		answer <- r
	}()
	return answer
}

// A create's result is known before it writes, so its record is the first
// write of its transaction. A duplicate that arrives while the first is
// still inside that transaction waits at the record's key before doing any
// work; when the first commits, the duplicate's insert does nothing and it
// answers with the first's result, replayed.
func TestADuplicateOfACreateInFlightWaitsAtTheRecordAndDoesNoWork(t *testing.T) {
	for _, where := range []string{"on the same instance", "on another instance"} {
		t.Run(where, func(t *testing.T) {
			m, acme := start(t, nil)
			p := pauseFirstCreate(m)
			dup := acme
			if where == "on another instance" {
				other, client := start(t, nil)
				other.Orders.Hooks.AfterOrderInsert = func() error { p.calls.Add(1); return nil }
				dup = client
			}
			customer := "cus_in_flight_" + strings.ReplaceAll(where, " ", "_")
			key := "in-flight-" + strings.ReplaceAll(where, " ", "-")
			body := createBody(customer)
			firstAnswer := sendCreate(acme, key, body)
			<-p.paused
			duplicateAnswer := sendCreate(dup, key, body)
			testdb.WaitForLockWaiter(t, m.DB, "the duplicate")
			if got := p.calls.Load(); got != 1 {
				t.Errorf("creates executed while the first was in flight = %d, want 1: the duplicate must wait before its work", got)
			}
			close(p.resume)
			first, duplicate := <-firstAnswer, <-duplicateAnswer

			if first.Status != http.StatusCreated || first.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first = %d %s", first.Status, first.Body)
			}
			if duplicate.Status != http.StatusCreated || duplicate.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(duplicate.Body, first.Body) {
				t.Fatalf("duplicate = %d (replayed %q) %s; want the first's 201 replayed: %s",
					duplicate.Status, duplicate.Header.Get("Idempotent-Replayed"), duplicate.Body, first.Body)
			}
			if got := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", customer); got != 1 {
				t.Errorf("orders = %d, want exactly 1", got)
			}
			if got := apptest.Count(t, m.DB, "SELECT count(*) FROM order_outbox o JOIN orders r ON r.id = o.order_id WHERE r.customer_id = ?", customer); got != 1 {
				t.Errorf("outbox events = %d, want exactly 1", got)
			}
			if got := p.calls.Load(); got != 1 {
				t.Errorf("creates executed = %d, want 1", got)
			}
		})
	}
}

// A duplicate waits at the record's key for at most DB_LOCK_TIMEOUT: past
// it, it is told the request is in progress (409 with Retry-After) and has
// recorded nothing, and once the first commits the same key replays it.
func TestADuplicateWaitingPastTheLockTimeoutGets409(t *testing.T) {
	m, acme := start(t, map[string]string{"DB_LOCK_TIMEOUT": "300ms"})
	p := pauseFirstCreate(m)
	body := createBody("cus_lock_timeout")
	firstAnswer := sendCreate(acme, "lock-timeout", body)
	<-p.paused
	duplicate := acme.Do(t, http.MethodPost, "/v1/orders", "lock-timeout", body)
	apptest.WantProblem(t, duplicate, http.StatusConflict, "request_in_progress")
	if duplicate.Header.Get("Retry-After") == "" {
		t.Error("409 without Retry-After")
	}
	if got := p.calls.Load(); got != 1 {
		t.Errorf("creates executed = %d, want 1: the duplicate must not have run", got)
	}
	close(p.resume)
	if first := <-firstAnswer; first.Status != http.StatusCreated {
		t.Fatalf("first = %d %s", first.Status, first.Body)
	}
	retry := acme.Do(t, http.MethodPost, "/v1/orders", "lock-timeout", body)
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after the first committed = %d %s", retry.Status, retry.Body)
	}
	if got := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = 'cus_lock_timeout'"); got != 1 {
		t.Errorf("orders = %d, want exactly 1", got)
	}
}

// A one-transaction intent is never stored PROCESSING, so its key can be
// held by a record the create can neither replay (the read wants a
// definitive outcome) nor insert over (the key is taken) only if that
// record came from elsewhere: the state once's bound on lost record races
// exists for. The create must end with a 409 that records nothing, not
// loop, and not 500.
func TestACreateWhoseKeyIsHeldByARecordItCannotReplayEndsIn409(t *testing.T) {
	m, acme := start(t, nil)
	const key = "held-by-a-stranger"
	if err := m.DB.Exec(`
		INSERT INTO idempotency_records
			(tenant_id, operation, idempotency_key, fingerprint, state, lease_token, lease_expires_at, attempts, expires_at)
		VALUES ('acme', ?, ?, repeat('0', 64), 'PROCESSING', 7, now() + interval '1 hour', 1, now() + interval '1 day')`,
		order.OpCreate, key).Error; err != nil {
		t.Fatal(err)
	}

	r := acme.Do(t, http.MethodPost, "/v1/orders", key, createBody(key))
	apptest.WantAnswer(t, "create under a key it can neither replay nor take", r, http.StatusConflict, "request_in_progress")
	if r.Header.Get("Retry-After") == "" {
		t.Error("the 409 has no Retry-After")
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", key); n != 0 {
		t.Errorf("orders = %d, want 0", n)
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM order_outbox WHERE convert_from(payload, 'UTF8')::jsonb ->> 'idempotency_key' = ?", key); n != 0 {
		t.Errorf("outbox events = %d, want 0", n)
	}
	if n := apptest.Count(t, m.DB, `SELECT count(*) FROM idempotency_records
		WHERE idempotency_key = ? AND state = 'PROCESSING' AND lease_token = 7 AND result_body IS NULL`, key); n != 1 {
		t.Errorf("the stranger's record was changed (%d rows as it was, want 1)", n)
	}
}

func TestOneKeyTwoBodiesMakeOneOrder(t *testing.T) {
	m, acme := start(t, nil)
	const n = 100
	bodies := []map[string]any{createBody("cus_two_bodies"), createBody("cus_two_bodies")}
	bodies[1]["currency"] = "USD"
	results := atOnce(t, n, func(i int) (apptest.Response, error) {
		return acme.Send(http.MethodPost, "/v1/orders", "two-bodies", bodies[i%2], nil)
	})
	counts := map[int]int{}
	for _, r := range results {
		counts[r.Status]++
		switch r.Status {
		case http.StatusCreated, http.StatusConflict, http.StatusUnprocessableEntity:
		default:
			t.Errorf("status %d: %s", r.Status, r.Body)
		}
	}
	t.Logf("statuses: %v", counts)
	if got := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = 'cus_two_bodies'"); got != 1 {
		t.Errorf("orders = %d, want exactly 1", got)
	}
	if counts[http.StatusUnprocessableEntity] == 0 {
		t.Error("no request was refused as a key reuse")
	}
}

func TestCrashInsideCreateLeavesNothing(t *testing.T) {
	for _, crash := range []struct {
		name string
		hook func() error
	}{
		{"an error after the order insert", func() error { return errors.New("injected crash") }},
		{"a panic after the order insert", func() error { panic("injected panic") }},
	} {
		t.Run(crash.name+" rolls back the order and the record; the retry succeeds", func(t *testing.T) {
			m, acme := start(t, nil)
			m.Orders.Hooks.AfterOrderInsert = crash.hook
			key := "crash-" + strings.ReplaceAll(crash.name, " ", "-")
			r := acme.Do(t, http.MethodPost, "/v1/orders", key, createBody(key))
			if r.Status != http.StatusInternalServerError {
				t.Fatalf("crashed create = %d %s", r.Status, r.Body)
			}
			if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", key); n != 0 {
				t.Errorf("orders after crash = %d, want 0", n)
			}
			if n := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = ?", key); n != 0 {
				t.Errorf("records after crash = %d, want 0", n)
			}
			m.Orders.Hooks.AfterOrderInsert = nil
			r = acme.Do(t, http.MethodPost, "/v1/orders", key, createBody(key))
			if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry = %d %s", r.Status, r.Body)
			}
			if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = ?", key); n != 1 {
				t.Errorf("orders after retry = %d, want 1", n)
			}
		})
	}
}

func TestBadRequestsChangeNothing(t *testing.T) {
	m, _ := start(t, map[string]string{"API_KEYS": "careless=careless-key-1"})
	acme := apptest.NewClient(m, "careless-key-1")
	valid := createBody("cus_bad")
	tooMany := make([]map[string]any, 101)
	for i := range tooMany {
		tooMany[i] = map[string]any{"sku": "S", "quantity": 1, "unit_price": 1}
	}
	cases := []struct {
		name   string
		key    string
		header http.Header
		body   any
		status int
		code   string
	}{
		{"no Idempotency-Key is 400 idempotency_key_missing", "", nil, valid, 400, "idempotency_key_missing"},
		{"a key with a space is 400 idempotency_key_invalid", "has space", nil, valid, 400, "idempotency_key_invalid"},
		{"a 256-character key is 400", strings.Repeat("k", 256), nil, valid, 400, "idempotency_key_invalid"},
		{"a key with a control character is 400", "bad\tkey", nil, valid, 400, "idempotency_key_invalid"},
		{"a text/plain body is 415", "bad-1", http.Header{"Content-Type": {"text/plain"}}, `{}`, 415, "unsupported_media_type"},
		{"a body over 1 MiB is 413", "bad-2", nil, `{"customer_id":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "payload_too_large"},
		{"malformed JSON is 400", "bad-3", nil, `{"customer_id":`, 400, "invalid_request"},
		{"a server-owned field is refused", "bad-4", nil, map[string]any{"customer_id": "c", "currency": "EUR", "tenant_id": "globex",
			"items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": 1}}}, 400, "invalid_request"},
		{"a missing customer is 400", "bad-5", nil, map[string]any{"currency": "EUR", "items": valid["items"]}, 400, "invalid_request"},
		{"a bad currency is 400", "bad-6", nil, map[string]any{"customer_id": "c", "currency": "EURO", "items": valid["items"]}, 400, "invalid_request"},
		{"no items is 400", "bad-7", nil, map[string]any{"customer_id": "c", "currency": "EUR", "items": []any{}}, 400, "invalid_request"},
		{"101 items is 400", "bad-8", nil, map[string]any{"customer_id": "c", "currency": "EUR", "items": tooMany}, 400, "invalid_request"},
		{"quantity 0 is 400", "bad-9", nil, map[string]any{"customer_id": "c", "currency": "EUR",
			"items": []map[string]any{{"sku": "S", "quantity": 0, "unit_price": 1}}}, 400, "invalid_request"},
		{"a negative price is 400", "bad-10", nil, map[string]any{"customer_id": "c", "currency": "EUR",
			"items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": -1}}}, 400, "invalid_request"},
		{"a total that overflows int64 is 400, not a wrapped number", "bad-11", nil, map[string]any{"customer_id": "c", "currency": "EUR",
			"items": []map[string]any{{"sku": "S", "quantity": 1000, "unit_price": int64(1) << 60}}}, 400, "invalid_request"},
		{"a price beyond int64 is 400", "bad-12", nil, `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":1e30}]}`, 400, "invalid_request"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := acme.Send(http.MethodPost, "/v1/orders", tc.key, tc.body, tc.header)
			if err != nil {
				t.Fatal(err)
			}
			apptest.WantProblem(t, r, tc.status, tc.code)
		})
	}
	t.Run("nothing was written", func(t *testing.T) {
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE tenant_id = 'careless'"); n != 0 {
			t.Errorf("orders = %d", n)
		}
		if n := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'careless'"); n != 0 {
			t.Errorf("records = %d", n)
		}
	})
	t.Run("the key of a rejected body may be sent again with a corrected body", func(t *testing.T) {
		r := acme.Do(t, http.MethodPost, "/v1/orders", "bad-5", valid)
		if r.Status != http.StatusCreated {
			t.Fatalf("corrected = %d %s", r.Status, r.Body)
		}
	})
	t.Run("a missing or unknown API key is 401", func(t *testing.T) {
		for _, key := range []string{"", "not-a-key"} {
			c := apptest.NewClient(m, key)
			apptest.WantProblem(t, c.Do(t, http.MethodGet, "/v1/orders", "", nil), 401, "unauthenticated")
		}
	})
}
