package lessons

import (
	"context"
	"net/http"
	"time"

	"github.com/orderservice/orderservice/client"
)

// 6. The idempotency layer and the state machine, side by side.
func twoLayers(ctx context.Context, s *Session) error {
	o, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	before, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	r2, ok := s.key("R2"), client.PayRequest{PaymentMethod: "pm_ok"}
	var paid [2]client.Result[client.Order]
	for i := range paid {
		s.send("client.Pay(%s, pm_ok, WithKey(%q))", short(o.ID), r2)
		if paid[i], err = s.api.Pay(ctx, o.ID, ok, client.WithKey(r2)); err != nil {
			return err
		}
		s.got("%d order %s, Replayed=%v", paid[i].Status, paid[i].Value.Status, paid[i].Replayed)
	}
	after, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	s.note("channel /admin/stats: charges %d → %d, duplicates_absorbed %d → %d",
		before.Charges, after.Charges, before.DuplicatesAbsorbed, after.DuplicatesAbsorbed)
	charges, err := s.chargesFor(ctx, o.ID)
	if err != nil {
		return err
	}

	fresh := s.key("R2-again")
	s.send("client.Pay(%s, pm_ok, WithKey(%q))  a new key: a new intent to pay a PAID order", short(o.ID), fresh)
	_, payAgain := s.once.Pay(ctx, o.ID, ok, client.WithKey(fresh))
	pe := problemOf(payAgain)
	s.got("%d %s: %s", pe.Status, pe.Code, pe.Detail)
	chargesAfter, err := s.chargesFor(ctx, o.ID)
	if err != nil {
		return err
	}

	s.send("client.Cancel(%s, WithKey(%q))", short(o.ID), s.key("R3"))
	cancelled, err := s.api.Cancel(ctx, o.ID, client.CancelRequest{}, client.WithKey(s.key("R3")))
	if err != nil {
		return err
	}
	s.got("%d order %s (payment %s)", cancelled.Status, cancelled.Value.Status, paymentStatus(cancelled.Value))
	s.send("client.Ship(%s, DHL, WithKey(%q))", short(o.ID), s.key("R4"))
	_, ship := s.once.Ship(ctx, o.ID, client.ShipRequest{Carrier: "DHL", TrackingNumber: "DHL-" + s.runID}, client.WithKey(s.key("R4")))
	shipProblem := problemOf(ship)
	s.got("%d %s: %s", shipProblem.Status, shipProblem.Code, shipProblem.Detail)
	final, err := s.view.GetOrder(ctx, o.ID)
	if err != nil {
		return err
	}

	s.check(paid[0].Value.Status == client.StatusPaid && !paid[0].Replayed && paid[1].Replayed,
		"pay under R2 twice: the second is a replay of the first")
	s.check(len(charges) == 1, "one charge on the channel for the order (found %d)", len(charges))
	s.check(client.IsInvalidTransition(payAgain) && pe.Status == http.StatusConflict,
		"a new key on a PAID order passes idempotency and meets the state machine: 409 invalid_transition")
	s.check(len(chargesAfter) == 1, "the refused pay never reached the channel (still %d charge)", len(chargesAfter))
	s.check(cancelled.Value.Status == client.StatusCancelled, "cancel under R3: CANCELLED, refunded first")
	s.check(client.IsInvalidTransition(ship) && final.Value.Status == client.StatusCancelled,
		"a CANCELLED order cannot ship: 409 invalid_transition, and it stays CANCELLED")
	return nil
}

