package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
	"github.com/orderservice/orderservice/internal/testdb"
	"github.com/orderservice/orderservice/migrations"
)

// oldResponse is a row as migration 007's schema stored it: the HTTP
// response itself. The bodies are byte for byte what the service before
// migration 008 sent and stored (problem.Render of that version).
type oldResponse struct {
	key, state, resource string
	status               int
	location, mediaType  string
	body                 string
}

var oldRows = []oldResponse{
	{"old-create", "SUCCEEDED", "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", 201, "/v1/orders/0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", "application/json",
		`{"id":"0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3","customer_id":"c-1","status":"CREATED","total_amount":2500,"metadata":{"z":"1","a":"2"}}`},
	{"old-ship", "SUCCEEDED", "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", 200, "", "application/json",
		`{"id":"0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3",  "status":"SHIPPED"}`},
	{"old-transition", "FAILED_FINAL", "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", 409, "", answer.ProblemType,
		`{"code":"invalid_transition","current_status":"SHIPPED","detail":"An order in status SHIPPED cannot cancel.","event":"cancel","status":409,"title":"The order cannot make this transition","type":"urn:orderservice:problem:invalid_transition"}`},
	{"old-not-found", "FAILED_FINAL", "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", 404, "", answer.ProblemType,
		`{"code":"order_not_found","detail":"No order 0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3 exists.","status":404,"title":"Order not found","type":"urn:orderservice:problem:order_not_found"}`},
	{"old-declined", "FAILED_FINAL", "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", 402, "", answer.ProblemType,
		`{"code":"payment_declined","detail":"The payment channel declined the charge; the order may be paid again with a new Idempotency-Key.","order_id":"0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3","status":402,"title":"The payment was declined","type":"urn:orderservice:problem:payment_declined"}`},
	{"old-refund-refused", "FAILED_FINAL", "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", 409, "", answer.ProblemType,
		`{"code":"refund_refused","detail":"The payment channel refused the refund (pm_refund_refused \u003c\u0026\u003e); the order stays PAID.","order_id":"0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3","status":409,"title":"The payment channel refused the refund","type":"urn:orderservice:problem:refund_refused"}`},
	{"old-key-ran", "FAILED_FINAL", "0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", 422, "", answer.ProblemType,
		`{"code":"idempotency_key_reused","detail":"This Idempotency-Key already ran order.pay on this order and its record has expired; use a new key for a new intent.","status":422,"title":"Idempotency-Key reused with different parameters","type":"urn:orderservice:problem:idempotency_key_reused"}`},
}

