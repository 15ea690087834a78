package order

// How a payment intent runs. Pay and Cancel move money through the payment
// channel in three phases, so that no database connection is held while the
// channel works and every retry, crash and takeover of the intent converges
// on one movement of money:
//
//	phase 1, one transaction (open):        claim or replay the intent, lock
//	         the order, apply its rule; either the intent ends here or a
//	         pending payment with its stable downstream key is written;
//	phase 2, no transaction  (askChannel):  ask the channel, under that key;
//	phase 3, one transaction (storeReply):  store the reply, fenced by the
//	         lease token; an unknown reply postpones the intent instead.
//
// A retry of an unfinished intent (failed retryably, or its owner's lease
// expired) skips the rule and resumes the payment phase 1 wrote; the
// sweeper (Sweep) does the same for intents nobody retries.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
)

// Pay charges the order total through the payment channel.
func (s *Service) Pay(ctx context.Context, c Caller, orderID string, req PayRequest) (idempotency.Result, error) {
	method := strings.TrimSpace(req.PaymentMethod)
	if err := checkText("payment_method", method, maxSKULength); err != nil {
		return idempotency.Result{}, err
	}
	// A token the channel does not know would only be refused there, after
	// the order had moved to PAYMENT_PENDING: reject it before anything is
	// recorded, so the same key may be sent again with a real one.
	tokens := slices.Concat(payment.Methods, payment.AsyncMethods)
	if !slices.Contains(tokens, method) {
		return idempotency.Result{}, invalid("payment_method", "must be one of the channel's test tokens: %s", strings.Join(tokens, ", "))
	}
	return s.runPaymentIntent(ctx, c, OpPay, orderID, PayRequest{PaymentMethod: method}, func(o *Order) (plan, error) {
		charge, err := o.Pay(method)
		return viaChannel(EventPay, charge), err
	})
}

// Cancel cancels an order. An unpaid order is cancelled in phase 1; a paid
// one is refunded through the channel first and is CANCELLED once the
// refund succeeded.
func (s *Service) Cancel(ctx context.Context, c Caller, orderID string, req CancelRequest) (idempotency.Result, error) {
	n, err := req.normalize()
	if err != nil {
		return idempotency.Result{}, err
	}
	return s.runPaymentIntent(ctx, c, OpCancel, orderID, n, func(o *Order) (plan, error) {
		if !o.HoldsMoney() {
			return withoutChannel(EventCancel), o.Cancel()
		}
		refund, err := o.Refund()
		return viaChannel(EventRefund, refund), err
	})
}

// plan is what an order's rule decided in phase 1: the event it fired and,
// when money must move, the payment the channel is to make.
type plan struct {
	event      Event
	viaChannel bool
	payment    Payment
}

func viaChannel(ev Event, p Payment) plan { return plan{event: ev, viaChannel: true, payment: p} }
func withoutChannel(ev Event) plan        { return plan{event: ev} }

// runPaymentIntent runs c's payment intent op (paymentIntent), letting a
// duplicate of one still in flight wait for its outcome when c asked to
// (awaitFirst).
func (s *Service) runPaymentIntent(ctx context.Context, c Caller, op, orderID string, fields any, rule func(*Order) (plan, error)) (idempotency.Result, error) {
	return s.awaitFirst(ctx, c, c.scope(op), func() (idempotency.Result, error) {
		return s.paymentIntent(ctx, c, op, orderID, fields, rule)
	})
}

// paymentIntent runs the three phases of the intent op on the order
// orderID, with rule deciding what the order does.
func (s *Service) paymentIntent(ctx context.Context, c Caller, op, orderID string, fields any, rule func(*Order) (plan, error)) (res idempotency.Result, err error) {
	id, in, err := c.intentOn(op, orderID, fields)
	if err != nil {
		return idempotency.Result{}, err
	}
	ctx, end := traced(ctx, in)
	defer func() { end(res, err) }()
	defer func() { s.step(ctx, answerStep(in, res, err)) }()
	place := s.channelPlace()
	defer place.release()
	claimed := time.Now() // the lease the claim takes runs from no earlier than this
	opened, err := s.open(ctx, c, id, in, rule, place)
	if err != nil || !opened.awaitsChannel {
		return opened.result, err
	}
	if err := s.Hooks.run(s.Hooks.AfterPhase1); err != nil {
		return idempotency.Result{}, err
	}
	if opened.claim.Resumes() {
		s.observe().Takeover(op, "retry")
	}
	// From here the intent waits for the channel, holding no connection:
	// the door may admit a request with work to do meanwhile (c.Yield).
	// The client may hang up; the money phases still run to the end (or to
	// the shutdown deadline), so the result is recorded and its retry gets
	// the replay. Its place at the channel, held until its reply is
	// stored, bounds what it does from now on.
	c.yield()
	work, cancel := s.detach(ctx)
	defer cancel()
	return s.finishPayment(work, opened.claim.Record, opened.payment, s.howToAsk(opened.claim), claimed)
}