// 7. A lost channel response and the propagated key. Whoever resumes the
// intent asks the channel under the key phase 1 stored: the client's retry,
// sent within Retry-After, sends the charge again and the channel answers
// with the one it made; a retry sent later (a learner stepping slowly, a
// loaded machine) may find that the sweeper resumed the intent first,
// asking the channel what it holds under the key. The lesson cannot hold
// the sweeper back, so it tells and checks whichever of the two happened.
func lostChannelResponse(ctx context.Context, s *Session) error {
	o, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	before, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	r2, lost := s.key("R2"), client.PayRequest{PaymentMethod: "pm_lost_response"}
	s.send("POST /v1/orders/%s/pay  Idempotency-Key: %s  pm_lost_response: the channel charges, then drops the connection",
		short(o.ID), r2)
	_, first := s.once.Pay(ctx, o.ID, lost, client.WithKey(r2))
	pe := problemOf(first)
	s.got("%d %s, Retry-After %s: %s", pe.Status, pe.Code, pe.RetryAfter, pe.Detail)
	s.note("The record is FAILED_RETRYABLE: a retry under %s resumes the intent at once; once Retry-After has passed, "+
		"the sweeper may resume it first.", r2)
	s.send("client.Pay(%s, pm_lost_response, WithKey(%q))  the same intent, resumed under the same key", short(o.ID), r2)
	res, err := s.api.Pay(ctx, o.ID, lost, client.WithKey(r2))
	if err != nil {
		return err
	}
	s.got("%d order %s, charge %s, Replayed=%v", res.Status, res.Value.Status, chargeID(res.Value), res.Replayed)
	rec, err := s.record(ctx, r2, "order.pay")
	if err != nil {
		return err
	}
	s.showRecord(rec)
	after, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	s.note("channel /admin/stats: charges %d → %d, lost_responses %d → %d, duplicates_absorbed %d → %d, lookups %d → %d",
		before.Charges, after.Charges, before.LostResponses, after.LostResponses, before.DuplicatesAbsorbed, after.DuplicatesAbsorbed,
		before.Lookups, after.Lookups)
	charges, err := s.chargesFor(ctx, o.ID)
	if err != nil {
		return err
	}
	var ch channelCharge
	if len(charges) > 0 {
		ch = charges[0]
		s.note("channel /admin/charges: %s under key %s, %d requests", ch.ID, ch.IdempotencyKey, ch.Requests)
	}
	// The charge was sent again under its key, or looked up under it: the
	// channel's count of requests for the charge tells which.
	sentAgain := ch.Requests > 1
	if res.Replayed {
		s.note("The sweeper resumed the intent before the retry came: it asked the channel under the key and stored " +
			"what it found, and the retry got that result, replayed.")
	}

	s.check(pe.Status == http.StatusServiceUnavailable && pe.Code == client.CodeServiceUnavailable,
		"the first attempt got 503: the outcome was unknown, so the record stayed retryable")
	s.check(res.Value.Status == client.StatusPaid && rec.Attempts >= 2 && rec.LeaseToken == int64(rec.Attempts),
		"the intent was resumed under a new fencing token (attempts %d, lease_token %d) and the order is PAID", rec.Attempts, rec.LeaseToken)
	s.check(len(charges) == 1, "the channel holds 1 charge for the order (found %d)", len(charges))
	s.check(ch.IdempotencyKey != "" && ch.IdempotencyKey != r2,
		"the key the channel saw is the service's own, derived once from tenant, order and R2 and stored")
	if sentAgain {
		absorbed := after.DuplicatesAbsorbed - before.DuplicatesAbsorbed
		s.check(absorbed >= int64(ch.Requests-1),
			"the retry sent the charge again under that key and the channel absorbed the duplicate: %d requests, duplicates_absorbed +%d",
			ch.Requests, absorbed)
	} else {
		s.check(after.Lookups > before.Lookups,
			"the sweeper asked the channel what it holds under the key (lookups +%d) and found the charge: 1 request, no second charge",
			after.Lookups-before.Lookups)
	}
	s.check(chargeID(res.Value) == ch.ID, "the order's payment is that very charge")
	return nil
}

func chargeID(o client.Order) string {
	if o.Payment == nil {
		return "none"
	}
	return o.Payment.ChargeID
}

