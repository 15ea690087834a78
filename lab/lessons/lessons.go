package lessons

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/internal/idempotency"
)

// Lesson is one lesson of the seed, played against the live service: the
// requests it sends, what it shows and the claims it checks, written once
// for every front end (the terminal narration of lab/cmd/demo, the web lab of
// lab/cmd/lab), which see it only through the events a Session emits.
type Lesson struct {
	// Number is the lesson's place in the seed's order, from 1.
	Number int
	// Title says what the lesson shows, in one line.
	Title string
	// Why says why, in one paragraph faithful to the seed.
	Why string
	// Pitfall names the mistake a pitfall lesson shows failing (one of
	// naive.Names: its switch in lab/naiveorders); empty for the
	// seed's lessons.
	Pitfall string
	// run sends the requests, narrates them and checks the outcome with
	// s.check; an error means it could not go on (e.g. a transport failure).
	run func(ctx context.Context, s *Session) error
}

// All returns the lessons in the order of the seed, then the pitfalls
// (lessons_pitfalls.go), then capacity's (lessons_fairshare.go), numbered
// on from the seed's.
func All() []Lesson {
	list := []Lesson{
		{
			Title: "A lost response: the retry with R1 gets O9 back, never a new O10",
			Why: "Creation needs the key most. Until the answer arrives the client has no order id: when the response " +
				"that carried O9 is lost, it cannot ask about O9, it can only send the same request again under R1. " +
				"So the server binds R1 to O9 before anyone can see either, with a unique record that commits in the same " +
				"transaction as the order, and the retry finds that record and gets the first result back, O9, never a new O10.",
			run: lostResponse,
		},
		{
			Title: "Two real purchases under two keys are two orders",
			Why: "Clicking \"place order\" twice may be one intent retried by the network, or a customer who really wants two. " +
				"The idempotency key names the intent (this action); the order id names the entity (what the action made). " +
				"Deduplicating on customer and product would swallow a legitimate second purchase, so two intents, two keys, " +
				"stay two orders.",
			run: twoPurchases,
		},
		{
			Title: "The same key with other parameters is refused with 422",
			Why: "A key is scoped by caller, operation and key (tenant, operation, request id, one unique index), so tenants " +
				"cannot collide and a create never deduplicates a cancel. The record also keeps a fingerprint of the normalised " +
				"fields that have side effects: the same key with other items is a caller's bug, refused as a conflict without " +
				"executing and without handing back the first answer, while trace ids and spelling are left out of the fingerprint.",
			run: keyReused,
		},
		{
			Title: "A duplicate while the first is still in flight: 409 + Retry-After, or wait for the first result",
			Why: "The first request won the unique insert and with it the right to execute: its record goes ABSENT → PROCESSING " +
				"under a lease. A duplicate that finds PROCESSING must neither run the intent again nor answer success it has not " +
				"seen: it is told the request is in progress and when to come back, and once the record is SUCCEEDED it gets the " +
				"first request's real, stored result.",
			run: inFlight,
		},
		{
			Title: "One order, three intents: create:R1, pay:R2, cancel:R3",
			Why: "A business key lives long (foreign keys, queries, the state machine) and carries many idempotent operations: " +
				"order O9 is created under R1, paid under R2 and cancelled under R3. Each operation has its own key and its own " +
				"record, which only has to cover its replay window, and the order's history names the key behind every change.",
			run: oneOrderThreeIntents,
		},
		{
			Title: "Two layers: the same key replays, a new key meets the state machine",
			Why: "Idempotency stops identical requests; the order's state machine stops requests that differ but make no sense. " +
				"A new key on a PAID order is a new intent, so the idempotency layer lets it through and only the state machine " +
				"can refuse to charge twice; in the same way a CANCELLED order cannot ship. Both layers are needed.",
			run: twoLayers,
		},
		{
			Title: "A lost channel response: the retry sends the same key downstream, the channel absorbs it",
			Why: "When the payment channel honours idempotency keys too, the service must pass it a stable key for the intent " +
				"(derived from R2 once and stored), not a new key per attempt: otherwise local deduplication cannot stop a second " +
				"charge downstream. With the same key on the retry, the channel recognises the duplicate and answers with the " +
				"charge it already made. A retry that comes after Retry-After may find the sweeper there first: it asks the " +
				"channel what it holds under the same key, finds the charge, and the retry gets that result replayed.",
			run: lostChannelResponse,
		},
		{
			Title: "An unfinished intent is taken over after its lease, with the real outcome asked of the channel",
			Why: "What if a record is stuck in PROCESSING? Its owner holds a lease, not a lock for ever: once the lease runs out, a " +
				"retry or the timeout sweep takes the intent over under a higher fencing token (so the old owner can no longer " +
				"write), and before doing anything again it asks the channel for the business outcome under the stable key, " +
				"then records what really happened.",
			run: takeover,
		},
		{
			Title: "A create command redelivered after a crash between commit and ack: one order, the first result replayed",
			Why: "The broker is a replay source too. JetStream delivers a command until it is acknowledged, and the service " +
				"acknowledges only after the outcome is committed: if it dies in between, the same command under the same R1 " +
				"arrives again, on any instance, for as long as the stream keeps it. It is the lost response again, with the " +
				"broker as the client: the record that bound R1 to O9 in the order's own transaction finds the first result, " +
				"and the redelivery gets O9 back on the results subject, the first result byte for byte, never a new O10.",
			run: redelivered,
		},
		{
			Title: "An HTTP request and a message with one key are one intent, whichever door came first",
			Why: "A key's scope is the caller, the operation and the key (tenant + operation + request id, one unique index), " +
				"not the door the request came in by. A checkout that sends R1 over HTTP and again through the broker, or the " +
				"other way round, expresses one intent: both doors call the same use case through the same records, so the " +
				"second gets the first one's real, stored result, not a second order.",
			run: twoDoors,
		},
		{
			Title: "A dead-lettered command replayed by an operator: the records absorb what had run, one charge",
			Why: "Manual compensation is the longest replay source: the seed reckons with 30 days. A command that keeps failing " +
				"transiently is not dropped: after COMMAND_MAX_DELIVER deliveries it is parked, unchanged, in a dead-letter " +
				"stream, and an operator sends it again once the cause is fixed, maybe days later. Whatever had already run by " +
				"then, the replay finds the intent's record and replays or resumes it under the same stable channel key, so " +
				"money moves once; this is why the records must outlive the DLQ's window too.",
			run: deadLetterReplayed,
		},
		{
			Title: "The outbox survives a relay crash: each event once, in order, Nats-Msg-Id = its event id",
			Why: "The business write and what it tells others belong in one transaction, or a crash between them leaves a gap, " +
				"as between a record and its order. Every transition writes its event into an outbox in the order's " +
				"transaction; a relay publishes it with Nats-Msg-Id = the event id and then marks it. A relay that dies in " +
				"between publishes again: at least once, never lost, and JetStream's duplicate window drops the copy. That " +
				"window is short and a subscriber may still hear a copy, so a consumer that must apply each event once keeps " +
				"its own inbox of event ids: the consumer's idempotency record.",
			run: outboxRelayCrash,
		},
		{
			Title: "Retention follows the longest replay window; one day is unsafe",
			Why: "Once a record is deleted, an old request that arrives again runs again, with its side effects. If clients " +
				"retry for up to 24 hours, the broker keeps messages for 7 days and manual compensation may replay for 30, " +
				"keeping records for one day is unsafe: retention is derived from the longest replay source, and money records " +
				"are archived rather than simply deleted.",
			run: retention,
		},
		{
			Title: "A payment that finishes later: its webhook comes three times and moves the order once; a forged one is refused",
			Why: "Many payments are decided later (3-D Secure, bank transfers): the channel answers \"taken on\" and tells the " +
				"outcome by webhook, at least once, in no order, for days. The webhook is another replay source, and the rules " +
				"are the same: the event id names one intent of the sender, the service records it in an inbox in the " +
				"transaction of its effect, a unique key (not a cache of minutes) decides that a second delivery does nothing, " +
				"and the record outlives the sender's longest retry. The event is only a hint: the service asks the channel for " +
				"the payment before it moves the order, and a signature it cannot verify is refused.",
			run: finishesLater,
		},
		{
			Title: "What the metrics saw during these lessons",
			Why: "Watch idempotency hits (replays), same-key parameter conflicts, PROCESSING timeouts, record growth and the " +
				"duplicates the downstream channel rejected: each lesson above moved one of them, and an operator sees them the " +
				"same way. Behind them, the database's unique index is the last line of defence against races, never " +
				"\"check, then insert\".",
			run: metricsMoved,
		},
	}
	list = append(list, pitfalls()...)
	list = append(list, capacity()...)
	for i := range list {
		list[i].Number = i + 1
	}
	return list
}

