package order_test

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
)

// The order lifecycle through the HTTP API: one order, many intents, each
// with its own key. Idempotency stops identical requests; the state machine
// stops different but illegal ones.

var (
	shipDetails = map[string]any{"carrier": "DHL", "tracking_number": "JD014600003812345678"}
	payWithPmOK = map[string]any{"payment_method": "pm_ok"}
)

// lifecycleEvents are the events a client sends, each with its request.
var lifecycleEvents = []struct {
	event order.Event
	path  string // after /v1/orders/{id}/
	body  any
}{
	{order.EventPay, "pay", payWithPmOK},
	{order.EventShip, "ship", shipDetails},
	{order.EventDeliver, "deliver", nil},
	{order.EventCancel, "cancel", nil},
}

// orderSnapshot is what a refused request or a replay must leave as it was.
type orderSnapshot struct {
	Status   string
	Version  int64
	Events   int64
	Payments int64
}

// rig is one booted service and the acme tenant's client. Its methods are
// the helpers of the lifecycle tests (methods, so they cannot collide with
// the helpers of other test files of this package).
type rig struct {
	m *app.Main
	c *apptest.Client
}

func startRig(t *testing.T) rig {
	m, c := start(t, nil)
	return rig{m, c}
}

// key returns a fresh Idempotency-Key: a new intent.
func (rig) key(name string) string { return name + "-" + uuid.NewString() }

// post sends POST /v1/orders/{id}/{action} as the acme tenant.
func (r rig) post(t *testing.T, id, action, key string, body any) apptest.Response {
	t.Helper()
	return r.postAs(t, r.c, id, action, key, body)
}

// postAs sends POST /v1/orders/{id}/{action} as c's tenant.
func (rig) postAs(t *testing.T, c *apptest.Client, id, action, key string, body any) apptest.Response {
	t.Helper()
	return c.Do(t, http.MethodPost, "/v1/orders/"+id+"/"+action, key, body)
}

func (r rig) snap(t *testing.T, id string) orderSnapshot {
	t.Helper()
	var s orderSnapshot
	if err := r.m.DB.Raw("SELECT status, version FROM orders WHERE id = ?", id).Row().Scan(&s.Status, &s.Version); err != nil {
		t.Fatalf("read order %s: %v", id, err)
	}
	s.Events = apptest.Count(t, r.m.DB, "SELECT count(*) FROM order_events WHERE order_id = ?", id)
	s.Payments = apptest.Count(t, r.m.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id)
	return s
}

// orderIn returns a new acme order in status. PAID is reached through a
// real pm_ok charge, so that a cancel has a settled charge to refund; the
// statuses that follow payment are set in the store.
func (r rig) orderIn(t *testing.T, status order.Status) string {
	t.Helper()
	id := createOrder(t, r.c, r.key("create"))
	switch status {
	case order.StatusCreated:
	case order.StatusPaid:
		if res := r.post(t, id, "pay", r.key("pay"), payWithPmOK); res.Status != http.StatusOK {
			t.Fatalf("pay with pm_ok: status %d: %s", res.Status, res.Body)
		}
	default:
		setStatus(t, r.m, id, string(status))
	}
	if got := r.snap(t, id).Status; got != string(status) {
		t.Fatalf("set-up: order is %s, want %s", got, status)
	}
	return id
}

// invalidTransition checks a 409 that names the current status and the
// refused event.
func (r rig) invalidTransition(t *testing.T, res apptest.Response, current order.Status, ev order.Event) {
	t.Helper()
	doc := apptest.WantProblem(t, res, http.StatusConflict, "invalid_transition")
	if doc["current_status"] != string(current) || doc["event"] != string(ev) {
		t.Errorf("current_status=%v event=%v, want %s %s", doc["current_status"], doc["event"], current, ev)
	}
}

