package order_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// The order lifecycle through its use cases: one order, many intents, each
// with its own key. Idempotency stops identical requests; the state machine
// stops different but illegal ones.

var shipDetails = order.ShipRequest{Carrier: "DHL", TrackingNumber: "JD014600003812345678"}

// clientEvents are the events a client sends, each through its use case.
var clientEvents = []struct {
	event order.Event
	op    string
	send  func(ctx context.Context, s *order.Service, c order.Caller, id string) (idempotency.Result, error)
}{
	{order.EventPay, order.OpPay, func(ctx context.Context, s *order.Service, c order.Caller, id string) (idempotency.Result, error) {
		return s.Pay(ctx, c, id, payWith(payment.MethodOK))
	}},
	{order.EventShip, order.OpShip, func(ctx context.Context, s *order.Service, c order.Caller, id string) (idempotency.Result, error) {
		return s.Ship(ctx, c, id, shipDetails)
	}},
	{order.EventDeliver, order.OpDeliver, func(ctx context.Context, s *order.Service, c order.Caller, id string) (idempotency.Result, error) {
		return s.Deliver(ctx, c, id, order.DeliverRequest{})
	}},
	{order.EventCancel, order.OpCancel, func(ctx context.Context, s *order.Service, c order.Caller, id string) (idempotency.Result, error) {
		return s.Cancel(ctx, c, id, order.CancelRequest{})
	}},
}

// orderSnapshot is what a forbidden intent or a replay must leave as it was.
type orderSnapshot struct {
	Status   string
	Version  int64
	Events   int64
	Payments int64
}

func snap(t *testing.T, s *order.Service, id string) orderSnapshot {
	t.Helper()
	var o orderSnapshot
	if err := s.DB.Raw("SELECT status, version FROM orders WHERE id = ?", id).Row().Scan(&o.Status, &o.Version); err != nil {
		t.Fatalf("read order %s: %v", id, err)
	}
	o.Events = count(t, s.DB, "SELECT count(*) FROM order_events WHERE order_id = ?", id)
	o.Payments = count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id)
	return o
}

// orderIn returns a new acme order in status. PAID is reached through a
// real pm_ok charge, so that a cancel has a succeeded charge to refund; the
// statuses that follow payment are set in the store.
func orderIn(t *testing.T, s *order.Service, status order.Status) string {
	t.Helper()
	id := placeOrder(t, s)
	switch status {
	case order.StatusCreated:
	case order.StatusPaid:
		res, err := s.Pay(t.Context(), acme(newKey("pay")), id, payWith(payment.MethodOK))
		wantOutcome(t, "pay with pm_ok", res, err, idempotency.OutcomeDone)
	default:
		setStatus(t, s, id, status)
	}
	if got := snap(t, s, id).Status; got != string(status) {
		t.Fatalf("set-up: order is %s, want %s", got, status)
	}
	return id
}

// wantInvalidTransition checks a final invalid_transition that names the
// current status and the forbidden event.
func wantInvalidTransition(t *testing.T, res idempotency.Result, err error, current order.Status, ev order.Event) {
	t.Helper()
	p := wantFailed(t, string(ev), res, err, order.CodeInvalidTransition)
	if fmt.Sprint(p.Extensions["current_status"]) != string(current) || fmt.Sprint(p.Extensions["event"]) != string(ev) {
		t.Errorf("current_status=%v event=%v, want %s %s", p.Extensions["current_status"], p.Extensions["event"], current, ev)
	}
}

