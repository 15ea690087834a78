package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/internal/webhook"
)

// webhookResult is scenario 11: Deliveries orders left PAYMENT_PENDING,
// each resolved by one signed charge.succeeded delivery, which is then
// sent again.
type webhookResult struct {
	Deliveries  int
	Concurrency int
	// AsyncDelay is how long the channel kept each charge pending.
	AsyncDelay       time.Duration
	First, Duplicate webhookPhase
	// Paid counts the orders PAID in the database after both phases.
	Paid int64
}

// webhookPhase is every delivery sent once, in a closed loop.
type webhookPhase struct {
	// Want is the outcome every answer of the phase should carry.
	Want  string
	Point point
	// Lookups counts the charges looked up at the channel during the
	// phase; WAL is how far the cluster's WAL moved meanwhile, in bytes.
	Lookups, WAL int64
}

// Answered counts the answers that carried Want.
func (p webhookPhase) Answered() int { return p.Point.Outcomes[p.Want] }

// PerSecond is the answers carrying Want per second, from the first
// delivery sent to the last answer received.
func (p webhookPhase) PerSecond() float64 {
	if p.Point.Drain <= 0 {
		return 0
	}
	return float64(p.Answered()) / p.Point.Drain.Seconds()
}

// Checked reports whether every first delivery was applied, every second
// one a duplicate, and every order is PAID.
func (w webhookResult) Checked() bool {
	return w.First.Answered() == w.Deliveries && w.Duplicate.Answered() == w.Deliveries && w.Paid == int64(w.Deliveries)
}

// webhookAsyncDelay is how long the channel keeps scenario 11's charges
// pending: the pay is answered 202, and the bench does not wait long.
const webhookAsyncDelay = 50 * time.Millisecond