// leaseLapsed reports whether the lease of a claim made at claimed (or
// after) has run out: the process stalled between its claim and its call
// to the channel. The intent may have been taken over meanwhile, and a
// call that late may reach a channel that has forgotten the key (a stall
// as long as the key window is what the model assumes away); so a lapsed
// owner does not call, and gives the intent back (postpone, fenced) for
// its current owner, which asks the channel first when it must.
func (s *Service) leaseLapsed(claimed time.Time) bool {
	return s.Records.Lease > 0 && time.Since(claimed) >= s.Records.Lease
}

// finishPayment finishes the intent of a pending payment: phase 2, then
// phase 3. It is used by the request that started the payment, by a client
// retry, and by the sweeper after a takeover.
func (s *Service) finishPayment(ctx context.Context, rec idempotency.Record, p Payment, how asking, claimed time.Time) (idempotency.Result, error) {
	ctx = steps.Owning(ctx, rec.LeaseToken)
	if s.leaseLapsed(claimed) {
		s.step(ctx, steps.Lapsed{Intent: intentOf(rec), Token: rec.LeaseToken})
		return idempotency.Result{}, s.postpone(ctx, rec, s.Money.RetryAfter)
	}
	reply, err := s.askChannel(payment.Resending(ctx, rec.Attempts-1), p, how)
	if err == nil {
		err = s.Hooks.run(s.Hooks.AfterChannelCall)
	}
	if err != nil {
		return idempotency.Result{}, err
	}
	if reply.verdict == unknown {
		return idempotency.Result{}, s.postpone(ctx, rec, s.askAgainAfter(rec, reply))
	}
	res, err := s.storeReplyPatiently(ctx, rec, p, reply)
	switch {
	case errors.Is(err, idempotency.ErrFenced):
		s.step(ctx, steps.Store{Intent: intentOf(rec), Token: rec.LeaseToken, Fenced: true})
		return idempotency.Result{}, errSuperseded()
	case transientStore(err):
		// The channel answered but the reply could not be stored: the
		// intent is resumable at once, and its retry sends the same key
		// again, which the channel answers from its own record.
		return idempotency.Result{}, s.postpone(ctx, rec, s.Money.RetryAfter)
	}
	return res, err
}

// Phase 1, open: claim or replay the intent and apply the order's rule, in
// one transaction.

// opening is how phase 1 ended: either the intent is answered (result:
// replayed, a final error, or done without the channel), or a pending
// payment awaits the channel and the record stays PROCESSING meanwhile.
type opening struct {
	claim         idempotency.Claim
	awaitsChannel bool
	payment       Payment
	result        idempotency.Result
}

// open is phase 1, in one transaction. An intent that goes on to the
// channel leaves it holding place.
func (s *Service) open(ctx context.Context, c Caller, id uuid.UUID, in idempotency.Intent, rule func(*Order) (plan, error), place *channelPlace) (opened opening, err error) {
	err = database.Transact(ctx, s.DB, func(tx *gorm.DB) (err error) {
		defer func() { s.step(ctx, claimStep(in, opened, err)) }()
		opened = opening{}
		claim, err := s.Records.ClaimOrReplay(tx, in)
		if err != nil {
			return err
		}
		opened.claim = claim
		switch {
		case claim.Replay != nil:
			mark(ctx, "replayed")
			opened.result = *claim.Replay
			return nil
		case claim.Resumes():
			mark(ctx, "taken_over", attribute.String("idempotency.record.resumed_from", string(claim.ResumedFrom)),
				attribute.Int("idempotency.record.attempts", claim.Record.Attempts))
		default:
			mark(ctx, "claimed")
		}
		if claim.Resumes() { // an earlier attempt recorded its payment: resume it
			p, found, err := pendingPayment(tx, in.Scope)
			if err != nil {
				return err
			}
			if found {
				opened.awaitsChannel, opened.payment = true, p
				return place.take()
			}
		}
		res, pending, err := s.applyRule(tx, c, in.Operation, id, rule)
		if err == nil && pending != nil {
			opened.awaitsChannel, opened.payment = true, *pending
			return place.take()
		}
		opened.result, err = s.finish(tx, in, claim.Token(), res, err)
		return err
	})
	return opened, err
}

