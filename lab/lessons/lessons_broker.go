package lessons

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/internal/messaging"
)

// resultWait bounds how long a lesson waits for a result or an event.
const resultWait = 20 * time.Second

// keyed keeps the results under one of keys.
func keyed(keys ...string) func(brokerMsg) bool {
	return func(m brokerMsg) bool {
		for _, k := range keys {
			if m.header.Get(messaging.HeaderKey) == k {
				return true
			}
		}
		return false
	}
}

// 9. A create command redelivered after a crash between commit and ack.
func redelivered(ctx context.Context, s *Session) error {
	r1, body := s.key("R1"), s.purchase()
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	results, err := s.subscribe(messaging.ResultSubject(s.cfg.Tenant, "create"), keyed(r1))
	if err != nil {
		return err
	}
	defer results.stop()
	subject := messaging.CommandSubject(s.cfg.Tenant, "create")
	s.send("SUB %s  as NATS user %s (password: its API key)", results.sub.Subject, s.cfg.Tenant)
	s.send("PUB %s  Idempotency-Key: %s  (customer %s, 2 × SKU-1, unit_price 1250: minor units, 12.50 EUR)", subject, r1, body.CustomerID)
	ack1, err := s.publishCommand(ctx, "create", r1, raw)
	if err != nil {
		return err
	}
	s.got("stored in %s as message %d", ack1.Stream, ack1.Sequence)
	got, err := s.awaitResults(ctx, results, r1, 1, resultWait)
	if err != nil {
		return err
	}
	first := got[0]
	s.got("%s", first)
	s.observeIntent(ctx, "create", r1, "", first)
	s.note("The service committed O9 and its record, published this result, and would ack now. Say it dies first:")
	s.note("JetStream redelivers the very command (after COMMAND_ACK_WAIT) to any instance. A live demo cannot kill the")
	s.note("service between commit and ack; tests/faults TestCommandsByMessageConvergeWhileInstancesAreKilled and")
	s.note("internal/messaging TestRedeliveryAfterCommitBeforeAck do (a hook stops the handler, or SIGKILL, right there).")
	s.note("Here the copy is published as the broker would redeliver it: same subject, same key, same body.")
	s.send("PUB %s  Idempotency-Key: %s  (the same command again, byte for byte)", subject, r1)
	ack2, err := s.publishCommand(ctx, "create", r1, raw)
	if err != nil {
		return err
	}
	s.got("stored in %s as message %d", ack2.Stream, ack2.Sequence)
	if got, err = s.awaitResults(ctx, results, r1, 2, resultWait); err != nil {
		return err
	}
	second := got[1]
	s.got("%s", second)
	s.observeIntent(ctx, "create", r1, "", second)
	count, err := s.ordersOf(ctx, body.CustomerID)
	if err != nil {
		return err
	}

	o9 := first.field("id")
	s.check(first.status() == http.StatusCreated && o9 != "" && !first.replayed(),
		"the first delivery created O9 = %s: Status 201 on %s", short(o9), first.subject)
	s.check(ack2.Sequence != ack1.Sequence, "the copy is a second message in %s (%d, %d): the broker does not deduplicate it, the record does",
		ack1.Stream, ack1.Sequence, ack2.Sequence)
	s.check(second.status() == http.StatusCreated && second.field("id") == o9 && second.replayed(),
		"the redelivery got O9 back, marked Idempotent-Replayed: true, never a new O10")
	s.check(bytes.Equal(first.data, second.data) && first.header.Get(messaging.HeaderLocation) == second.header.Get(messaging.HeaderLocation),
		"the replay on the results subject is the first result byte for byte, with the same Location")
	s.check(len(got) == 2, "exactly 2 results under R1, one per delivery (found %d)", len(got))
	s.check(count == 1, "the customer has exactly 1 order (found %d)", count)
	return nil
}

