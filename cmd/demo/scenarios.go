package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/orderservice/orderservice/client"
)

// scenarios is the demo, in the order of the seed's lessons.
func scenarios() []scenario {
	return []scenario{
		{
			title: "A lost response: the retry with R1 gets O9 back, never a new O10",
			lesson: "Creation needs the key most: until the answer arrives the client has no order id, " +
				"so only R1 can lead its retry back to O9. The record for R1 and the order commit in one transaction.",
			run: lostResponse,
		},
		{
			title: "Two real purchases under two keys are two orders",
			lesson: "A key names an intent, an order id names an entity. Deduplicating on customer + product " +
				"would swallow a real second purchase; two intents (two keys) must stay two orders.",
			run: twoPurchases,
		},
		{
			title: "The same key with other parameters is refused with 422",
			lesson: "The scope (tenant, operation, key) finds the record and a fingerprint of the normalised business fields " +
				"guards it: other items under R1 are a caller's bug, refused without executing, while trace data and spelling do not count.",
			run: keyReused,
		},
		{
			title: "A duplicate while the first is still in flight: 409 + Retry-After, then the replay",
			lesson: "The first request won the unique insert and holds a lease on the intent (PROCESSING). A duplicate must not run it " +
				"again nor pretend it succeeded: it is told to come back, and then gets the first request's real result.",
			run: inFlight,
		},
		{
			title: "One order, three intents: create:R1, pay:R2, cancel:R3",
			lesson: "A business key lives long and carries many idempotent operations; each has its own key and its own record, " +
				"and the order's history names the key behind every change.",
			run: oneOrderThreeIntents,
		},
		{
			title: "Two layers: the same key replays, a new key meets the state machine",
			lesson: "Idempotency stops identical requests; the order state machine stops different but illegal ones. " +
				"A fresh key on a PAID order is a new intent, so only the state machine can refuse it, and a CANCELLED order cannot ship.",
			run: twoLayers,
		},
		{
			title: "A lost channel response: the retry sends the same key downstream, the channel absorbs it",
			lesson: "Local deduplication cannot stop a second charge if every retry sends the channel a new key. " +
				"The service derives one stable key per intent and stores it, so the channel recognises the retry as a duplicate.",
			run: lostChannelResponse,
		},
		{
			title: "An unfinished intent is taken over after its lease, with the real outcome asked of the channel",
			lesson: "A PROCESSING record must never wait forever: its owner holds a lease, and once it runs out a retry or the sweeper " +
				"takes the intent over with a higher fencing token and first asks the channel what really happened under the stable key.",
			run: takeover,
		},
		{
			title: "Retention follows the longest replay window; one day is unsafe",
			lesson: "A deleted record lets a late replay run again. Clients retry for 24 hours, a broker redelivers for 7 days, " +
				"operators replay by hand for 30: records are kept longer than all of them, and money records are archived.",
			run: retention,
		},
		{
			title: "What the metrics saw during this demo",
			lesson: "Watch replays, parameter conflicts, stuck PROCESSING, record growth and downstream duplicate rejections: " +
				"each scenario above moved one of them, and an operator would see it the same way.",
			run: metricsMoved,
		},
	}
}

// 1. Response lost, retry with R1.
func lostResponse(ctx context.Context, d *demo) error {
	r1, body := d.key("R1"), d.purchase()
	d.send("POST /v1/orders  Idempotency-Key: %s  (customer %s, 2 × SKU-1 at 12.50 EUR)", r1, body.CustomerID)
	first, err := d.post(ctx, "/v1/orders", r1, body, 0)
	if err != nil {
		return err
	}
	d.got("%s", first)
	d.note("… say this answer is lost on its way back: the client never learns the id and can only send the same request again, same key")
	d.send("POST /v1/orders  Idempotency-Key: %s  (the same body)", r1)
	retry, err := d.post(ctx, "/v1/orders", r1, body, 0)
	if err != nil {
		return err
	}
	d.got("%s", retry)
	d.note("The Go client retries like this by itself, invisibly; only Result.Replayed tells:")
	d.send("client.CreateOrder(…, WithKey(%q))", r1)
	res, err := d.api.CreateOrder(ctx, body, client.WithKey(r1))
	if err != nil {
		return err
	}
	d.got("order %s, Replayed=%v, Attempts=%d", short(res.Value.ID), res.Replayed, res.Attempts)
	count, err := d.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}

	o9 := first.field("id")
	d.check(first.status == http.StatusCreated && o9 != "", "the first request created O9 = %s (201)", short(o9))
	d.check(retry.status == http.StatusCreated && retry.field("id") == o9, "the retry with R1 got O9 again, not a new O10")
	d.check(first.header.Get("Idempotent-Replayed") == "" && retry.header.Get("Idempotent-Replayed") == "true",
		"only the retry carries Idempotent-Replayed: true")
	d.check(bytes.Equal(first.body, retry.body) && first.header.Get("Location") == retry.header.Get("Location"),
		"the replay is the first answer byte for byte, with the same Location")
	d.check(res.Value.ID == o9 && res.Replayed, "the client's call under R1 got O9 as well, marked Replayed")
	d.check(count == 1, "the customer has exactly 1 order (found %d)", count)
	return nil
}

