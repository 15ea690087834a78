package messaging_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"pgregory.net/rapid"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/tests/apptest"
)

// TestEveryDoorAnswersEverySequenceDefinitively is the contract's "one set
// of rules for every door" as a property: random sequences of create, pay,
// cancel, ship and deliver, each through HTTP or as a NATS command, with a
// handful of keys reused across orders, operations and doors, unknown
// orders among the known ones, and the cleanup removing every finished
// record in between (so keys come back after their records are gone).
// Whatever the sequence:
//   - no answer is a 5xx but the contract's transient 503 with Retry-After,
//     and no command is dead-lettered (each is well-formed);
//   - every record is definitive at the end (no PROCESSING left);
//   - every order that was paid has exactly one succeeded charge, every
//     refunded one exactly one succeeded refund, and the channel made no
//     movement of money the orders do not account for.
//
// rapid shrinks a failing sequence to a short one and prints it.
func TestEveryDoorAnswersEverySequenceDefinitively(t *testing.T) {
	w := newWorld(t)
	w.consumer(messaging.ConsumerHooks{}, nil)
	acme := w.tenantConn("acme")
	acmeJS, _ := jetstream.New(acme)
	results := subscribe(t, acme, messaging.ResultPrefix+"acme.>")
	dead := subscribe(t, w.nc, messaging.DLQPrefix+">")
	cleaner := &idempotency.Cleaner{DB: w.db, Store: w.orders.Records, Batch: 500}
	var run atomic.Int64
	var mu sync.Mutex
	seen := map[string]int{} // door, op and status of every answer
	defer func() { t.Logf("answers by door, op and status over %d sequences: %v", run.Load(), seen) }()

	rapid.Check(t, func(rt *rapid.T) {
		p := &propertyRun{w: w, t: rt, js: acmeJS, results: results, dead: dead,
			prefix: fmt.Sprintf("prop%d-", run.Add(1)), seen: func(answer string) { mu.Lock(); seen[answer]++; mu.Unlock() }}
		keys := rapid.SampledFrom([]string{"k1", "k2", "k3", "k4"})
		steps := rapid.IntRange(1, 40).Draw(rt, "steps")
		for range steps {
			door := rapid.SampledFrom([]string{"http", "nats"}).Draw(rt, "door")
			switch op := rapid.SampledFrom([]string{"create", "create", "pay", "pay", "cancel", "ship", "deliver", "cleanup"}).Draw(rt, "op"); op {
			case "cleanup":
				if err := w.db.Exec("UPDATE idempotency_records SET expires_at = now() - interval '1 second' WHERE idempotency_key LIKE ? AND state IN ('SUCCEEDED', 'FAILED_FINAL')",
					p.prefix+"%").Error; err != nil {
					rt.Fatal(err)
				}
				if _, err := cleaner.Pass(context.Background()); err != nil {
					rt.Fatalf("cleanup: %v", err)
				}
			case "create":
				status, body := p.send(door, op, keys.Draw(rt, "key"), "", fmt.Sprintf(`{"customer_id":%q,"currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":700}]}`, p.prefix+"cus"))
				if status == http.StatusCreated {
					var o struct{ ID string }
					_ = json.Unmarshal(body, &o)
					p.orders = append(p.orders, o.ID)
				}
			default:
				id := uuid.NewString() // an order nobody made
				if len(p.orders) > 0 && rapid.IntRange(0, 9).Draw(rt, "known") > 0 {
					id = rapid.SampledFrom(p.orders).Draw(rt, "order")
				}
				body := map[string]string{"cancel": `{}`, "ship": `{"carrier":"DHL","tracking_number":"T-1"}`, "deliver": `{}`}[op]
				if op == "pay" {
					body = `{"payment_method":"` + rapid.SampledFrom([]string{"pm_ok", "pm_ok", "pm_declined"}).Draw(rt, "method") + `"}`
				}
				p.send(door, op, keys.Draw(rt, "key"), id, body)
			}
		}
		p.checkConverged()
	})
}

// propertyRun is one random sequence: its keys (prefixed, so sequences do
// not share keys) and the orders it created.
type propertyRun struct {
	w       *world
	t       *rapid.T
	js      jetstream.JetStream
	results chan *nats.Msg
	dead    chan *nats.Msg
	prefix  string
	orders  []string
	seen    func(answer string)
}