// ByNumber returns lesson n, or false when there is none.
func ByNumber(n int) (Lesson, bool) {
	all := All()
	if n < 1 || n > len(all) {
		return Lesson{}, false
	}
	return all[n-1], true
}

// 1. Response lost, retry with R1.
func lostResponse(ctx context.Context, s *Session) error {
	r1, body := s.key("R1"), s.purchase()
	s.send("POST /v1/orders  Idempotency-Key: %s  (customer %s, 2 × SKU-1, unit_price 1250: minor units, 12.50 EUR)", r1, body.CustomerID)
	first, err := s.post(ctx, "/v1/orders", r1, body, 0)
	if err != nil {
		return err
	}
	s.got("%s", first)
	s.note("… say this answer is lost on its way back: the client never learns the id and can only send the same request again, same key")
	s.send("POST /v1/orders  Idempotency-Key: %s  (the same body)", r1)
	retry, err := s.post(ctx, "/v1/orders", r1, body, 0)
	if err != nil {
		return err
	}
	s.got("%s", retry)
	s.note("The Go client retries like this by itself, invisibly; only Result.Replayed tells:")
	s.send("client.CreateOrder(…, WithKey(%q))", r1)
	res, err := s.api.CreateOrder(ctx, body, client.WithKey(r1))
	if err != nil {
		return err
	}
	s.got("order %s, Replayed=%v, Attempts=%d", short(res.Value.ID), res.Replayed, res.Attempts)
	count, err := s.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}

	o9 := first.field("id")
	s.check(first.status == http.StatusCreated && o9 != "", "the first request created O9 = %s (201)", short(o9))
	s.check(retry.status == http.StatusCreated && retry.field("id") == o9, "the retry with R1 got O9 again, not a new O10")
	s.check(first.header.Get("Idempotent-Replayed") == "" && retry.header.Get("Idempotent-Replayed") == "true",
		"only the retry carries Idempotent-Replayed: true")
	s.check(bytes.Equal(first.body, retry.body) && first.header.Get("Location") == retry.header.Get("Location"),
		"the replay is the first answer byte for byte, with the same Location")
	s.check(res.Value.ID == o9 && res.Replayed, "the client's call under R1 got O9 as well, marked Replayed")
	s.check(count == 1, "the customer has exactly 1 order (found %d)", count)
	return nil
}