// 10. An HTTP request and a message with one key.
func twoDoors(ctx context.Context, s *Session) error {
	r1, r2 := s.key("R1"), s.key("R2")
	results, err := s.subscribe(messaging.ResultSubject(s.cfg.Tenant, "create"), keyed(r1, r2))
	if err != nil {
		return err
	}
	defer results.stop()
	subject := messaging.CommandSubject(s.cfg.Tenant, "create")

	// HTTP first, then the message.
	a := s.purchase()
	rawA, _ := json.Marshal(a)
	s.send("POST /v1/orders  Idempotency-Key: %s  (customer %s)", r1, a.CustomerID)
	httpA, err := s.post(ctx, "/v1/orders", r1, a, 0)
	if err != nil {
		return err
	}
	s.got("%s", httpA)
	s.send("PUB %s  Idempotency-Key: %s  (the same body, through the broker)", subject, r1)
	if _, err := s.publishCommand(ctx, "create", r1, rawA); err != nil {
		return err
	}
	got, err := s.awaitResults(ctx, results, r1, 1, resultWait)
	if err != nil {
		return err
	}
	msgA := got[0]
	s.got("%s", msgA)
	s.observeIntent(ctx, "create", r1, "", msgA)

	// The message first, then HTTP.
	b := s.purchase()
	b.CustomerID += "_b"
	rawB, _ := json.Marshal(b)
	s.note("")
	s.note("And the other way round, under a key of its own:")
	s.send("PUB %s  Idempotency-Key: %s  (customer %s)", subject, r2, b.CustomerID)
	if _, err := s.publishCommand(ctx, "create", r2, rawB); err != nil {
		return err
	}
	if got, err = s.awaitResults(ctx, results, r2, 1, resultWait); err != nil {
		return err
	}
	msgB := got[0]
	s.got("%s", msgB)
	s.observeIntent(ctx, "create", r2, "", msgB)
	s.send("POST /v1/orders  Idempotency-Key: %s  (the same body, over HTTP)", r2)
	httpB, err := s.post(ctx, "/v1/orders", r2, b, 0)
	if err != nil {
		return err
	}
	s.got("%s", httpB)
	countA, err := s.ordersOf(ctx, a.CustomerID)
	if err != nil {
		return err
	}
	countB, err := s.ordersOf(ctx, b.CustomerID)
	if err != nil {
		return err
	}

	s.check(httpA.status == http.StatusCreated && httpA.header.Get("Idempotent-Replayed") == "",
		"over HTTP first under R1: 201, order %s", short(httpA.field("id")))
	s.check(msgA.status() == http.StatusCreated && msgA.replayed() && msgA.field("id") == httpA.field("id"),
		"the message under R1 got that order back, Idempotent-Replayed: true on the results subject")
	s.check(bytes.Equal(msgA.data, httpA.body) && msgA.header.Get(messaging.HeaderLocation) == httpA.header.Get("Location"),
		"the result's body is the HTTP answer byte for byte, with the same Location")
	s.check(countA == 1, "R1's customer has exactly 1 order (found %d)", countA)
	s.check(msgB.status() == http.StatusCreated && !msgB.replayed(),
		"by message first under R2: Status 201, order %s", short(msgB.field("id")))
	s.check(httpB.status == http.StatusCreated && httpB.header.Get("Idempotent-Replayed") == "true" &&
		httpB.field("id") == msgB.field("id") && bytes.Equal(httpB.body, msgB.data),
		"the HTTP request under R2 got the message's order replayed, byte for byte")
	s.check(countB == 1, "R2's customer has exactly 1 order (found %d)", countB)
	return nil
}