// send runs one request through door and checks its answer is definitive
// or the contract's transient 503; it returns the status and body.
func (p *propertyRun) send(door, op, key, orderID, body string) (int, []byte) {
	key = p.prefix + key
	if door == "http" {
		path := "/v1/orders"
		if op != "create" {
			path += "/" + orderID + "/" + op
		}
		r, err := p.w.api.Send(http.MethodPost, path, key, body, nil)
		if err != nil {
			p.t.Fatalf("%s %s: %v", op, key, err)
		}
		p.checkStatus(door, op, key, r.Status, r.Header.Get("Retry-After"), r.Body)
		return r.Status, r.Body
	}
	data := body
	if op != "create" {
		var m map[string]any
		_ = json.Unmarshal([]byte(body), &m)
		m["order_id"] = orderID
		b, _ := json.Marshal(m)
		data = string(b)
	}
	m := nats.NewMsg(messaging.CommandSubject("acme", op))
	m.Header.Set(messaging.HeaderKey, key)
	m.Data = []byte(data)
	if _, err := p.js.PublishMsg(context.Background(), m); err != nil {
		p.t.Fatalf("publish %s: %v", op, err)
	}
	select {
	case r := <-p.results:
		if got := r.Header.Get(messaging.HeaderKey); got != key || r.Subject != messaging.ResultSubject("acme", op) {
			p.t.Fatalf("result for %s %s arrived for %s on %s", op, key, got, r.Subject)
		}
		status, _ := strconv.Atoi(r.Header.Get(messaging.HeaderStatus))
		p.checkStatus(door, op, key, status, "", r.Data)
		return status, r.Data
	case d := <-p.dead:
		p.t.Fatalf("%s %s was dead-lettered: %s", op, key, d.Header.Get(messaging.HeaderReason))
	case <-time.After(30 * time.Second):
		p.t.Fatalf("no result for %s %s", op, key)
	}
	return 0, nil
}

func (p *propertyRun) checkStatus(door, op, key string, status int, retryAfter string, body []byte) {
	p.seen(fmt.Sprintf("%s %s %d", door, op, status))
	if status >= 500 && !(door == "http" && status == http.StatusServiceUnavailable && retryAfter != "") {
		p.t.Fatalf("%s %s %s answered %d: %s", door, op, key, status, body)
	}
}

// checkConverged asserts the sequence's end state.
func (p *propertyRun) checkConverged() {
	var open int64
	if err := p.w.db.Raw("SELECT count(*) FROM idempotency_records WHERE idempotency_key LIKE ? AND state NOT IN ('SUCCEEDED', 'FAILED_FINAL')",
		p.prefix+"%").Scan(&open).Error; err != nil {
		p.t.Fatal(err)
	}
	if open != 0 {
		p.t.Fatalf("%d records of the sequence are not definitive", open)
	}
	for _, id := range p.orders {
		var o struct {
			Status           string
			Charges, Refunds int64
		}
		if err := p.w.db.Raw(`SELECT o.status,
			(SELECT count(*) FROM payments WHERE order_id = o.id AND kind = 'charge' AND status = 'succeeded') AS charges,
			(SELECT count(*) FROM payments WHERE order_id = o.id AND kind = 'refund' AND status = 'succeeded') AS refunds
			FROM orders o WHERE o.id = ?`, id).Scan(&o).Error; err != nil {
			p.t.Fatal(err)
		}
		if o.Charges > 1 || o.Refunds > 1 || o.Refunds > o.Charges {
			p.t.Fatalf("order %s (%s): %d charges, %d refunds", id, o.Status, o.Charges, o.Refunds)
		}
		paid := o.Status == "PAID" || o.Status == "SHIPPED" || o.Status == "DELIVERED"
		if paid && (o.Charges != 1 || o.Refunds != 0) {
			p.t.Fatalf("order %s is %s with %d charges and %d refunds, want 1 and 0", id, o.Status, o.Charges, o.Refunds)
		}
		if o.Status == "CANCELLED" && o.Refunds != o.Charges {
			p.t.Fatalf("order %s is CANCELLED with %d charges and %d refunds", id, o.Charges, o.Refunds)
		}
	}
	// The channel moved no money the orders do not account for.
	var charges, refunds int64
	// (Every sequence's orders, and only theirs: this world's channel has
	// seen nothing else, while the package's database holds other tests'.)
	mine := "SELECT count(*) FROM payments p JOIN orders o ON o.id = p.order_id WHERE o.customer_id LIKE 'prop%-cus' AND p.status = 'succeeded' AND p.kind = ?"
	p.w.db.Raw(mine, "charge").Scan(&charges)
	p.w.db.Raw(mine, "refund").Scan(&refunds)
	stats, err := (&apptest.Client{BaseURL: p.w.channel, HTTP: &http.Client{Timeout: 10 * time.Second}}).Send(http.MethodGet, "/admin/stats", "", nil, nil)
	if err != nil {
		p.t.Fatal(err)
	}
	var got struct{ Charges, Refunds int64 }
	if err := json.Unmarshal(stats.Body, &got); err != nil {
		p.t.Fatal(err)
	}
	if got.Charges != charges || got.Refunds != refunds {
		p.t.Fatalf("channel made %d charges and %d refunds; the orders account for %d and %d", got.Charges, got.Refunds, charges, refunds)
	}
}