// applyRule locks the order and applies the intent's rule to it, writing
// the transition and, when money must move, the pending payment with its
// stable downstream key (pending). Without the channel the intent is done:
// res is its result.
func (s *Service) applyRule(tx *gorm.DB, c Caller, op string, id uuid.UUID, rule func(*Order) (plan, error)) (res idempotency.Result, pending *Payment, err error) {
	o, err := lockOrder(tx, c.TenantID, id)
	if err != nil {
		return res, nil, err
	}
	// A payment under this scope means the key moved money before, on this
	// order or another, and its record has since been archived and
	// removed: running it again would be a second movement of money for
	// one key (and the payments' unique scope would stop it anyway).
	if _, ranBefore, err := pendingPayment(tx, idempotency.Scope{TenantID: c.TenantID, Operation: op, Key: c.Key}); err != nil || ranBefore {
		if err == nil {
			err = errKeyRanBefore(op)
		}
		return res, nil, err
	}
	from := o.Status
	pl, err := rule(o)
	if err != nil {
		return res, nil, err
	}
	if !pl.viaChannel {
		if err := saveTransition(tx, o, from, pl.event, op, c.Key); err != nil {
			return res, nil, err
		}
		res, err = done(o)
		return res, nil, err
	}
	p := pl.payment
	if p.ID, err = uuid.NewV7(); err != nil {
		return res, nil, err
	}
	p.OrderID, p.TenantID, p.Status = o.ID, o.TenantID, PaymentPending
	p.Operation, p.IdempotencyKey = op, c.Key
	p.ChannelKey = channelKey(o.TenantID, op, o.ID, c.Key)
	if err := insertPayment(tx, &p); err != nil {
		return res, nil, err
	}
	// Before the transition, so that its outbox event shows the order with
	// the pending payment, as GET would right after.
	o.payments = append(o.payments, p)
	return res, &p, saveTransition(tx, o, from, pl.event, op, c.Key)
}

// channelKey derives the downstream idempotency key of one intent from the
// tenant, the operation, the order and the client's key. It is stored on the
// payment row and never recomputed differently: a new key per retry would
// let the channel charge twice.
func channelKey(tenantID, op string, orderID uuid.UUID, key string) string {
	sum := sha256.Sum256([]byte(tenantID + "\x00" + op + "\x00" + orderID.String() + "\x00" + key))
	return "os_" + hex.EncodeToString(sum[:20])
}

// Phase 2, ask: the channel, under the payment's key, holding no
// transaction.

// asking is how phase 2 asks the channel about a payment.
type asking int

const (
	// send sends the request under the payment's key.
	send asking = iota
	// lookUpThenSend first asks what the channel holds under the key, and
	// sends the request (same key) only when it holds nothing: a takeover
	// from an owner that died, or a key the channel may have forgotten.
	lookUpThenSend
	// lookUpOnly asks what the channel holds under the key and never sends
	// anything: a late verdict (payment_later.go).
	lookUpOnly
)

// howToAsk is how phase 2 asks the channel about the payment of a claimed
// intent. An owner that died mid-flight left no word of the channel's
// answer, so its successor asks the channel first; an intent that failed
// retryably sends the same request under the same key again, which the
// channel absorbs for as long as it remembers the key (checked at the
// call: atTheCall, keywindow.go).
func (s *Service) howToAsk(claim idempotency.Claim) asking {
	if claim.ResumedFrom == idempotency.Processing {
		return lookUpThenSend
	}
	return send
}