// 11. A dead-lettered command, replayed by an operator.
func deadLetterReplayed(ctx context.Context, s *Session) error {
	o, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	r2 := s.key("R2")
	body := []byte(fmt.Sprintf(`{"order_id":%q,"payment_method":"pm_ok"}`, o.ID))
	results, err := s.subscribe(messaging.ResultSubject(s.cfg.Tenant, "pay"), keyed(r2))
	if err != nil {
		return err
	}
	defer results.stop()
	operator, opErr := s.operatorBroker()
	if opErr != nil && !errors.Is(opErr, errNoOperator) {
		return opErr
	}
	before, err := s.scrapeMetrics(ctx)
	if err != nil {
		return err
	}

	saved, err := s.channelFaults(ctx)
	if err != nil {
		return err
	}
	restored := false
	restore := func() error {
		if restored {
			return nil
		}
		restored = true
		return s.setChannelFaults(context.WithoutCancel(ctx), saved)
	}
	defer func() { _ = restore() }()
	s.send("POST %s/admin/faults  {\"unavailable_rate\": 1}: the channel answers 503 to everything", s.cfg.ChannelURL)
	if err := s.setChannelFaults(ctx, map[string]any{"unavailable_rate": 1}); err != nil {
		return err
	}
	subject := messaging.CommandSubject(s.cfg.Tenant, "pay")
	s.send("PUB %s  Idempotency-Key: %s  {\"order_id\": \"%s\", \"payment_method\": \"pm_ok\"}", subject, r2, short(o.ID))
	if _, err := s.publishCommand(ctx, "pay", r2, body); err != nil {
		return err
	}
	s.note("Every delivery meets the 503: a transient failure, so the service naks it for later (COMMAND_BACKOFF, doubling")
	s.note("up to COMMAND_BACKOFF_MAX, never sooner than Retry-After) and publishes no result. After COMMAND_MAX_DELIVER")
	s.note("deliveries it moves the command to %s. With the defaults (5 deliveries, 1s doubling, Retry-After 2s)", messaging.DLQStream)
	s.note("that takes about 16 seconds; waiting…")
	start := time.Now()
	var dead messaging.DeadLetter
	if opErr == nil {
		if dead, err = s.awaitDeadLetter(ctx, operator, r2, 2*time.Minute); err != nil {
			return err
		}
		deliveries, _ := strconv.Atoi(dead.Header.Get(messaging.HeaderDLDeliveries))
		s.got("%s message %d, after %.1fs: %s  Idempotency-Key: %s  Dead-Letter-Deliveries: %d  Dead-Letter-Reason: %s",
			messaging.DLQStream, dead.Sequence, time.Since(start).Seconds(), dead.Subject, dead.Header.Get(messaging.HeaderKey),
			deliveries, dead.Reason())
		s.emit(Event{Kind: KindMessage, Message: &Message{Kind: MessageDeadLetter, Subject: dead.Subject, Key: r2,
			Seq: dead.Sequence, Deliveries: deliveries, Reason: dead.Reason()}})
	} else {
		s.note("(%v: the lesson cannot read %s, so it watches the service's metrics instead)", opErr, messaging.DLQStream)
		if err := s.awaitDeadLetterMetric(ctx, before, 2*time.Minute); err != nil {
			return err
		}
		s.got("dead-lettered after %.1fs (orderservice_messages_dead_lettered_total{op=\"pay\"} +1)", time.Since(start).Seconds())
	}
	// The record between attempts: the last delivery may have met a retry
	// of the sweeper's still holding the intent (its 409 is the reason
	// above), and that retry records FAILED_RETRYABLE again when the
	// channel refuses it.
	parked, err := s.settledRecord(ctx, r2, "order.pay", 10*time.Second)
	if err != nil {
		return err
	}
	s.showRecord(parked)
	mid, err := s.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	failing, _ := moved(before, mid)
	resultsWhileFailing := len(resultsFor(results.all(), r2))

	s.note("")
	s.note("Days later the cause is fixed, and an operator replays the dead letter.")
	s.send("POST %s/admin/faults  (the faults as they were before the lesson)", s.cfg.ChannelURL)
	if err := restore(); err != nil {
		return err
	}
	var replayed []messaging.Replayed
	if opErr == nil {
		s.send("go run ./cmd/orderservice dlq replay %d  (it republishes the command unchanged to %s and deletes it from the DLQ)",
			dead.Sequence, dead.Subject)
		s.note("(under docker compose: docker compose exec orderservice-1 /orderservice dlq replay %d)", dead.Sequence)
		if err := s.waitStep(ctx, Request{Method: "REPLAY", Path: dead.Subject, Key: r2, Operation: "order.pay"}); err != nil {
			return err
		}
		// Horizon 0: the lesson replays minutes after the dead letter was
		// written, well inside any retention; `orderservice dlq replay`
		// derives the bound from the service's policy.
		if replayed, err = (&messaging.DLQ{JS: operator}).Replay(ctx, 0, dead.Sequence); err != nil {
			return err
		}
		for _, r := range replayed {
			if r.Unread != nil || r.Err != nil || r.Refused != "" {
				s.got("kept %d: %v%s", r.Sequence, errors.Join(r.Unread, r.Err), r.Refused)
				continue
			}
			s.got("replayed %d to %s (Idempotency-Key %s)", r.Sequence, r.Subject, r.Header.Get(messaging.HeaderKey))
			s.emit(Event{Kind: KindMessage, Message: &Message{Kind: MessageReplay, Subject: r.Subject, Key: r2, Seq: r.Sequence}})
		}
	} else {
		s.note("The operator would run `go run ./cmd/orderservice dlq list` and `… dlq replay SEQ`, which republishes the")
		s.note("command unchanged; without their credentials, the client publishes that very command instead:")
		s.send("PUB %s  Idempotency-Key: %s  (the dead letter's headers and body)", subject, r2)
		if _, err := s.publishCommand(ctx, "pay", r2, body); err != nil {
			return err
		}
	}
	got, err := s.awaitResults(ctx, results, r2, 1, 30*time.Second)
	if err != nil {
		return err
	}
	res := got[0]
	s.got("%s", res)
	s.observeIntent(ctx, "pay", r2, o.ID, res)
	// Two replays meet here: the operator's (the dead letter published
	// again) and the record's (Idempotent-Replayed: a stored result).
	if res.replayed() {
		s.note("Idempotent-Replayed: true: the sweeper had finished the intent once the channel answered again, so the")
		s.note("record handed the operator's replay that stored result; nothing ran twice.")
	} else {
		s.note("No Idempotent-Replayed header: a new result, not a stored one. The record held the intent FAILED_RETRYABLE,")
		s.note("with no result to hand back, so the operator's replay resumed it, under the same channel key as before.")
	}
	final, err := s.record(ctx, r2, "order.pay")
	if err != nil {
		return err
	}
	s.showRecord(final)
	charges, err := s.chargesFor(ctx, o.ID)
	if err != nil {
		return err
	}
	var ch channelCharge
	if len(charges) > 0 {
		ch = charges[0]
		s.note("channel /admin/charges: %s %s, %d request(s) under key %s", ch.ID, ch.Status, ch.Requests, ch.IdempotencyKey)
	}

	received := increase(failing, "orderservice_messages_received_total", `op="pay"`)
	redelivered := increase(failing, "orderservice_messages_redelivered_total", `op="pay"`)
	deadLettered := increase(failing, "orderservice_messages_dead_lettered_total", `op="pay"`)
	if opErr == nil {
		deliveries, _ := strconv.Atoi(dead.Header.Get(messaging.HeaderDLDeliveries))
		s.check(deliveries >= 1 && float64(deliveries) == received,
			"dead-lettered after %d deliveries (COMMAND_MAX_DELIVER), as many as the service received (%s)", deliveries, number(received))
		s.check(dead.Header.Get(messaging.HeaderKey) == r2 && bytes.Equal(dead.Data, body) && dead.Subject == subject,
			"the dead letter is the command unchanged: its subject, Idempotency-Key and body")
		s.check(len(replayed) == 1 && replayed[0].Err == nil && replayed[0].Refused == "", "the operator's replay put it back on %s (1 replayed)", subject)
		left, err := s.deadLettersUnder(ctx, operator, r2)
		if err != nil {
			return err
		}
		s.check(left == 0, "the DLQ no longer holds it (found %d)", left)
	}
	s.check(redelivered == received-1 && deadLettered == 1,
		"metrics: %s deliveries, %s of them redeliveries, 1 dead-lettered (found %s)", number(received), number(received-1), number(deadLettered))
	s.check(resultsWhileFailing == 0, "no result was published while it kept failing: a transient failure is no outcome (found %d)", resultsWhileFailing)
	s.check(res.status() == http.StatusOK && res.field("status") == string(client.StatusPaid),
		"after the replay the result is 200, order PAID (replayed: %v)", res.replayed())
	s.check(final.State == "SUCCEEDED" && final.Attempts > 1,
		"one record absorbed every attempt: SUCCEEDED after %d attempts under lease_token %d", final.Attempts, final.LeaseToken)
	s.check(len(charges) == 1 && ch.Status == "succeeded", "the channel holds exactly 1 charge for the order (found %d)", len(charges))
	return nil
}