// 2. Two keys, two orders.
func twoPurchases(ctx context.Context, s *Session) error {
	body := s.purchase()
	var ids []string
	for _, name := range []string{"R1", "R2"} {
		s.send("client.CreateOrder(customer %s, 2 × SKU-1, WithKey(%q))", body.CustomerID, s.key(name))
		res, err := s.api.CreateOrder(ctx, body, client.WithKey(s.key(name)))
		if err != nil {
			return err
		}
		s.got("%d order %s, Replayed=%v", res.Status, short(res.Value.ID), res.Replayed)
		ids = append(ids, res.Value.ID)
	}
	s.send("GET /v1/orders?customer_id=%s", body.CustomerID)
	count, err := s.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}
	s.got("%d orders", count)

	s.check(ids[0] != ids[1], "same customer, same items, two keys: two different orders (%s, %s)", short(ids[0]), short(ids[1]))
	s.check(count == 2, "the customer has exactly 2 orders (found %d)", count)
	return nil
}

// 3. Same key, other parameters.
func keyReused(ctx context.Context, s *Session) error {
	r1, body := s.key("R1"), s.purchase()
	s.send("client.CreateOrder(2 × SKU-1, WithKey(%q))", r1)
	first, err := s.api.CreateOrder(ctx, body, client.WithKey(r1))
	if err != nil {
		return err
	}
	s.got("%d order %s", first.Status, short(first.Value.ID))
	before, err := s.record(ctx, r1, "order.create")
	if err != nil {
		return err
	}
	s.got("record %s: fingerprint %s…", before.State, prefix(before.Fingerprint, 16))

	other := body
	other.Items = []client.ItemRequest{{SKU: "SKU-1", Quantity: 3, UnitPrice: 1250}}
	s.send("POST /v1/orders  Idempotency-Key: %s  (the same key, but 3 × SKU-1)", r1)
	_, conflict := s.once.CreateOrder(ctx, other, client.WithKey(r1))
	pe := problemOf(conflict)
	s.got("%d %s: %s", pe.Status, pe.Code, pe.Detail)
	after, err := s.record(ctx, r1, "order.create")
	if err != nil {
		return err
	}
	s.got("record %s: fingerprint %s…, order %s", after.State, prefix(after.Fingerprint, 16), short(after.ResourceID))

	same := body
	same.Currency, same.ClientTraceID = "eur", "trace-"+s.runID
	s.send("POST /v1/orders  Idempotency-Key: %s  (the first body, with currency \"eur\" and a client_trace_id)", r1)
	again, err := s.api.CreateOrder(ctx, same, client.WithKey(r1))
	if err != nil {
		return err
	}
	s.got("%d order %s, Replayed=%v", again.Status, short(again.Value.ID), again.Replayed)
	count, err := s.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}

	s.check(client.IsKeyReused(conflict) && pe.Status == http.StatusUnprocessableEntity,
		"other items under R1: 422 idempotency_key_reused, not a replay of the first order")
	s.check(after.Fingerprint == before.Fingerprint && after.ResourceID == first.Value.ID && after.State == before.State,
		"the original record is untouched (same fingerprint, same order, %s)", after.State)
	s.check(again.Replayed && again.Value.ID == first.Value.ID,
		"the same business fields, spelled differently and with trace data, replay the first order")
	s.check(count == 1, "nothing executed for the conflict: the customer has 1 order (found %d)", count)
	return nil
}