// 2. Two keys, two orders.
func twoPurchases(ctx context.Context, d *demo) error {
	body := d.purchase()
	var ids []string
	for _, name := range []string{"R1", "R2"} {
		d.send("client.CreateOrder(customer %s, 2 × SKU-1, WithKey(%q))", body.CustomerID, d.key(name))
		res, err := d.api.CreateOrder(ctx, body, client.WithKey(d.key(name)))
		if err != nil {
			return err
		}
		d.got("%d order %s, Replayed=%v", res.Status, short(res.Value.ID), res.Replayed)
		ids = append(ids, res.Value.ID)
	}
	d.send("GET /v1/orders?customer_id=%s", body.CustomerID)
	count, err := d.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}
	d.got("%d orders", count)

	d.check(ids[0] != ids[1], "same customer, same items, two keys: two different orders (%s, %s)", short(ids[0]), short(ids[1]))
	d.check(count == 2, "the customer has exactly 2 orders (found %d)", count)
	return nil
}

// 3. Same key, other parameters.
func keyReused(ctx context.Context, d *demo) error {
	r1, body := d.key("R1"), d.purchase()
	d.send("client.CreateOrder(2 × SKU-1, WithKey(%q))", r1)
	first, err := d.api.CreateOrder(ctx, body, client.WithKey(r1))
	if err != nil {
		return err
	}
	d.got("%d order %s", first.Status, short(first.Value.ID))
	before, err := d.record(ctx, r1, "order.create")
	if err != nil {
		return err
	}
	d.got("record %s: fingerprint %s…", before.State, prefix(before.Fingerprint, 16))

	other := body
	other.Items = []client.ItemRequest{{SKU: "SKU-1", Quantity: 3, UnitPrice: 1250}}
	d.send("POST /v1/orders  Idempotency-Key: %s  (the same key, but 3 × SKU-1)", r1)
	_, conflict := d.once.CreateOrder(ctx, other, client.WithKey(r1))
	pe := problemOf(conflict)
	d.got("%d %s: %s", pe.Status, pe.Code, pe.Detail)
	after, err := d.record(ctx, r1, "order.create")
	if err != nil {
		return err
	}
	d.got("record %s: fingerprint %s…, order %s", after.State, prefix(after.Fingerprint, 16), short(after.ResourceID))

	same := body
	same.Currency, same.ClientTraceID = "eur", "trace-"+d.runID
	d.send("POST /v1/orders  Idempotency-Key: %s  (the first body, with currency \"eur\" and a client_trace_id)", r1)
	again, err := d.api.CreateOrder(ctx, same, client.WithKey(r1))
	if err != nil {
		return err
	}
	d.got("%d order %s, Replayed=%v", again.Status, short(again.Value.ID), again.Replayed)
	count, err := d.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}

	d.check(client.IsKeyReused(conflict) && pe.Status == http.StatusUnprocessableEntity,
		"other items under R1: 422 idempotency_key_reused, not a replay of the first order")
	d.check(after.Fingerprint == before.Fingerprint && after.ResourceID == first.Value.ID && after.State == before.State,
		"the original record is untouched (same fingerprint, same order, %s)", after.State)
	d.check(again.Replayed && again.Value.ID == first.Value.ID,
		"the same business fields, spelled differently and with trace data, replay the first order")
	d.check(count == 1, "nothing executed for the conflict: the customer has 1 order (found %d)", count)
	return nil
}