func TestEveryStatusAndClientEventThroughTheUseCases(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)

	// The allowed moves, written out: everything else must be forbidden.
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

	pairs, forbidden := 0, 0
	for _, from := range order.Statuses {
		for _, ce := range clientEvents {
			pairs++
			mv, ok := allowed[from][ce.event]
			if !ok {
				forbidden++
				t.Run(fmt.Sprintf("%s on a %s order is forbidden and changes nothing", ce.event, from), func(t *testing.T) {
					id := orderIn(t, s, from)
					before := snap(t, s, id)
					key := newKey(string(ce.event))
					res, err := ce.send(t.Context(), s, acme(key), id)
					wantInvalidTransition(t, res, err, from, ce.event)
					if after := snap(t, s, id); after != before {
						t.Errorf("a forbidden %s changed the order: before %+v, after %+v", ce.event, before, after)
					}
					if st := recordOf(t, s, ce.op, key).State; st != idempotency.FailedFinal {
						t.Errorf("record state %s, want FAILED_FINAL", st)
					}
				})
				continue
			}
			t.Run(fmt.Sprintf("%s on a %s order moves it to %s", ce.event, from, mv.to), func(t *testing.T) {
				id := orderIn(t, s, from)
				before := snap(t, s, id)
				res, err := ce.send(t.Context(), s, acme(newKey(string(ce.event))), id)
				wantOutcome(t, string(ce.event), res, err, idempotency.OutcomeDone)
				if got := shownBy(t, res).Status; got != string(mv.to) {
					t.Errorf("the result shows status %s, want %s", got, mv.to)
				}
				after := snap(t, s, id)
				if after.Status != string(mv.to) || after.Version != before.Version+mv.steps || after.Events != before.Events+mv.steps {
					t.Errorf("order after %s: %+v, want status %s and %d more versions and events than %+v",
						ce.event, after, mv.to, mv.steps, before)
				}
				switch {
				case ce.event == order.EventPay:
					if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND kind = 'charge' AND status = 'succeeded'", id); n != 1 {
						t.Errorf("%d succeeded charges, want 1", n)
					}
				case ce.event == order.EventCancel && from == order.StatusPaid:
					if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND kind = 'refund' AND status = 'succeeded'", id); n != 1 {
						t.Errorf("%d succeeded refunds, want 1", n)
					}
					if p := shownBy(t, res).Payment; p == nil || p.Status != "refunded" {
						t.Errorf("payment summary %+v, want status refunded", p)
					}
				default:
					if after.Payments != before.Payments {
						t.Errorf("%s touched payments: %d -> %d", ce.event, before.Payments, after.Payments)
					}
				}
			})
		}
	}
	if pairs != 32 || forbidden != 25 {
		t.Errorf("covered %d pairs with %d forbidden, want 32 with 25 forbidden", pairs, forbidden)
	}
}

func TestConcurrentTransitionsOnOneOrderLetExactlyOneWin(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	const senders = 50
	cases := []struct {
		name  string
		op    string
		event order.Event
		from  order.Status
		to    order.Status
		send  func(ctx context.Context, c order.Caller, id string) (idempotency.Result, error)
	}{
		{"50 ships with their own keys on one PAID order: one ships, 49 are forbidden", order.OpShip, order.EventShip, order.StatusPaid, order.StatusShipped,
			func(ctx context.Context, c order.Caller, id string) (idempotency.Result, error) {
				return s.Ship(ctx, c, id, shipDetails)
			}},
		{"50 cancels with their own keys on one CREATED order: one cancels, 49 are forbidden", order.OpCancel, order.EventCancel, order.StatusCreated, order.StatusCancelled,
			func(ctx context.Context, c order.Caller, id string) (idempotency.Result, error) {
				return s.Cancel(ctx, c, id, order.CancelRequest{})
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := placeOrder(t, s)
			setStatus(t, s, id, tc.from)
			before := snap(t, s, id)
			prefix := newKey("race-" + string(tc.event))

			results, errs := make([]idempotency.Result, senders), make([]error, senders)
			atOnce(senders, func(i int) {
				results[i], errs[i] = tc.send(t.Context(), acme(fmt.Sprintf("%s-%02d", prefix, i)), id)
			})

			wins, losses := 0, 0
			for i, res := range results {
				switch {
				case errs[i] == nil && res.Outcome == idempotency.OutcomeDone:
					wins++
				default:
					losses++
					// A loser waited on the row lock and then saw the winner's status.
					wantInvalidTransition(t, res, errs[i], tc.to, tc.event)
				}
			}
			if wins != 1 || losses != senders-1 {
				t.Errorf("%d won and %d were forbidden, want 1 and %d", wins, losses, senders-1)
			}
			if n := count(t, s.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND event = ?", id, tc.event); n != 1 {
				t.Errorf("%d %s events, want 1", n, tc.event)
			}
			after := snap(t, s, id)
			want := orderSnapshot{Status: string(tc.to), Version: before.Version + 1, Events: before.Events + 1, Payments: before.Payments}
			if after != want {
				t.Errorf("order after the race: %+v, want %+v", after, want)
			}
			for state, want := range map[idempotency.State]int64{idempotency.Succeeded: 1, idempotency.FailedFinal: senders - 1} {
				if n := count(t, s.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'acme' AND operation = ? AND idempotency_key LIKE ? AND state = ?",
					tc.op, prefix+"-%", state); n != want {
					t.Errorf("%d %s records, want %d", n, state, want)
				}
			}
		})
	}
}