func TestEveryStatusAndClientEventThroughTheAPI(t *testing.T) {
	svc := startRig(t)

	// The allowed moves, written out: everything else must be refused.
	// steps is how many history rows the move writes (pay and the refund
	// of a paid order pass through a pending status).
	type move struct {
		to    order.Status
		steps int64
	}
	allowed := map[order.Status]map[order.Event]move{
		order.StatusCreated:       {order.EventPay: {order.StatusPaid, 2}, order.EventCancel: {order.StatusCancelled, 1}},
		order.StatusPaymentFailed: {order.EventPay: {order.StatusPaid, 2}, order.EventCancel: {order.StatusCancelled, 1}},
		order.StatusPaid:          {order.EventShip: {order.StatusShipped, 1}, order.EventCancel: {order.StatusCancelled, 2}},
		order.StatusShipped:       {order.EventDeliver: {order.StatusDelivered, 1}},
	}

	pairs, refused := 0, 0
	for _, from := range order.Statuses {
		for _, ce := range lifecycleEvents {
			pairs++
			mv, ok := allowed[from][ce.event]
			if !ok {
				refused++
				t.Run(fmt.Sprintf("%s on a %s order is 409 and changes nothing", ce.event, from), func(t *testing.T) {
					id := svc.orderIn(t, from)
					before := svc.snap(t, id)
					key := svc.key(ce.path)
					r := svc.post(t, id, ce.path, key, ce.body)
					svc.invalidTransition(t, r, from, ce.event)
					if after := svc.snap(t, id); after != before {
						t.Errorf("a refused %s changed the order: before %+v, after %+v", ce.event, before, after)
					}
					if s := apptest.RecordState(t, svc.m.DB, idempotency.Scope{TenantID: "acme", Operation: "order." + ce.path, Key: key}); s != idempotency.FailedFinal {
						t.Errorf("record state %s, want FAILED_FINAL", s)
					}
				})
				continue
			}
			t.Run(fmt.Sprintf("%s on a %s order moves it to %s", ce.event, from, mv.to), func(t *testing.T) {
				id := svc.orderIn(t, from)
				before := svc.snap(t, id)
				r := svc.post(t, id, ce.path, svc.key(ce.path), ce.body)
				if r.Status != http.StatusOK {
					t.Fatalf("status %d, want 200: %s", r.Status, r.Body)
				}
				if got := r.JSON(t)["status"]; got != string(mv.to) {
					t.Errorf("response status %v, want %s", got, mv.to)
				}
				after := svc.snap(t, id)
				if after.Status != string(mv.to) || after.Version != before.Version+mv.steps || after.Events != before.Events+mv.steps {
					t.Errorf("order after %s: %+v, want status %s and %d more versions and events than %+v",
						ce.event, after, mv.to, mv.steps, before)
				}
				switch {
				case ce.event == order.EventPay:
					if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND kind = 'charge' AND status = 'succeeded'", id); n != 1 {
						t.Errorf("%d succeeded charges, want 1", n)
					}
				case ce.event == order.EventCancel && from == order.StatusPaid:
					if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND kind = 'refund' AND status = 'succeeded'", id); n != 1 {
						t.Errorf("%d succeeded refunds, want 1", n)
					}
					if p, _ := r.JSON(t)["payment"].(map[string]any); p["status"] != "refunded" {
						t.Errorf("payment summary %v, want status refunded", p)
					}
				default:
					if after.Payments != before.Payments {
						t.Errorf("%s touched payments: %d -> %d", ce.event, before.Payments, after.Payments)
					}
				}
			})
		}
	}
	if pairs != 32 || refused != 25 {
		t.Errorf("covered %d pairs with %d refused, want 32 with 25 refused", pairs, refused)
	}
}

func TestConcurrentTransitionsOnOneOrderLetExactlyOneWin(t *testing.T) {
	svc := startRig(t)
	const senders = 50
	cases := []struct {
		name   string
		action string
		event  order.Event
		from   order.Status
		to     order.Status
		body   any
	}{
		{"50 ships with their own keys on one PAID order: one ships, 49 get 409", "ship", order.EventShip, order.StatusPaid, order.StatusShipped, shipDetails},
		{"50 cancels with their own keys on one CREATED order: one cancels, 49 get 409", "cancel", order.EventCancel, order.StatusCreated, order.StatusCancelled, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := createOrder(t, svc.c, svc.key("create"))
			setStatus(t, svc.m, id, string(tc.from))
			before := svc.snap(t, id)
			prefix := svc.key("race-" + tc.action)

			responses := atOnce(t, senders, func(i int) (apptest.Response, error) {
				return svc.c.Send(http.MethodPost, "/v1/orders/"+id+"/"+tc.action, fmt.Sprintf("%s-%02d", prefix, i), tc.body, nil)
			})

			wins, losses := 0, 0
			for i, r := range responses {
				switch {
				case r.Status == http.StatusOK:
					wins++
				case r.Status == http.StatusConflict:
					losses++
					// A loser waited on the row lock and then saw the winner's status.
					svc.invalidTransition(t, r, tc.to, tc.event)
				default:
					t.Errorf("request %d: status %d, want 200 or 409: %s", i, r.Status, r.Body)
				}
			}
			if wins != 1 || losses != senders-1 {
				t.Errorf("%d won and %d got 409, want 1 and %d", wins, losses, senders-1)
			}
			if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND event = ?", id, tc.event); n != 1 {
				t.Errorf("%d %s events, want 1", n, tc.event)
			}
			after := svc.snap(t, id)
			want := orderSnapshot{Status: string(tc.to), Version: before.Version + 1, Events: before.Events + 1, Payments: before.Payments}
			if after != want {
				t.Errorf("order after the race: %+v, want %+v", after, want)
			}
			for state, want := range map[string]int64{string(idempotency.Succeeded): 1, string(idempotency.FailedFinal): senders - 1} {
				if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'acme' AND operation = ? AND idempotency_key LIKE ? AND state = ?",
					"order."+tc.action, prefix+"-%", state); n != want {
					t.Errorf("%d %s records, want %d", n, state, want)
				}
			}
		})
	}
}