// askChannel is phase 2: it asks the channel about p as how says. An error
// is one the channel's reply cannot be classified past (a hook's); the
// channel's own failures are an unknown reply.
func (s *Service) askChannel(ctx context.Context, p Payment, how asking) (res channelReply, err error) {
	// The deadline is fixed first and the key window judged against it;
	// however long the request then takes to leave, it cannot outlive the
	// deadline it was judged by (keywindow.go).
	deadline := time.Now().Add(s.Money.ChannelTimeout)
	how = s.atTheCall(p, how, deadline)
	s.step(ctx, steps.Decide{Intent: paymentIntentOf(p), Token: steps.OwnerOf(ctx), ChannelKey: p.ChannelKey, How: how.String(), Deadline: deadline, FirstAttempt: p.CreatedAt, KeyWindow: s.Money.ChannelKeyWindow})
	defer func() { s.step(ctx, replyStep(ctx, p, res, err)) }()
	if err := s.Hooks.run(s.Hooks.BeforeChannelCall); err != nil {
		return channelReply{}, err
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	start := time.Now()
	var replayed bool
	switch p.Kind {
	case KindCharge:
		var ch payment.Charge
		ch, replayed, err = lookupOrSend(how,
			func() (payment.Charge, error) { return s.Channel.LookupCharge(ctx, p.ChannelKey) },
			func() (payment.Result[payment.Charge], error) {
				return s.Channel.Charge(ctx, p.ChannelKey, payment.ChargeRequest{Amount: p.Amount, Currency: p.Currency,
					Reference: p.OrderID.String(), PaymentMethod: deref(p.PaymentMethod)})
			})
		res = chargeReply(ch, replayed)
	case KindRefund:
		var rf payment.Refund
		rf, replayed, err = lookupOrSend(how,
			func() (payment.Refund, error) { return s.Channel.LookupRefund(ctx, p.ChannelKey) },
			func() (payment.Result[payment.Refund], error) {
				return s.Channel.Refund(ctx, p.ChannelKey, payment.RefundRequest{ChargeID: deref(p.RefundOf), Amount: p.Amount})
			})
		res = refundReply(rf, replayed)
	}
	s.observe().ChannelCall(ctx, string(p.Kind), time.Since(start), callOutcome(err, res), res.replayed)
	switch {
	case errors.Is(err, payment.ErrRejected):
		s.logger().WarnContext(ctx, "payment channel refused the request", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelReply{verdict: refused, reason: refusalReason(err)}, nil
	case err != nil:
		// Verdict unknown: keep the intent resumable and let a retry or the
		// sweeper ask again under the same key.
		s.logger().WarnContext(ctx, "payment channel gave no definitive reply", "kind", p.Kind, "channel_key", p.ChannelKey, "err", err)
		return channelReply{verdict: unknown}, nil
	case res.verdict == unknown:
		s.logger().WarnContext(ctx, "payment channel answered a status that proves no outcome", "kind", p.Kind, "channel_key", p.ChannelKey, "status", res.reason)
	}
	return res, nil
}

// lookupOrSend asks the channel for what it holds under the key unless how
// is send, and sends the request (same key) when how allows and the
// channel holds nothing.
func lookupOrSend[T any](how asking, lookup func() (T, error), post func() (payment.Result[T], error)) (v T, replayed bool, err error) {
	if how != send {
		v, err := lookup()
		if how == lookUpOnly || !errors.Is(err, payment.ErrNotFound) {
			return v, false, err
		}
	}
	r, err := post()
	return r.Value, r.Replayed, err
}

// Phase 3, store: the channel's reply, fenced by the lease token, in one
// transaction; or, when the reply is unknown, postpone the intent.

// storeReplyPatiently is phase 3, tried again for up to a channel timeout while
// the database is briefly unavailable (a failover, a dropped connection):
// the channel's reply is known and worth storing now rather than after a
// retry or a lease. A commit whose acknowledgement was lost but that
// landed is fenced on the next try (the record is no longer PROCESSING),
// and the client's retry gets it replayed.
func (s *Service) storeReplyPatiently(ctx context.Context, rec idempotency.Record, p Payment, reply channelReply) (idempotency.Result, error) {
	deadline := time.Now().Add(s.Money.ChannelTimeout)
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		res, err := s.storeReply(ctx, rec, p, reply)
		if !transientStore(err) || time.Now().Add(pause).After(deadline) {
			return res, err
		}
		s.logger().WarnContext(ctx, "storing the channel's reply failed; trying again", "channel_key", p.ChannelKey, "err", err)
		select {
		case <-ctx.Done():
			return res, err
		case <-time.After(pause):
		}
	}
}

// transientStore reports a database failure worth trying again: the
// server is unreachable, failing over, or a lock is held too long.
func transientStore(err error) bool {
	return database.IsUnavailable(err) || database.IsLockTimeout(err)
}

// storeReply is phase 3: one transaction that stores the channel's reply
// on the payment, moves the order and completes the intent, fenced by the
// lease token. A decline or refusal is the intent's failed result; a charge
// the channel took on to finish later is its accepted result (202), the
// order waiting in PAYMENT_PENDING.
func (s *Service) storeReply(ctx context.Context, rec idempotency.Record, p Payment, reply channelReply) (result idempotency.Result, err error) {
	err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		// The fence first: a superseded owner must not even try the
		// transition, which its successor may already have made.
		if err := s.Records.Hold(tx, rec.Scope(), rec.LeaseToken); err != nil {
			return err
		}
		o, stored, err := moveOnReply(tx, p, reply)
		if err != nil {
			return err
		}
		if result, err = intentResult(o, p, reply, stored); err != nil {
			return err
		}
		if err := s.Hooks.run(s.Hooks.BeforeReplyCommit); err != nil {
			return err
		}
		err = s.Records.Complete(tx, rec.Scope(), rec.LeaseToken, result)
		s.step(ctx, storeStep(rec, p, o, result, err))
		return err
	})
	return result, err
}