// Identical ships (one key) at once: a transition reads the order it
// changes, so it records last. The duplicates queue on the order's row lock,
// find it SHIPPED (a final error they would record), lose the record's insert to
// the winner's committed key, roll back and replay the winner's result.
func TestConcurrentIdenticalTransitionsReplayTheWinner(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	const senders = 20
	id := placeOrder(t, s)
	setStatus(t, s, id, order.StatusPaid)
	key := newKey("same-ship")
	results, errs := make([]idempotency.Result, senders), make([]error, senders)
	atOnce(senders, func(i int) { results[i], errs[i] = s.Ship(t.Context(), acme(key), id, shipDetails) })

	replayed := 0
	for i, res := range results {
		wantOutcome(t, fmt.Sprintf("ship %d", i), res, errs[i], idempotency.OutcomeDone)
		if string(res.Body) != string(results[0].Body) {
			t.Errorf("two different results:\n%s\n%s", results[0].Body, res.Body)
		}
		if res.Replayed {
			replayed++
		}
	}
	if replayed != senders-1 {
		t.Errorf("%d results replayed, want %d", replayed, senders-1)
	}
	if n := count(t, s.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND event = ?", id, order.EventShip); n != 1 {
		t.Errorf("%d ship events, want 1", n)
	}
	if n := count(t, s.DB, "SELECT count(*) FROM idempotency_records WHERE operation = 'order.ship' AND idempotency_key = ? AND state = 'SUCCEEDED'", key); n != 1 {
		t.Errorf("%d SUCCEEDED ship records, want 1", n)
	}
}

func TestKeyReusedOnAnotherOrder(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	ctx := t.Context()
	a, b := placeOrder(t, s), placeOrder(t, s)
	key := newKey("cancel")

	first, err := s.Cancel(ctx, acme(key), a, order.CancelRequest{})
	wantOutcome(t, "cancel A", first, err, idempotency.OutcomeDone)
	bBefore := snap(t, s, b)

	t.Run("the same key on order B is idempotency_key_reused and B is unchanged", func(t *testing.T) {
		_, err := s.Cancel(ctx, acme(key), b, order.CancelRequest{})
		wantError(t, "A's cancel key on B", err, problem.KeyReused)
		if after := snap(t, s, b); after != bBefore || after.Status != string(order.StatusCreated) {
			t.Errorf("order B changed: before %+v, after %+v", bBefore, after)
		}
	})
	t.Run("the key still replays A's first result", func(t *testing.T) {
		again, err := s.Cancel(ctx, acme(key), a, order.CancelRequest{})
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
		if n := count(t, s.DB, "SELECT count(*) FROM idempotency_records WHERE tenant_id = 'acme' AND idempotency_key = ? AND resource_id = ? AND state = 'SUCCEEDED'", key, a); n != 1 {
			t.Errorf("%d SUCCEEDED records of A under the key, want 1", n)
		}
		if n := count(t, s.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = ?", key); n != 1 {
			t.Errorf("%d records under the key, want 1", n)
		}
	})
}