// Records stored before migration 008 (HTTP responses) replay after it
// (transport-neutral results) with the same status, Location, media type
// and body bytes, and GET /v1/idempotency-records shows the same
// response_status; the down migration gives the old columns back.
func TestRecordsStoredBeforeMigration8ReplayIdentically(t *testing.T) {
	url, drop, err := testdb.Create("migrate008")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	m := migrator(t, url)
	if err := m.Migrate(7); err != nil {
		t.Fatalf("down to 7: %v", err)
	}
	db, err := database.Open(context.Background(), url, database.Options{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = database.Close(db) })
	for _, r := range oldRows {
		var location any
		if r.location != "" {
			location = r.location
		}
		if err := db.Exec(`
			INSERT INTO idempotency_records (tenant_id, operation, idempotency_key, fingerprint, state, resource_id,
				response_status, response_location, response_content_type, response_body, completed_at, expires_at)
			VALUES ('acme', 'order.pay', ?, repeat('a', 64), ?, ?, ?, ?, ?, ?, now(), now() + interval '1 day')`,
			r.key, r.state, r.resource, r.status, location, r.mediaType, []byte(r.body)).Error; err != nil {
			t.Fatalf("old row %s: %v", r.key, err)
		}
	}
	if err := m.Migrate(8); err != nil {
		t.Fatalf("up to 8: %v", err)
	}

	store := &idempotency.Store{Policy: idempotency.Policy{Operations: []string{"order.pay"}}}
	for _, r := range oldRows {
		t.Run(r.key+" replays the bytes it was first sent with", func(t *testing.T) {
			rec, err := store.Get(db, idempotency.Scope{TenantID: "acme", Operation: "order.pay", Key: r.key})
			if err != nil {
				t.Fatal(err)
			}
			res, err := rec.Result()
			if err != nil {
				t.Fatal(err)
			}
			got := answer.Render(res)
			if got.Status != r.status || got.Location != r.location || got.ContentType != r.mediaType || string(got.Body) != r.body || !got.Replayed {
				t.Errorf("rendered %d %q %q %s (replayed %v)\nwant     %d %q %q %s", got.Status, got.Location, got.ContentType, got.Body, got.Replayed,
					r.status, r.location, r.mediaType, r.body)
			}
			if again := answer.Render(res); !bytes.Equal(again.Body, got.Body) {
				t.Errorf("a second rendering differs:\n%s\n%s", again.Body, got.Body)
			}
			if status, err := responseStatus(rec); err != nil || status == nil || *status != r.status {
				t.Errorf("response_status shown = %v, %v; want %d", status, err, r.status)
			}
		})
	}

	t.Run("a refusal the order builds now renders, first time and from its record, as before 008", func(t *testing.T) {
		refusal := problem.Errorf(order.CodeInvalidTransition, "An order in status SHIPPED cannot cancel.").
			With("current_status", order.StatusShipped).With("event", order.EventCancel)
		first := answer.Render(idempotency.Failed("0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", refusal))
		in := idempotency.Intent{Scope: idempotency.Scope{TenantID: "acme", Operation: "order.pay", Key: "new-transition"}, Fingerprint: strings.Repeat("b", 64)}
		store := &idempotency.Store{Lease: time.Minute, Policy: store.Policy}
		// Today's Store writes today's schema (migrations after 008 too).
		if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
			t.Fatal(err)
		}
		claim, err := store.ClaimOrReplay(db, in)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Complete(db, in.Scope, claim.Token(), idempotency.Failed("0190a6f0-6c1e-7a3b-8c4d-5e6f708192a3", refusal)); err != nil {
			t.Fatal(err)
		}
		replay, err := store.ClaimOrReplay(db, in)
		if err != nil || replay.Replay == nil {
			t.Fatalf("replay = %+v, %v", replay, err)
		}
		again := answer.Render(*replay.Replay)
		want := oldRows[2]
		if first.Status != want.status || string(first.Body) != want.body || again.Status != first.Status || !bytes.Equal(again.Body, first.Body) {
			t.Errorf("first %d %s\nreplay %d %s\nbefore 008 %d %s", first.Status, first.Body, again.Status, again.Body, want.status, want.body)
		}
	})

	t.Run("the down migration gives every row its HTTP response back", func(t *testing.T) {
		if err := m.Migrate(7); err != nil {
			t.Fatalf("down to 7: %v", err)
		}
		for _, r := range oldRows {
			var row struct {
				ResponseStatus      int
				ResponseLocation    *string
				ResponseContentType string
				ResponseBody        []byte
			}
			if err := db.Raw(`SELECT response_status, response_location, response_content_type, response_body FROM idempotency_records
				WHERE idempotency_key = ?`, r.key).Scan(&row).Error; err != nil {
				t.Fatal(err)
			}
			loc := ""
			if row.ResponseLocation != nil {
				loc = *row.ResponseLocation
			}
			if row.ResponseStatus != r.status || loc != r.location || row.ResponseContentType != r.mediaType || !sameJSON(t, row.ResponseBody, []byte(r.body)) {
				t.Errorf("%s after down: %d %q %q %s", r.key, row.ResponseStatus, loc, row.ResponseContentType, row.ResponseBody)
			}
			if r.state == "SUCCEEDED" && string(row.ResponseBody) != r.body {
				t.Errorf("%s: a success's body changed on the way down: %s", r.key, row.ResponseBody)
			}
		}
		if err := m.Migrate(8); err != nil {
			t.Fatalf("up to 8 again: %v", err)
		}
	})
}

func migrator(t *testing.T, url string) *migrate.Migrate {
	t.Helper()
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, "pgx5://"+strings.TrimPrefix(url, "postgres://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = m.Close() })
	return m
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := errors.Join(json.Unmarshal(a, &x), json.Unmarshal(b, &y)); err != nil {
		t.Fatal(err)
	}
	ax, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return bytes.Equal(ax, by)
}