// awaitDeadLetter polls the DLQ, as the operator, until it holds a
// command under key.
func (s *Session) awaitDeadLetter(ctx context.Context, js jetstream.JetStream, key string, timeout time.Duration) (messaging.DeadLetter, error) {
	start := time.Now()
	q := &messaging.DLQ{JS: js}
	for {
		letters, err := q.List(ctx)
		if err != nil {
			return messaging.DeadLetter{}, err
		}
		for _, d := range letters {
			if d.Header.Get(messaging.HeaderKey) == key {
				return d, nil
			}
		}
		if time.Now().After(s.deadline(start, timeout)) {
			return messaging.DeadLetter{}, fmt.Errorf("no dead letter under %s in %s after %s", key, messaging.DLQStream, timeout)
		}
		select {
		case <-ctx.Done():
			return messaging.DeadLetter{}, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// deadLettersUnder counts the DLQ's commands under key.
func (s *Session) deadLettersUnder(ctx context.Context, js jetstream.JetStream, key string) (int, error) {
	letters, err := (&messaging.DLQ{JS: js}).List(ctx)
	n := 0
	for _, d := range letters {
		if d.Header.Get(messaging.HeaderKey) == key {
			n++
		}
	}
	return n, err
}

// awaitDeadLetterMetric polls /metrics until a pay command was dead-lettered
// since before.
func (s *Session) awaitDeadLetterMetric(ctx context.Context, before metricSnapshot, timeout time.Duration) error {
	start := time.Now()
	for {
		now, err := s.scrapeMetrics(ctx)
		if err != nil {
			return err
		}
		if d, _ := moved(before, now); increase(d, "orderservice_messages_dead_lettered_total", `op="pay"`) > 0 {
			return nil
		}
		if time.Now().After(s.deadline(start, timeout)) {
			return fmt.Errorf("no pay command was dead-lettered within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// channelFaults reads the channel's faults in force.
func (s *Session) channelFaults(ctx context.Context) (map[string]any, error) {
	var f map[string]any
	return f, s.getJSON(ctx, s.cfg.ChannelURL+"/admin/faults", false, &f)
}

// setChannelFaults replaces the channel's faults.
func (s *Session) setChannelFaults(ctx context.Context, f map[string]any) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.ChannelURL+"/admin/faults", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	a, err := s.do(s.look, req)
	if err == nil && a.status/100 != 2 {
		err = fmt.Errorf("POST /admin/faults: %d %s", a.status, bytes.TrimSpace(a.body))
	}
	return err
}

// orderEvent is an event's body, the fields the lesson reads.
type orderEvent struct {
	EventID string `json:"event_id"`
	Event   string `json:"event"`
	OrderID string `json:"order_id"`
	From    string `json:"from_status"`
	To      string `json:"to_status"`
	Key     string `json:"idempotency_key"`
}

func eventOf(m brokerMsg) orderEvent {
	var e orderEvent
	_ = json.Unmarshal(m.data, &e)
	return e
}

// 12. The outbox and a relay crash between publish and mark.
func outboxRelayCrash(ctx context.Context, s *Session) error {
	mine := s.keyPrefix + "-"
	since := time.Now().Add(-time.Second)
	events, err := s.subscribe(messaging.EventPrefix+s.cfg.Tenant+".>", func(m brokerMsg) bool {
		return strings.HasPrefix(eventOf(m).Key, mine)
	})
	if err != nil {
		return err
	}
	defer events.stop()
	s.send("SUB %s  as NATS user %s", events.sub.Subject, s.cfg.Tenant)
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
	want := []string{"created", "payment_pending", "paid"}
	got, err := s.await(ctx, events, resultWait, "the order's 3 events", func(m []brokerMsg) bool { return len(m) >= len(want) })
	if err != nil {
		return err
	}
	rows := [][]string{{"#", "subject", "Nats-Msg-Id", "from → to", "idempotency key"}}
	inOrder, idsMatch := len(got) == len(want), true
	ids := map[string]bool{}
	for i, m := range got {
		e := eventOf(m)
		from := e.From
		if from == "" {
			from = "·"
		}
		rows = append(rows, []string{strconv.Itoa(i + 1), m.subject, m.header.Get(messaging.HeaderMsgID), from + " → " + e.To, e.Key})
		if i < len(want) {
			inOrder = inOrder && e.Event == want[i] && m.subject == messaging.EventSubject(s.cfg.Tenant, want[i]) && e.OrderID == o.ID
		}
		idsMatch = idsMatch && e.EventID != "" && m.header.Get(messaging.HeaderMsgID) == e.EventID
		ids[e.EventID] = true
	}
	s.table(rows)

	s.check(inOrder, "the order's events arrived in order: %s, on orders.events.%s.<event>", strings.Join(want, ", "), s.cfg.Tenant)
	s.check(idsMatch && len(ids) == len(want), "each once, with Nats-Msg-Id = its event id (%d distinct ids)", len(ids))

	js, opErr := s.operatorBroker()
	if errors.Is(opErr, errNoOperator) {
		s.note("(%v: only the relay's user may publish events, so the relay's crash is told, not shown)", opErr)
		return nil
	}
	if opErr != nil {
		return opErr
	}
	last := got[len(got)-1]
	s.note("Say the relay dies after JetStream acknowledged these events and before it marked them published: the")
	s.note("next pass (on any instance) finds them unmarked and publishes them again, with the same ids. As that relay:")
	s.send("PUB %s  Nats-Msg-Id: %s  (the same event again, as the service's NATS user)", last.subject, last.header.Get(messaging.HeaderMsgID))
	if err := s.waitStep(ctx, Request{Method: "PUB", Path: last.subject}); err != nil {
		return err
	}
	m := nats.NewMsg(last.subject)
	for k, vs := range last.header {
		m.Header[k] = vs
	}
	m.Data = last.data
	ack, err := js.PublishMsg(ctx, m)
	if err != nil {
		return err
	}
	s.got("JetStream: duplicate %v, message %d of %s (the first copy's)", ack.Duplicate, ack.Sequence, ack.Stream)
	s.emit(Event{Kind: KindMessage, Message: &Message{Kind: MessageRepublish, Subject: last.subject,
		MsgID: last.header.Get(messaging.HeaderMsgID), Seq: ack.Sequence, Duplicate: ack.Duplicate, Event: eventOf(last).Event}})
	stored, err := storedCopies(ctx, js, messaging.EventPrefix+s.cfg.Tenant+".>", since, ids)
	if err != nil {
		return err
	}
	// A plain subscriber is no stream: it hears every publish, the copy too.
	heard, err := s.await(ctx, events, resultWait, "the republished copy", func(m []brokerMsg) bool { return len(m) > len(want) })
	if err != nil {
		return err
	}
	inbox, applied, dropped := map[string]bool{}, 0, 0
	for _, m := range heard {
		if id := m.header.Get(messaging.HeaderMsgID); inbox[id] {
			dropped++
		} else {
			inbox[id] = true
			applied++
		}
	}
	s.note("%s holds: %s. The live subscriber heard %d messages; its inbox of event ids applied %d and dropped %d.",
		messaging.EventsStream, describeCopies(stored), len(heard), applied, dropped)

	onceEach := len(stored) == len(ids)
	for _, n := range stored {
		onceEach = onceEach && n == 1
	}
	s.check(ack.Duplicate, "JetStream's duplicate window dropped the republished copy (duplicate: true)")
	s.check(onceEach, "the stream keeps each of the %d events exactly once", len(ids))
	s.check(len(heard) == len(want)+1 && applied == len(want) && dropped == 1,
		"a plain subscriber heard the copy too (%d messages): its own inbox of event ids applies %d and drops %d", len(heard), applied, dropped)
	return nil
}

// storedCopies counts, as the operator, how often ORDER_EVENTS holds each
// of ids among the messages on subject since a time.
func storedCopies(ctx context.Context, js jetstream.JetStream, subject string, since time.Time, ids map[string]bool) (map[string]int, error) {
	c, err := js.OrderedConsumer(ctx, messaging.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", messaging.EventsStream, err)
	}
	counts := map[string]int{}
	for {
		batch, err := c.Fetch(500, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			return nil, err
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			if id := msg.Headers().Get(messaging.HeaderMsgID); ids[id] {
				counts[id]++
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if n == 0 {
			return counts, nil
		}
	}
}

func describeCopies(stored map[string]int) string {
	var parts []string
	for id, n := range stored {
		parts = append(parts, fmt.Sprintf("…%s ×%d", id[max(0, len(id)-8):], n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