// 8. Leases and takeover.
func takeover(ctx context.Context, s *Session) error {
	// Part one: a live owner and its lease, with a client that hangs up.
	a, err := s.newOrder(ctx, "R1")
	if err != nil {
		return err
	}
	k1 := s.key("R2")
	s.send("POST /v1/orders/%s/pay  Idempotency-Key: %s  pm_slow, from a client that hangs up once the intent is PROCESSING", short(a.ID), k1)
	caller, hangUp := context.WithCancel(ctx)
	answered := make(chan error, 1)
	go func() {
		_, err := s.post(caller, "/v1/orders/"+a.ID+"/pay", k1, client.PayRequest{PaymentMethod: "pm_slow"}, 0)
		answered <- err
	}()
	live, err := s.waitForRecord(ctx, k1, "order.pay", 10*time.Second, "PROCESSING")
	hangUp()
	if err != nil {
		return err
	}
	// Its lease as it was when read, not when the checks are made: by
	// then the owner has long finished.
	leaseLeft := time.Duration(-1)
	if live.LeaseExpiresAt != nil {
		leaseLeft = time.Until(*live.LeaseExpiresAt)
	}
	if err := <-answered; err == nil {
		s.got("an answer (the client was expected to hang up first)")
	} else {
		s.got("no answer: the client hung up")
	}
	s.showRecord(live)
	s.note("The service detaches the money phases from the client, so its owner keeps working; waiting…")
	finished, err := s.waitForRecord(ctx, k1, "order.pay", 30*time.Second, "SUCCEEDED")
	if err != nil {
		return err
	}
	s.showRecord(finished)

	// Part two: an intent whose owner gave up, finished by the sweeper.
	s.note("")
	s.note("A live service never leaves PROCESSING behind: every owner either finishes or records FAILED_RETRYABLE")
	s.note("well inside its lease (the channel timeout is shorter). A record stuck in PROCESSING needs a dead process,")
	s.note("which the demo does not kill: TestKilledServiceRecoversPaymentAfterRestart does (docs/concepts.md, §6).")
	s.note("What it can show is the same takeover path: an intent left unfinished with a lease, and nobody retrying it.")
	b, err := s.newOrder(ctx, "R3")
	if err != nil {
		return err
	}
	before, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	k2 := s.key("R4")
	s.send("POST /v1/orders/%s/pay  Idempotency-Key: %s  pm_lost_response, and the client never retries", short(b.ID), k2)
	ans, err := s.post(ctx, "/v1/orders/"+b.ID+"/pay", k2, client.PayRequest{PaymentMethod: "pm_lost_response"}, 0)
	if err != nil {
		return err
	}
	s.got("%s", ans)
	left, err := s.record(ctx, k2, "order.pay")
	if err != nil {
		return err
	}
	s.showRecord(left)
	s.note("waiting for the sweeper (every SWEEP_INTERVAL) to take it over once its lease has run out…")
	start := time.Now()
	swept, err := s.waitForRecord(ctx, k2, "order.pay", s.cfg.SweepWait, "SUCCEEDED")
	if err != nil {
		return err
	}
	s.showRecord(swept)
	s.note("… after %.1fs", time.Since(start).Seconds())
	after, err := s.channelStats(ctx)
	if err != nil {
		return err
	}
	s.note("channel /admin/stats: lookups %d → %d, charges %d → %d", before.Lookups, after.Lookups, before.Charges, after.Charges)
	charges, err := s.chargesFor(ctx, b.ID)
	if err != nil {
		return err
	}
	s.send("client.Pay(%s, pm_lost_response, WithKey(%q))  the client comes back, later", short(b.ID), k2)
	replay, err := s.api.Pay(ctx, b.ID, client.PayRequest{PaymentMethod: "pm_lost_response"}, client.WithKey(k2))
	if err != nil {
		return err
	}
	s.got("%d order %s, charge %s, Replayed=%v", replay.Status, replay.Value.Status, chargeID(replay.Value), replay.Replayed)

	s.check(live.State == "PROCESSING" && live.LeaseToken == 1 && leaseLeft > 0,
		"while the owner works, the record is PROCESSING under lease_token 1 with a lease in the future")
	s.check(finished.Attempts == 1 && finished.LeaseToken == 1,
		"the client hanging up left nothing stuck: the owner finished alone (attempts 1, lease_token 1)")
	s.check(ans.status == http.StatusServiceUnavailable && left.State == "FAILED_RETRYABLE" && left.LeaseToken == 1,
		"the unknown outcome left the intent FAILED_RETRYABLE under lease_token 1, leased until its Retry-After")
	s.check(swept.Attempts == 2 && swept.LeaseToken == 2,
		"the sweeper took it over: attempts 2, lease_token 2 (token 1 can no longer write)")
	s.check(after.Lookups > before.Lookups, "the new owner asked the channel for the real outcome first (lookups +%d)", after.Lookups-before.Lookups)
	s.check(len(charges) == 1 && charges[0].Requests == 1 && chargeID(replay.Value) == charges[0].ID,
		"it found the charge already made and recorded it: 1 charge, POSTed once, now the order's payment")
	s.check(replay.Replayed && replay.Value.Status == client.StatusPaid, "the client's late retry gets the recorded result: PAID, replayed")
	return nil
}