// webhooks is scenario 11: Webhooks orders paid with pm_async_ok and, once
// the channel has settled every charge, one signed charge.succeeded
// delivery per order sent by the bench: every delivery once in a closed
// loop at WebhookConc, then every one again the same way.
func (b *bench) webhooks(ctx context.Context, res *results) error {
	o := b.opts
	// The sweeper asks the channel about pending payments too: not within
	// the scenario, so that every outcome arrives by a delivery.
	if err := b.restart(ctx, o.Pool, map[string]string{
		"PAYMENT_ASYNC_DELAY": webhookAsyncDelay.String(), "PAYMENT_PENDING_CHECK_EVERY": "1h"}); err != nil {
		return err
	}
	ch := b.svc.Channel
	// The channel's own deliveries never arrive; they are held back for a
	// minute, the most it allows, so that its dropped attempts and their
	// retries do not write to the database during the measurement either.
	if err := ch.SetFaults(mockchannel.Faults{WebhookDropRate: 1, WebhookDelayMS: 60_000}); err != nil {
		return err
	}
	// Emptying the ledger drops the events still held back, which would
	// otherwise reach the next scenario's service.
	defer ch.Reset()
	if err := b.reset(ctx); err != nil {
		return err
	}
	deliveries, err := b.pendingDeliveries(ctx, o.Webhooks)
	if err != nil {
		return err
	}

	w := webhookResult{Deliveries: len(deliveries), Concurrency: o.WebhookConc, AsyncDelay: b.svc.Config.Channel.AsyncDelay}
	for _, ph := range []struct {
		into       *webhookPhase
		name, want string
	}{{&w.First, "first deliveries", "applied"}, {&w.Duplicate, "duplicates", "duplicate"}} {
		// The relay publishes what the pays and the first deliveries wrote
		// before the phase, not during it.
		if err := b.waitFor(ctx, 10*time.Second, func(left int64) bool { return left == 0 },
			`SELECT count(*) FROM order_outbox WHERE published_at IS NULL`); err != nil {
			return err
		}
		if err := b.checkpoint(ctx); err != nil {
			return err
		}
		lookups := ch.Stats().Lookups
		from, err := b.walPosition(ctx)
		if err != nil {
			return err
		}
		// No warm-up: a delivery is first only once, and the pays just
		// made warmed the same connections.
		p := shot{name: ph.name, client: b.client, workers: o.WebhookConc, hits: len(deliveries),
			targeter: inTurn(deliveries), outcome: webhookOutcome}.fire(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		to, err := b.walPosition(ctx)
		if err != nil {
			return err
		}
		*ph.into = webhookPhase{Want: ph.want, Point: p, Lookups: ch.Stats().Lookups - lookups, WAL: to - from}
		b.progress("  c=%d %-16s %8.0f %s/s  p50 %-8s p99 %-8s %s; %d channel lookups", o.WebhookConc, ph.name,
			ph.into.PerSecond(), ph.want, ms(p.P50), ms(p.P99), outcomes(p), ph.into.Lookups)
	}
	if w.Paid, err = b.count(ctx, `SELECT count(*) FROM orders WHERE status = 'PAID'`); err != nil {
		return err
	}
	res.Webhooks = w
	if n := w.First.Answered(); n != w.Deliveries {
		res.fail("webhooks: %d of %d first deliveries answered applied (%s)", n, w.Deliveries, outcomes(w.First.Point))
	}
	if n := w.Duplicate.Answered(); n != w.Deliveries {
		res.fail("webhooks: %d of %d second deliveries answered duplicate (%s)", n, w.Deliveries, outcomes(w.Duplicate.Point))
	}
	if w.Paid != int64(w.Deliveries) {
		res.fail("webhooks: %d of %d orders PAID after their deliveries", w.Paid, w.Deliveries)
	}
	return nil
}

// pendingDeliveries pays n prepared orders with pm_async_ok (each answered
// 202, the order PAYMENT_PENDING), waits until the channel has settled
// every charge, and returns one signed charge.succeeded delivery per order,
// each with its own webhook-id.
func (b *bench) pendingDeliveries(ctx context.Context, n int) ([]vegeta.Target, error) {
	ids, err := b.prepareOrders(ctx, n)
	if err != nil {
		return nil, err
	}
	p := shot{name: "async pays", client: b.client, workers: b.opts.WebhookConc, hits: n,
		targeter: pays(b.svc.URL(), ids, payment.MethodAsyncOK, &b.keys)}.fire(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if u := unexpected(p, http.StatusAccepted); u != "" {
		return nil, fmt.Errorf("%d pays with %s were not all answered 202: %s", n, payment.MethodAsyncOK, u)
	}
	rows, _ := b.admin.Query(ctx, `SELECT channel_key FROM payments WHERE kind = 'charge' AND status = 'pending'`)
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	if len(keys) != n {
		return nil, fmt.Errorf("%d pays answered 202, but %d payments are pending", n, len(keys))
	}

	api := payment.NewClient("http://"+b.svc.ChannelAddr, nil)
	url, secret := b.svc.URL()+"/webhooks/payment-channel", b.svc.Config.Payment.WebhookSecrets[0]
	deadline := time.Now().Add(30 * time.Second)
	out := make([]vegeta.Target, len(keys))
	for i, key := range keys {
		charge, err := settledCharge(ctx, api, key, deadline)
		if err != nil {
			return nil, err
		}
		if out[i], err = signedDelivery(url, secret, "msg_bench_"+strconv.Itoa(i), charge); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// settledCharge looks the charge under key up at the channel until it is
// no longer pending, and returns it as the channel shows it.
func settledCharge(ctx context.Context, api *payment.Client, key string, deadline time.Time) (payment.Charge, error) {
	for {
		charge, err := api.LookupCharge(ctx, key)
		switch {
		case err != nil:
			return charge, fmt.Errorf("look up charge %s: %w", key, err)
		case charge.Status == payment.StatusSucceeded:
			return charge, nil
		case charge.Status != payment.StatusPending:
			return charge, fmt.Errorf("charge %s settled %s, want %s", key, charge.Status, payment.StatusSucceeded)
		case time.Now().After(deadline):
			return charge, fmt.Errorf("charge %s is still pending", key)
		}
		select {
		case <-ctx.Done():
			return charge, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// signedDelivery is the charge.succeeded delivery of charge as the channel
// sends one, under webhook-id id, signed now with secret. Both phases send
// it as it is: the timestamp's tolerance (five minutes) outlasts them.
func signedDelivery(url, secret, id string, charge payment.Charge) (vegeta.Target, error) {
	now := time.Now()
	body, err := json.Marshal(struct {
		Type      string         `json:"type"`
		Timestamp time.Time      `json:"timestamp"`
		Data      payment.Charge `json:"data"`
	}{payment.EventChargeSucceeded, now.UTC(), charge})
	if err != nil {
		return vegeta.Target{}, err
	}
	sig, err := webhook.Sign(secret, id, now, body)
	if err != nil {
		return vegeta.Target{}, err
	}
	h := http.Header{"Content-Type": {"application/json"}}
	h.Set(webhook.HeaderID, id)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(webhook.HeaderSignature, sig)
	return vegeta.Target{Method: http.MethodPost, URL: url, Body: body, Header: h}, nil
}

// webhookOutcome is what the service's answer says came of a delivery: its
// outcome, or the HTTP status when it is not a 200 with one (0: no answer).
func webhookOutcome(r *vegeta.Result) string {
	var a struct {
		Outcome string `json:"outcome"`
	}
	if r.Code == http.StatusOK && json.Unmarshal(r.Body, &a) == nil && a.Outcome != "" {
		return a.Outcome
	}
	return "HTTP " + strconv.Itoa(int(r.Code))
}