// 4. A concurrent duplicate.
func inFlight(ctx context.Context, s *Session) error {
	o, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	r2, slow := s.key("R2"), client.PayRequest{PaymentMethod: "pm_slow"}
	type outcome struct {
		res  client.Result[client.Order]
		err  error
		took time.Duration
	}
	firstDone := make(chan outcome, 1)
	start := time.Now()
	s.send("client.Pay(%s, pm_slow, WithKey(%q))  in the background: the channel takes its time", short(o.ID), r2)
	go func() {
		res, err := s.api.Pay(ctx, o.ID, slow, client.WithKey(r2))
		firstDone <- outcome{res, err, time.Since(start)}
	}()
	// Send the duplicate once the first holds the record (or, on a machine
	// too busy to see it hold it, has finished: the story below says so).
	rec, err := s.waitForRecord(ctx, r2, "order.pay", 10*time.Second, "PROCESSING", "SUCCEEDED")
	if err != nil {
		return err
	}
	s.showRecord(rec)
	s.send("POST /v1/orders/%s/pay  Idempotency-Key: %s  (a duplicate, say a double click, while the first runs)", short(o.ID), r2)
	dup, err := s.post(ctx, "/v1/orders/"+o.ID+"/pay", r2, slow, 0)
	if err != nil {
		return err
	}
	s.got("%s", dup)
	// The first may have finished before a duplicate came (a busy machine,
	// a learner pausing between steps): the duplicate then gets its stored
	// result at once. The lesson says so, and checks that story instead.
	refused := dup.status == http.StatusConflict
	if refused {
		s.note("Retry-After says when the first request's outcome is likely stored: its channel call's deadline plus a")
		s.note("second, never more than its lease. Or the duplicate asks to wait for it, holding no connection meanwhile:")
	} else {
		s.note("The first had finished before this duplicate arrived: it got the stored result at once, with nothing in")
		s.note("flight to refuse. A duplicate that comes in time gets 409; or it asks to wait, holding no connection meanwhile:")
	}
	before, err := s.waitsEnded(ctx)
	if err != nil {
		return err
	}
	s.send("POST /v1/orders/%s/pay  Idempotency-Key: %s  Prefer: wait=10  (the same duplicate, willing to wait)", short(o.ID), r2)
	waited, err := s.postWith(ctx, "/v1/orders/"+o.ID+"/pay", r2, slow, 0, http.Header{"Prefer": {"wait=10"}})
	waitedAt := time.Now()
	if err != nil {
		return err
	}
	s.got("%s", waited)
	applied := waited.header.Get("Preference-Applied") != ""
	if !applied {
		s.note("The first had finished before this one arrived: its result, replayed at once, with no wait to apply.")
	}
	first := <-firstDone
	if first.err != nil {
		return fmt.Errorf("the first pay: %w", first.err)
	}
	s.got("the first request, after %.1fs: %d order %s %s (Attempts=%d)", first.took.Seconds(), first.res.Status,
		short(first.res.Value.ID), first.res.Value.Status, first.res.Attempts)
	lag := waitedAt.Sub(start.Add(first.took))
	s.note("the waiting duplicate was answered %dms after the first", lag.Milliseconds())
	charges, err := s.chargesFor(ctx, o.ID)
	if err != nil {
		return err
	}
	after, err := s.waitsEnded(ctx)
	if err != nil {
		return err
	}
	s.note("/metrics orderservice_idempotency_waits_total: notified %d → %d, not_in_flight %d → %d, looked %d → %d",
		before[idempotency.Notified], after[idempotency.Notified], before[idempotency.NotInFlight], after[idempotency.NotInFlight],
		before[idempotency.Looked], after[idempotency.Looked])

	replayed := func(a rawAnswer) bool {
		return a.status == http.StatusOK && a.header.Get("Idempotent-Replayed") == "true" && a.field("status") == string(client.StatusPaid)
	}
	if refused {
		retryAfter, _ := strconv.Atoi(dup.header.Get("Retry-After"))
		s.check(dup.field("code") == client.CodeInProgress, "the impatient duplicate got 409 request_in_progress while the first was running")
		s.check(retryAfter >= 1, "with Retry-After: %d (whole seconds, at least 1)", retryAfter)
	} else {
		s.check(replayed(dup), "the duplicate came after the first had finished: its result, replayed, not a second execution")
	}
	s.check(first.res.Value.Status == client.StatusPaid && !first.res.Replayed, "the first request executed: PAID")
	s.check(replayed(waited), "the waiting duplicate got the first result replayed, not a second execution")
	if applied {
		s.check(waited.header.Get("Preference-Applied") == "wait=10", "with Preference-Applied: wait=10")
		notified := after[idempotency.Notified] > before[idempotency.Notified]
		atOnce := after[idempotency.NotInFlight] > before[idempotency.NotInFlight] // stored as the wait began
		how := "the commit that stored it notified the waiter, which did not have to look for it"
		if !notified {
			how = "it was stored as the wait began, so the waiter found it at once (not_in_flight), without looking"
		}
		s.check((notified || atOnce) && after[idempotency.Looked] == before[idempotency.Looked],
			"as soon as the first result was stored: %s", how)
	} else {
		s.check(after[idempotency.Notified] == before[idempotency.Notified],
			"it came after the first had finished: answered at once, without waiting (no Preference-Applied)")
	}
	s.check(len(charges) == 1, "the channel holds exactly 1 charge for the order (found %d)", len(charges))
	return nil
}