func TestRefusedTransitionReplaysAfterTheOrderMovedOn(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	ctx := t.Context()
	id := placeOrder(t, s)
	shipKey := newKey("ship")

	first, err := s.Ship(ctx, acme(shipKey), id, shipDetails)
	wantInvalidTransition(t, first, err, order.StatusCreated, order.EventShip)
	wantExecuted(t, first)

	res, err := s.Pay(ctx, acme(newKey("pay")), id, payWith(payment.MethodOK))
	wantOutcome(t, "pay", res, err, idempotency.OutcomeDone)
	paid := snap(t, s, id)

	t.Run("the same ship key on the now PAID order replays the first final error", func(t *testing.T) {
		again, err := s.Ship(ctx, acme(shipKey), id, shipDetails)
		if err != nil {
			t.Fatal(err)
		}
		wantReplay(t, first, again)
		if after := snap(t, s, id); after != paid {
			t.Errorf("the replay changed the order: before %+v, after %+v", paid, after)
		}
		if n := count(t, s.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND event = 'ship'", id); n != 0 {
			t.Errorf("%d ship events, want 0", n)
		}
	})
	t.Run("a new ship key is a new intent and ships the PAID order", func(t *testing.T) {
		res, err := s.Ship(ctx, acme(newKey("ship")), id, shipDetails)
		wantOutcome(t, "ship with a new key", res, err, idempotency.OutcomeDone)
		if got := shownBy(t, res).Status; got != string(order.StatusShipped) {
			t.Errorf("status %s, want SHIPPED", got)
		}
	})
}

func TestUnknownAndForeignOrdersAreNotFound(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	ctx := t.Context()

	// Each acme order is in the status its event allows, so an
	// order_not_found can only come from the tenant check.
	for _, ce := range clientEvents {
		from := map[order.Event]order.Status{
			order.EventPay: order.StatusCreated, order.EventShip: order.StatusPaid,
			order.EventDeliver: order.StatusShipped, order.EventCancel: order.StatusCreated,
		}[ce.event]
		t.Run(string(ce.event)+" of an unknown or another tenant's order is order_not_found, replayed, and looks the same", func(t *testing.T) {
			foreign := orderIn(t, s, from)
			before := snap(t, s, foreign)
			shapes := map[string]string{}
			key := newKey(string(ce.event))
			for name, id := range map[string]string{"unknown": uuid.NewString(), "foreign": foreign, "malformed": "not-a-uuid"} {
				// An id of another shape names no order either: the same
				// final error, recorded and replayed.
				k := key + "-" + name
				first, err := ce.send(ctx, s, globex(k), id)
				wantFailed(t, name+" order", first, err, order.CodeNotFound)
				wantExecuted(t, first)
				again, err := ce.send(ctx, s, globex(k), id)
				if err != nil {
					t.Fatal(err)
				}
				wantReplay(t, first, again)
				shapes[name] = strings.ReplaceAll(failureText(first.Failure), id, "{id}")
			}
			if shapes["unknown"] != shapes["foreign"] {
				t.Errorf("failures differ beyond the id:\nunknown %s\nforeign %s", shapes["unknown"], shapes["foreign"])
			}
			if after := snap(t, s, foreign); after != before {
				t.Errorf("another tenant's intent changed the order: before %+v, after %+v", before, after)
			}
			// The same key is another intent for the order's own tenant.
			res, err := ce.send(ctx, s, acme(key+"-foreign"), foreign)
			wantOutcome(t, "acme with globex's key", res, err, idempotency.OutcomeDone)
		})
	}
}