// 4. A concurrent duplicate.
func inFlight(ctx context.Context, d *demo) error {
	o, err := d.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	r2, slow := d.key("R2"), client.PayRequest{PaymentMethod: "pm_slow"}
	type outcome struct {
		res  client.Result[client.Order]
		err  error
		took time.Duration
	}
	firstDone := make(chan outcome, 1)
	start := time.Now()
	d.send("client.Pay(%s, pm_slow, WithKey(%q))  in the background: the channel takes its time", short(o.ID), r2)
	go func() {
		res, err := d.api.Pay(ctx, o.ID, slow, client.WithKey(r2))
		firstDone <- outcome{res, err, time.Since(start)}
	}()
	// Send the duplicate only once the first holds the record, so that the
	// story is the one told whatever the timing.
	rec, err := d.waitForRecord(ctx, r2, "order.pay", "PROCESSING", 10*time.Second)
	if err != nil {
		return err
	}
	d.showRecord(rec)
	d.send("POST /v1/orders/%s/pay  Idempotency-Key: %s  (a duplicate, say a double click, while the first runs)", short(o.ID), r2)
	dup, err := d.post(ctx, "/v1/orders/"+o.ID+"/pay", r2, slow, 0)
	if err != nil {
		return err
	}
	d.got("%s", dup)
	d.note("Retry-After is what is left of the first request's lease: an upper bound. A client honours it; the demo")
	d.note("instead waits for the first request to finish, then lets the client retry under the same key.")
	first := <-firstDone
	if first.err != nil {
		return fmt.Errorf("the first pay: %w", first.err)
	}
	d.got("the first request, after %.1fs: %d order %s %s (Attempts=%d)", first.took.Seconds(), first.res.Status,
		short(first.res.Value.ID), first.res.Value.Status, first.res.Attempts)
	d.send("client.Pay(%s, pm_slow, WithKey(%q))  the client's retry", short(o.ID), r2)
	again, err := d.api.Pay(ctx, o.ID, slow, client.WithKey(r2))
	if err != nil {
		return err
	}
	d.got("%d order %s %s, Replayed=%v, Attempts=%d", again.Status, short(again.Value.ID), again.Value.Status, again.Replayed, again.Attempts)
	charges, err := d.chargesFor(ctx, o.ID)
	if err != nil {
		return err
	}

	retryAfter, _ := strconv.Atoi(dup.header.Get("Retry-After"))
	d.check(dup.status == http.StatusConflict && dup.field("code") == client.CodeInProgress,
		"the duplicate got 409 request_in_progress while the first was running")
	d.check(retryAfter >= 1, "with Retry-After: %d (whole seconds, at least 1)", retryAfter)
	d.check(first.res.Value.Status == client.StatusPaid && !first.res.Replayed, "the first request executed: PAID")
	d.check(again.Replayed && again.Value.Status == client.StatusPaid, "the retry got the first result replayed, not a second execution")
	d.check(len(charges) == 1, "the channel holds exactly 1 charge for the order (found %d)", len(charges))
	return nil
}

// 5. create:R1, pay:R2, cancel:R3 on one order.
func oneOrderThreeIntents(ctx context.Context, d *demo) error {
	o, err := d.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	d.send("client.Pay(%s, pm_ok, WithKey(%q))", short(o.ID), d.key("R2"))
	paid, err := d.api.Pay(ctx, o.ID, client.PayRequest{PaymentMethod: "pm_ok"}, client.WithKey(d.key("R2")))
	if err != nil {
		return err
	}
	d.got("%d order %s %s", paid.Status, short(paid.Value.ID), paid.Value.Status)
	d.send("client.Cancel(%s, WithKey(%q))  a paid order is refunded first", short(o.ID), d.key("R3"))
	cancelled, err := d.api.Cancel(ctx, o.ID, client.CancelRequest{Reason: "changed my mind"}, client.WithKey(d.key("R3")))
	if err != nil {
		return err
	}
	d.got("%d order %s %s (payment %s)", cancelled.Status, short(cancelled.Value.ID), cancelled.Value.Status, paymentStatus(cancelled.Value))

	d.send("GET /v1/orders/%s/events", short(o.ID))
	events, err := d.api.Events(ctx, o.ID)
	if err != nil {
		return err
	}
	rows := [][]string{{"#", "event", "operation", "idempotency key", "from → to"}}
	opOfKey := map[string]string{}
	for i, e := range events.Value {
		from := string(e.FromStatus)
		if from == "" {
			from = "·"
		}
		rows = append(rows, []string{strconv.Itoa(i + 1), e.Event, e.Operation, e.IdempotencyKey, from + " → " + string(e.ToStatus)})
		opOfKey[e.IdempotencyKey] = e.Operation
	}
	d.table(rows)

	d.check(opOfKey[d.key("R1")] == "order.create" && opOfKey[d.key("R2")] == "order.pay" &&
		opOfKey[d.key("R3")] == "order.cancel" && len(opOfKey) == 3,
		"one order id, three keys: every change names the intent that made it (create:R1, pay:R2, cancel:R3)")
	d.check(cancelled.Value.Status == client.StatusCancelled && paymentStatus(cancelled.Value) == "refunded",
		"the order ends CANCELLED, its charge refunded")
	for _, name := range []string{"R1", "R2", "R3"} {
		res, err := d.api.IdempotencyRecords(ctx, d.key(name))
		if err != nil {
			return err
		}
		ok := len(res.Value) == 1 && res.Value[0].ResourceID == o.ID && res.Value[0].State == "SUCCEEDED"
		var op string
		if len(res.Value) > 0 {
			op = res.Value[0].Operation
		}
		d.check(ok, "%s has one record of its own: %s, SUCCEEDED, on this order", name, op)
	}
	return nil
}

func paymentStatus(o client.Order) string {
	if o.Payment == nil {
		return "none"
	}
	return o.Payment.Status
}