// 5. create:R1, pay:R2, cancel:R3 on one order.
func oneOrderThreeIntents(ctx context.Context, s *Session) error {
	o, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	s.send("client.Pay(%s, pm_ok, WithKey(%q))", short(o.ID), s.key("R2"))
	paid, err := s.api.Pay(ctx, o.ID, client.PayRequest{PaymentMethod: "pm_ok"}, client.WithKey(s.key("R2")))
	if err != nil {
		return err
	}
	s.got("%d order %s %s", paid.Status, short(paid.Value.ID), paid.Value.Status)
	s.send("client.Cancel(%s, WithKey(%q))  a paid order is refunded first", short(o.ID), s.key("R3"))
	cancelled, err := s.api.Cancel(ctx, o.ID, client.CancelRequest{Reason: "changed my mind"}, client.WithKey(s.key("R3")))
	if err != nil {
		return err
	}
	s.got("%d order %s %s (payment %s)", cancelled.Status, short(cancelled.Value.ID), cancelled.Value.Status, paymentStatus(cancelled.Value))

	s.send("GET /v1/orders/%s/events", short(o.ID))
	events, err := s.view.Events(ctx, o.ID)
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
	s.table(rows)

	s.check(opOfKey[s.key("R1")] == "order.create" && opOfKey[s.key("R2")] == "order.pay" &&
		opOfKey[s.key("R3")] == "order.cancel" && len(opOfKey) == 3,
		"one order id, three keys: every change names the intent that made it (create:R1, pay:R2, cancel:R3)")
	s.check(cancelled.Value.Status == client.StatusCancelled && paymentStatus(cancelled.Value) == "refunded",
		"the order ends CANCELLED, its charge refunded")
	for _, name := range []string{"R1", "R2", "R3"} {
		res, err := s.view.IdempotencyRecords(ctx, s.key(name))
		if err != nil {
			return err
		}
		ok := len(res.Value) == 1 && res.Value[0].ResourceID == o.ID && res.Value[0].State == "SUCCEEDED"
		var op string
		if len(res.Value) > 0 {
			op = res.Value[0].Operation
		}
		s.check(ok, "%s has one record of its own: %s, SUCCEEDED, on this order", name, op)
	}
	return nil
}

func paymentStatus(o client.Order) string {
	if o.Payment == nil {
		return "none"
	}
	return o.Payment.Status
}