func TestOrderEventsListEveryIntentOldestFirst(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	ctx := t.Context()
	r1, r2, r3, r4, r5 := newKey("R1"), newKey("R2"), newKey("R3"), newKey("R4"), newKey("R5")

	created, err := s.Create(ctx, acme(r1), purchase("cus_history"))
	wantOutcome(t, "create", created, err, idempotency.OutcomeCreated)
	id := created.Resource
	for _, step := range []struct {
		name  string
		run   func() (idempotency.Result, error)
		fails problem.Code // "" for a step that is done
	}{
		{"pay", func() (idempotency.Result, error) { return s.Pay(ctx, acme(r2), id, payWith(payment.MethodOK)) }, ""},
		{"ship", func() (idempotency.Result, error) { return s.Ship(ctx, acme(r4), id, shipDetails) }, ""},
		// A SHIPPED order cannot be cancelled.
		{"cancel", func() (idempotency.Result, error) { return s.Cancel(ctx, acme(r3), id, order.CancelRequest{}) }, order.CodeInvalidTransition},
		{"deliver", func() (idempotency.Result, error) { return s.Deliver(ctx, acme(r5), id, order.DeliverRequest{}) }, ""},
		// A replay adds nothing.
		{"ship again", func() (idempotency.Result, error) { return s.Ship(ctx, acme(r4), id, shipDetails) }, ""},
	} {
		res, err := step.run()
		if step.fails != "" {
			wantFailed(t, step.name, res, err, step.fails)
			continue
		}
		wantOutcome(t, step.name, res, err, idempotency.OutcomeDone)
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
		page, err := s.History(ctx, "acme", id, order.PageRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Events) != len(want) {
			t.Fatalf("%d events, want %d: %+v", len(page.Events), len(want), page.Events)
		}
		var last order.HistoryEntry
		for i, e := range page.Events {
			w := want[i]
			if string(e.Event) != w.event || e.Operation != w.operation || e.IdempotencyKey != w.key ||
				string(e.FromStatus) != w.from || string(e.ToStatus) != w.to || e.OrderID.String() != id {
				t.Errorf("event %d = %+v, want %+v", i, e, w)
			}
			if i > 0 && (e.ID <= last.ID || e.CreatedAt.Before(last.CreatedAt)) {
				t.Errorf("event %d (id %d at %v) is not after event %d (id %d at %v)", i, e.ID, e.CreatedAt, i-1, last.ID, last.CreatedAt)
			}
			last = e
		}
	})
	t.Run("another tenant is told order_not_found", func(t *testing.T) {
		_, err := s.History(ctx, "globex", id, order.PageRequest{})
		wantError(t, "globex reads acme's history", err, order.CodeNotFound)
	})
}

func TestTransitionsReplayTheirFirstResult(t *testing.T) {
	s := useCases(t, newAcquirer().channel(), 5*time.Second)
	cases := []struct {
		name   string
		op     string
		from   order.Status
		to     order.Status
		send   func(ctx context.Context, c order.Caller, id string) (idempotency.Result, error)
		events int64 // history rows the first intent wrote
	}{
		{"ship replays its first result exactly", order.OpShip, order.StatusPaid, order.StatusShipped,
			func(ctx context.Context, c order.Caller, id string) (idempotency.Result, error) {
				return s.Ship(ctx, c, id, shipDetails)
			}, 1},
		{"deliver replays its first result exactly", order.OpDeliver, order.StatusShipped, order.StatusDelivered,
			func(ctx context.Context, c order.Caller, id string) (idempotency.Result, error) {
				return s.Deliver(ctx, c, id, order.DeliverRequest{})
			}, 1},
		{"cancel of a CREATED order replays its first result exactly", order.OpCancel, order.StatusCreated, order.StatusCancelled,
			func(ctx context.Context, c order.Caller, id string) (idempotency.Result, error) {
				return s.Cancel(ctx, c, id, order.CancelRequest{Reason: "customer changed their mind"})
			}, 1},
		{"cancel of a PAID order replays its first result and refunds once", order.OpCancel, order.StatusPaid, order.StatusCancelled,
			func(ctx context.Context, c order.Caller, id string) (idempotency.Result, error) {
				return s.Cancel(ctx, c, id, order.CancelRequest{})
			}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := orderIn(t, s, tc.from)
			key := newKey(tc.op)
			first, err := tc.send(t.Context(), acme(key), id)
			wantOutcome(t, "first "+tc.op, first, err, idempotency.OutcomeDone)
			if got := shownBy(t, first).Status; got != string(tc.to) {
				t.Fatalf("first %s shows %s, want %s", tc.op, got, tc.to)
			}
			wantExecuted(t, first)
			done := snap(t, s, id)

			for range 2 {
				again, err := tc.send(t.Context(), acme(key), id)
				if err != nil {
					t.Fatal(err)
				}
				wantReplay(t, first, again)
			}
			if after := snap(t, s, id); after != done {
				t.Errorf("replays changed the order: before %+v, after %+v", done, after)
			}
			if n := count(t, s.DB, "SELECT count(*) FROM order_events WHERE order_id = ? AND idempotency_key = ?", id, key); n != tc.events {
				t.Errorf("%d events under the key, want %d", n, tc.events)
			}
			if tc.from == order.StatusPaid && tc.op == order.OpCancel {
				if n := count(t, s.DB, "SELECT count(*) FROM payments WHERE order_id = ? AND kind = 'refund'", id); n != 1 {
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
