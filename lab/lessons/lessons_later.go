package lessons

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/orderservice/orderservice/client"
)

// 14. A payment that finishes later: the channel's webhooks are a replay
// source too.
func finishesLater(ctx context.Context, s *Session) error {
	o, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	faults, err := s.channelFaults(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = s.setChannelFaults(context.WithoutCancel(ctx), faults) }()
	dup := maps.Clone(faults)
	dup["webhook_duplicate_rate"], dup["webhook_reorder_ms"] = 1, 300
	if err := s.setChannelFaults(ctx, dup); err != nil {
		return err
	}
	s.note("channel faults: every webhook delivered twice, and held back up to 300 ms so that deliveries overtake each other")
	before, err := s.scrapeMetrics(ctx)
	if err != nil {
		return err
	}

	r2 := s.key("R2")
	s.send("client.Pay(%s, pm_async_ok, WithKey(%q))  3-D Secure: the channel takes the charge on and decides later", short(o.ID), r2)
	pay, err := s.api.Pay(ctx, o.ID, client.PayRequest{PaymentMethod: "pm_async_ok"}, client.WithKey(r2))
	if err != nil {
		return err
	}
	s.got("%d order %s: the intent's answer is \"taken on\", stored and replayed to its retries", pay.Status, pay.Value.Status)
	s.note("the channel settles the charge after PAYMENT_ASYNC_DELAY and tells the service by webhook; waiting for the order…")
	paid, err := s.awaitOrder(ctx, o.ID, client.StatusPaid, 15*time.Second)
	if err != nil {
		return err
	}
	s.got("order %s is %s", short(o.ID), paid.Status)
	resent, err := s.resendWebhooksOf(ctx, chargeID(paid))
	if err != nil {
		return err
	}
	s.note("the acquirer's dashboard resends the event (%d resent): a third delivery of the same webhook-id", resent)

	s.send("POST /webhooks/payment-channel  a charge.succeeded signed with a made-up secret")
	forged, err := s.forgedWebhook(ctx, o.ID)
	if err != nil {
		return err
	}
	s.got("%d %s: %s", forged.status, forged.field("code"), forged.field("detail"))

	after, err := s.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	d, _ := moved(before, after)
	applied := increase(d, "orderservice_webhooks_received_total", `outcome="applied"`)
	duplicates := increase(d, "orderservice_webhooks_received_total", `outcome="duplicate"`)
	refused := increase(d, "orderservice_webhooks_received_total", `outcome="refused"`)
	s.note("orderservice_webhooks_received_total: applied +%.0f, duplicate +%.0f, refused +%.0f", applied, duplicates, refused)
	events, err := s.api.Events(ctx, o.ID)
	if err != nil {
		return err
	}
	succeeded := 0
	for _, e := range events.Value {
		if e.Event == "payment_succeeded" {
			succeeded++
		}
	}

	s.check(pay.Status == http.StatusAccepted && pay.Value.Status == client.StatusPaymentPending,
		"the pay answered 202 with the order PAYMENT_PENDING: taken on, not yet decided")
	s.check(paid.Status == client.StatusPaid && succeeded == 1,
		"the order became PAID once: one payment_succeeded in its history (found %d)", succeeded)
	s.check(applied == 1 && duplicates >= 2,
		"the webhook came at least three times and was applied once: the inbox's key, in the transaction of its effect, absorbed the rest (applied %.0f, duplicates %.0f)", applied, duplicates)
	s.check(forged.status == http.StatusUnauthorized && refused >= 1,
		"a webhook whose signature does not verify is refused with 401 and changes nothing")
	return nil
}

// awaitOrder polls the order until it has status.
func (s *Session) awaitOrder(ctx context.Context, id string, status client.Status, timeout time.Duration) (client.Order, error) {
	start := time.Now()
	for {
		var o client.Order
		if err := s.getJSON(ctx, s.cfg.BaseURL+"/v1/orders/"+id, true, &o); err != nil {
			return o, err
		}
		if o.Status == status {
			return o, nil
		}
		if time.Now().After(s.deadline(start, timeout)) {
			return o, fmt.Errorf("order %s is %s after %s, not %s", short(id), o.Status, timeout, status)
		}
		select {
		case <-ctx.Done():
			return o, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// resendWebhooksOf asks the channel to send again every webhook it holds
// about the charge, as its dashboard would.
func (s *Session) resendWebhooksOf(ctx context.Context, chargeID string) (int, error) {
	var list struct {
		Webhooks []struct {
			ID       string `json:"id"`
			ObjectID string `json:"object_id"`
		} `json:"webhooks"`
	}
	if err := s.getJSON(ctx, s.cfg.ChannelURL+"/admin/webhooks", false, &list); err != nil {
		return 0, err
	}
	n := 0
	for _, w := range list.Webhooks {
		if w.ObjectID != chargeID {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.ChannelURL+"/admin/webhooks/"+w.ID+"/resend", nil)
		if err != nil {
			return n, err
		}
		a, err := s.do(s.look, req)
		if err != nil {
			return n, err
		}
		if a.status/100 != 2 {
			return n, fmt.Errorf("resend %s: %d %s", w.ID, a.status, a.body)
		}
		n++
	}
	return n, nil
}

// forgedWebhook posts a charge.succeeded for the order signed with a secret
// the channel does not hold.
func (s *Session) forgedWebhook(ctx context.Context, orderID string) (rawAnswer, error) {
	body := map[string]any{"type": "charge.succeeded", "timestamp": time.Now().UTC().Format(time.RFC3339),
		"data": map[string]any{"id": "ch_forged", "status": "succeeded", "reference": orderID}}
	h := http.Header{}
	h.Set("webhook-id", "msg_forged_"+s.runID)
	h.Set("webhook-timestamp", strconv.FormatInt(time.Now().Unix(), 10))
	h.Set("webhook-signature", "v1,Zm9yZ2VkIGJ5IGEgbGVhcm5lciB3aXRob3V0IHRoZSBzZWNyZXQ=")
	return s.postWith(ctx, "/webhooks/payment-channel", "", body, 10*time.Second, h)
}