// Identical ships (one key) at once: a transition reads the order it
// changes, so it records last. The duplicates queue on the order's row lock,
// find it SHIPPED (a refusal they would record), lose the record's insert to
// the winner's committed key, roll back and replay the winner's 200.
func TestConcurrentIdenticalTransitionsReplayTheWinner(t *testing.T) {
	svc := startRig(t)
	const senders = 20
	id := createOrder(t, svc.c, svc.key("create"))
	setStatus(t, svc.m, id, string(order.StatusPaid))
	key := svc.key("same-ship")
	responses := atOnce(t, senders, func(int) (apptest.Response, error) {
		return svc.c.Send(http.MethodPost, "/v1/orders/"+id+"/ship", key, shipDetails, nil)
	})
	var first []byte
	replayed := 0
	for i, r := range responses {
		if r.Status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.Status, r.Body)
		}
		if first == nil {
			first = r.Body
		} else if !bytes.Equal(r.Body, first) {
			t.Errorf("two different 200 bodies:\n%s\n%s", first, r.Body)
		}
		if r.Header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if replayed != senders-1 {
		t.Errorf("%d answers replayed, want %d", replayed, senders-1)
	}
	if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND event = ?", id, order.EventShip); n != 1 {
		t.Errorf("%d ship events, want 1", n)
	}
	if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM idempotency_records WHERE operation = 'order.ship' AND idempotency_key = ? AND state = 'SUCCEEDED'", key); n != 1 {
		t.Errorf("%d SUCCEEDED ship records, want 1", n)
	}
}

func TestKeyReusedOnAnotherOrder(t *testing.T) {
	svc := startRig(t)
	a := createOrder(t, svc.c, svc.key("create"))
	b := createOrder(t, svc.c, svc.key("create"))
	key := svc.key("cancel")

	first := svc.post(t, a, "cancel", key, nil)
	if first.Status != http.StatusOK {
		t.Fatalf("cancel A: status %d: %s", first.Status, first.Body)
	}
	bBefore := svc.snap(t, b)

	t.Run("the same key on order B is 422 idempotency_key_reused and B is unchanged", func(t *testing.T) {
		r := svc.post(t, b, "cancel", key, nil)
		apptest.WantProblem(t, r, http.StatusUnprocessableEntity, "idempotency_key_reused")
		if after := svc.snap(t, b); after != bBefore || after.Status != string(order.StatusCreated) {
			t.Errorf("order B changed: before %+v, after %+v", bBefore, after)
		}
	})
	t.Run("the key still replays A's first result", func(t *testing.T) {
		apptest.WantReplay(t, first, svc.post(t, a, "cancel", key, nil))
		if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'acme' AND idempotency_key = ? AND resource_id = ? AND state = 'SUCCEEDED'", key, a); n != 1 {
			t.Errorf("%d SUCCEEDED records of A under the key, want 1", n)
		}
		if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = ?", key); n != 1 {
			t.Errorf("%d records under the key, want 1", n)
		}
	})
}

func TestRefusedTransitionReplaysAfterTheOrderMovedOn(t *testing.T) {
	svc := startRig(t)
	id := createOrder(t, svc.c, svc.key("create"))
	shipKey := svc.key("ship")

	first := svc.post(t, id, "ship", shipKey, shipDetails)
	svc.invalidTransition(t, first, order.StatusCreated, order.EventShip)
	apptest.WantExecuted(t, first)

	if r := svc.post(t, id, "pay", svc.key("pay"), payWithPmOK); r.Status != http.StatusOK {
		t.Fatalf("pay: status %d: %s", r.Status, r.Body)
	}
	paid := svc.snap(t, id)

	t.Run("the same ship key on the now PAID order replays the first 409 byte for byte", func(t *testing.T) {
		apptest.WantReplay(t, first, svc.post(t, id, "ship", shipKey, shipDetails))
		if after := svc.snap(t, id); after != paid {
			t.Errorf("the replay changed the order: before %+v, after %+v", paid, after)
		}
		if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND event = 'ship'", id); n != 0 {
			t.Errorf("%d ship events, want 0", n)
		}
	})
	t.Run("a new ship key is a new intent and ships the PAID order", func(t *testing.T) {
		r := svc.post(t, id, "ship", svc.key("ship"), shipDetails)
		if r.Status != http.StatusOK || r.JSON(t)["status"] != string(order.StatusShipped) {
			t.Fatalf("status %d, want 200 SHIPPED: %s", r.Status, r.Body)
		}
	})
}