// moveOnReply stores reply on the pending payment p and makes the order's
// transition for it, in tx; o is the order as it then is. A reply that is
// still pending only notes the channel's id of the charge. stored is false
// when the payment was no longer pending: its verdict came in another way
// first (a webhook, the sweeper's lookup: payment_later.go), and o shows it.
func moveOnReply(tx *gorm.DB, p Payment, reply channelReply) (o *Order, stored bool, err error) {
	if o, err = lockOrder(tx, p.TenantID, p.OrderID); err != nil {
		return nil, false, err
	}
	from := o.Status
	at, err := storePaymentReply(tx, p.ID, reply.paymentStatus(), reply.channelRef())
	if errors.Is(err, errNotPending) {
		return o, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	ev, err := o.applyReply(p, reply, at)
	if err != nil || ev == "" {
		return o, err == nil, err
	}
	return o, true, saveTransition(tx, o, from, ev, p.Operation, p.IdempotencyKey)
}

// intentResult is what a payment intent answers once its reply is stored:
// the order (200), the order still waiting for the verdict (202), or the
// failure (a decline, a refusal). When the verdict came in another way
// first, the intent answers with that verdict, as the order shows it.
func intentResult(o *Order, p Payment, reply channelReply, stored bool) (idempotency.Result, error) {
	if !stored {
		reply = storedReply(o.payment(p.ID))
	}
	if fail := reply.failure(p.Kind, o.ID.String()); fail != nil {
		return idempotency.Failed(o.ID.String(), fail), nil
	}
	if reply.verdict == pending {
		return accepted(o)
	}
	return done(o)
}

// postpone records that the verdict is unknown: FAILED_RETRYABLE with the
// lease released until after, when the sweeper resumes the intent if no
// client has. The error it returns tells the client to send the same key
// again (at once, or after after).
func (s *Service) postpone(ctx context.Context, rec idempotency.Record, after time.Duration) error {
	err := database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		err := s.Records.Fail(tx, rec.Scope(), rec.LeaseToken, after)
		s.step(ctx, postponeStep(rec, err))
		return err
	})
	switch {
	case errors.Is(err, idempotency.ErrFenced):
		return errSuperseded()
	case err != nil:
		return err
	}
	return errPostponed(after)
}

// askAgainAfter is how long an intent whose verdict is unknown is left
// before it is asked about again. With no reply from the channel (down,
// an answer lost) a moment may mend it: RetryAfter. A reply in a status
// that proves no outcome (a refund still pending, a status this service
// does not know) is only heard again if asked at once: the wait doubles
// with each attempt of the intent, up to maxAskAgainAfter.
func (s *Service) askAgainAfter(rec idempotency.Record, reply channelReply) time.Duration {
	if !reply.provesNothing() {
		return s.Money.RetryAfter
	}
	doublings := min(max(rec.Attempts-1, 0), 16)
	return max(s.Money.RetryAfter, min(s.Money.RetryAfter<<doublings, maxAskAgainAfter))
}

// maxAskAgainAfter bounds the wait between two askings of an intent the
// channel answers without an outcome: a refund may stay pending for days,
// and an operator who fixed the cause should not wait long for the sweeper.
const maxAskAgainAfter = 5 * time.Minute