func TestUnknownAndForeignOrdersAreNotFound(t *testing.T) {
	svc := startRig(t)
	globex := apptest.NewClient(svc.m, apptest.KeyGlobex)

	// Each acme order is in the status its action allows, so a 404 can only
	// come from the tenant check.
	for _, ce := range lifecycleEvents {
		from := map[order.Event]order.Status{
			order.EventPay: order.StatusCreated, order.EventShip: order.StatusPaid,
			order.EventDeliver: order.StatusShipped, order.EventCancel: order.StatusCreated,
		}[ce.event]
		t.Run(ce.path+" of an unknown or another tenant's order is 404, replayed, and looks the same", func(t *testing.T) {
			foreign := svc.orderIn(t, from)
			before := svc.snap(t, foreign)
			unknown := uuid.NewString()
			shapes := map[string]string{}
			key := svc.key(ce.path)
			for name, id := range map[string]string{"unknown": unknown, "foreign": foreign} {
				k := key + "-" + name
				first := svc.postAs(t, globex, id, ce.path, k, ce.body)
				apptest.WantProblem(t, first, http.StatusNotFound, "order_not_found")
				apptest.WantExecuted(t, first)
				apptest.WantReplay(t, first, svc.postAs(t, globex, id, ce.path, k, ce.body))
				shapes[name] = strings.ReplaceAll(string(first.Body), id, "{id}")
			}
			// An id of another shape names no order either: the same
			// definitive 404, recorded and replayed.
			malformed := svc.postAs(t, globex, "not-a-uuid", ce.path, key+"-malformed", ce.body)
			apptest.WantProblem(t, malformed, http.StatusNotFound, "order_not_found")
			apptest.WantExecuted(t, malformed)
			apptest.WantReplay(t, malformed, svc.postAs(t, globex, "not-a-uuid", ce.path, key+"-malformed", ce.body))
			if shapes["unknown"] != shapes["foreign"] {
				t.Errorf("404 bodies differ beyond the id:\nunknown %s\nforeign %s", shapes["unknown"], shapes["foreign"])
			}
			if after := svc.snap(t, foreign); after != before {
				t.Errorf("another tenant's request changed the order: before %+v, after %+v", before, after)
			}
			// The same key is another intent for the order's own tenant.
			if r := svc.post(t, foreign, ce.path, key+"-foreign", ce.body); r.Status != http.StatusOK {
				t.Errorf("acme with globex's key: status %d, want 200: %s", r.Status, r.Body)
			}
		})
	}
}

func TestOrderEventsListEveryIntentOldestFirst(t *testing.T) {
	svc := startRig(t)
	run := uuid.NewString()
	r1, r2, r3, r4, r5 := "R1-"+run, "R2-"+run, "R3-"+run, "R4-"+run, "R5-"+run

	id := createOrder(t, svc.c, r1)
	for _, step := range []struct {
		action, key string
		body        any
		status      int
	}{
		{"pay", r2, payWithPmOK, http.StatusOK},
		{"ship", r4, shipDetails, http.StatusOK},
		{"cancel", r3, nil, http.StatusConflict}, // a SHIPPED order cannot be cancelled
		{"deliver", r5, nil, http.StatusOK},
		{"ship", r4, shipDetails, http.StatusOK}, // a replay adds nothing
	} {
		if r := svc.post(t, id, step.action, step.key, step.body); r.Status != step.status {
			t.Fatalf("%s %s: status %d, want %d: %s", step.action, step.key, r.Status, step.status, r.Body)
		}
	}

	want := []struct {
		event, operation, key, from, to string
	}{
		{"create", "order.create", r1, "", "CREATED"},
		{"pay", "order.pay", r2, "CREATED", "PAYMENT_PENDING"},
		{"payment_succeeded", "order.pay", r2, "PAYMENT_PENDING", "PAID"},
		{"ship", "order.ship", r4, "PAID", "SHIPPED"},
		{"deliver", "order.deliver", r5, "SHIPPED", "DELIVERED"},
	}

	t.Run("each transition, oldest first, with the key that caused it", func(t *testing.T) {
		r := svc.c.Do(t, http.MethodGet, "/v1/orders/"+id+"/events", "", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("status %d: %s", r.Status, r.Body)
		}
		events, _ := r.JSON(t)["events"].([]any)
		if len(events) != len(want) {
			t.Fatalf("%d events, want %d: %s", len(events), len(want), r.Body)
		}
		var lastID float64
		var lastAt time.Time
		for i, raw := range events {
			e := raw.(map[string]any)
			w := want[i]
			if e["event"] != w.event || e["operation"] != w.operation || e["idempotency_key"] != w.key ||
				e["from_status"] != w.from || e["to_status"] != w.to || e["order_id"] != id {
				t.Errorf("event %d = %v, want %+v", i, e, w)
			}
			at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(e["created_at"]))
			if err != nil {
				t.Errorf("event %d created_at %v: %v", i, e["created_at"], err)
			}
			id, _ := e["id"].(float64)
			if i > 0 && (id <= lastID || at.Before(lastAt)) {
				t.Errorf("event %d (id %v at %v) is not after event %d (id %v at %v)", i, id, at, i-1, lastID, lastAt)
			}
			lastID, lastAt = id, at
		}
	})
	t.Run("another tenant gets 404 order_not_found", func(t *testing.T) {
		r := apptest.NewClient(svc.m, apptest.KeyGlobex).Do(t, http.MethodGet, "/v1/orders/"+id+"/events", "", nil)
		apptest.WantProblem(t, r, http.StatusNotFound, "order_not_found")
	})
}

func TestTransitionsReplayTheirFirstResult(t *testing.T) {
	svc := startRig(t)
	cases := []struct {
		name   string
		action string
		from   order.Status
		to     order.Status
		body   any
		events int64 // history rows the first request wrote
	}{
		{"ship replays its first 200 exactly", "ship", order.StatusPaid, order.StatusShipped, shipDetails, 1},
		{"deliver replays its first 200 exactly", "deliver", order.StatusShipped, order.StatusDelivered, nil, 1},
		{"cancel of a CREATED order replays its first 200 exactly", "cancel", order.StatusCreated, order.StatusCancelled, map[string]any{"reason": "customer changed their mind"}, 1},
		{"cancel of a PAID order replays its first 200 and refunds once", "cancel", order.StatusPaid, order.StatusCancelled, nil, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := svc.orderIn(t, tc.from)
			key := svc.key(tc.action)
			first := svc.post(t, id, tc.action, key, tc.body)
			if first.Status != http.StatusOK || first.JSON(t)["status"] != string(tc.to) {
				t.Fatalf("first %s: status %d, want 200 %s: %s", tc.action, first.Status, tc.to, first.Body)
			}
			apptest.WantExecuted(t, first)
			done := svc.snap(t, id)

			for range 2 {
				apptest.WantReplay(t, first, svc.post(t, id, tc.action, key, tc.body))
			}
			if after := svc.snap(t, id); after != done {
				t.Errorf("replays changed the order: before %+v, after %+v", done, after)
			}
			if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND idempotency_key = ?", id, key); n != tc.events {
				t.Errorf("%d events under the key, want %d", n, tc.events)
			}
			if tc.from == order.StatusPaid && tc.action == "cancel" {
				if n := apptest.Count(t, svc.m.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND kind = 'refund'", id); n != 1 {
					t.Errorf("%d refunds, want 1", n)
				}
			}
		})
	}
}

// The diagram in docs/state-machine.md is the lifecycle table, rendered.
func TestStateMachineDocMatchesTable(t *testing.T) {
	const path = "../../docs/state-machine.md"
	const begin, end, fence = "<!-- fsm:begin -->", "<!-- fsm:end -->", "```mermaid\n"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	fresh := order.Diagram()
	paste := fmt.Sprintf("paste this between the markers of %s:\n%s\n%s%s```\n%s", path, begin, fence, fresh, end)

	_, rest, ok1 := strings.Cut(string(doc), begin)
	block, _, ok2 := strings.Cut(rest, end)
	block = strings.TrimSpace(block)
	if !ok1 || !ok2 || !strings.HasPrefix(block, fence) || !strings.HasSuffix(block, "```") {
		t.Fatalf("%s has no ```mermaid fence between %s and %s; %s", path, begin, end, paste)
	}
	if got := strings.TrimSuffix(strings.TrimPrefix(block, fence), "```"); got != fresh {
		t.Errorf("the diagram in %s differs from order.Diagram(); %s", path, paste)
	}
}
