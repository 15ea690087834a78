package order

// How an intent runs exactly once, top to bottom. A use case that changes
// something (Create, Ship and Deliver in service.go; Pay and Cancel in
// payment_intent.go) decides only its rule; the rest is here, the same for
// all of them, in the order a request meets it:
//
//  1. Who asks names the intent: the Caller (tenant and Idempotency-Key)
//     and the operation make its scope, the request its fingerprint
//     (intent, intentOn). Beside the Caller rides what its door lends
//     (Door): a give-back of what the door holds, and a wait.
//  2. A duplicate of an intent still in flight is answered 409, or waits
//     for the first attempt's outcome when its door lends a wait
//     (awaitFirst).
//  3. An intent of one transaction (create, ship, deliver) is replayed,
//     or run and recorded in that one transaction, its record definitive
//     at once (once, runOnce, insertRecordFirst, insertRecordLast).
//  4. A payment cannot be one transaction, as the channel works between:
//     it runs in three phases (paymentIntent). Phase 1 (open) claims or
//     replays the intent, applies the rule and writes the payment; phase 2
//     asks the channel holding no connection (finishPayment, askChannel);
//     phase 3 stores the reply, fenced by the lease token (storeReply), or
//     postpones an unknown one (postpone).
//  5. Whoever takes an unfinished payment over (a retry in open, the
//     sweeper in sweep.go's resume) picks it up at the recovery point its
//     record stores, written by the phase that reached it.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// Caller is who asks: the tenant, as the API key proved it, and the
// Idempotency-Key that names this intent. Beside it rides what the door
// that carried the request lends the use case while it runs (Door); the
// message door lends nothing, so its callers are the two names alone.
type Caller struct {
	TenantID string
	Key      string
	Door
}

// Door is what a transport lends a use case for one request: a way to
// give back what it holds while the request only waits, and how long a
// duplicate may wait for its first attempt. The zero Door lends nothing:
// no give-back, and a duplicate in flight is answered 409 at once.
type Door struct {
	// Yield, when set, gives back what the door holds for the caller only
	// while the service works for it (the HTTP door's admission slot). A
	// use case calls it when it goes on to wait on something other than
	// the service, holding no database connection: a pay or cancel for the
	// payment channel, or a duplicate for its first attempt's outcome. It
	// may be called more than once; the first counts.
	Yield func()
	// Wait is how long a duplicate of an intent whose first attempt is
	// still in flight waits for that attempt's outcome (HTTP's Prefer:
	// wait), capped by Deps.MaxWait. Zero: it is answered 409 at once.
	Wait time.Duration
	// Waited, when set, is told how long the caller was let wait when its
	// answer came after such a wait (HTTP's Preference-Applied).
	Waited func(time.Duration)
}

// scope names the intent op of c's key.
func (c Caller) scope(op string) idempotency.Scope {
	return idempotency.Scope{TenantID: c.TenantID, Operation: op, Key: c.Key}
}

// yield calls d.Yield, if any.
func (d Door) yield() {
	if d.Yield != nil {
		d.Yield()
	}
}

func (c Caller) intent(op, resource string, fields any) (idempotency.Intent, error) {
	fp, err := idempotency.Fingerprint(op, resource, fields)
	return idempotency.Intent{
		Scope:       c.scope(op),
		Fingerprint: fp,
		ResourceID:  resource,
	}, err
}

// intentOn is the intent of an operation on the order named in the path.
// A malformed id names no order, as an unknown one does, and gets the same
// definitive answer the same way: the intent is on the nil id, which no
// order has, so it is recorded as order_not_found and replayed.
func (c Caller) intentOn(op, orderID string, fields any) (uuid.UUID, idempotency.Intent, error) {
	id, err := parseID(orderID)
	if err != nil {
		id = uuid.Nil
	}
	in, err := c.intent(op, id.String(), fields)
	return id, in, err
}

// once runs c's single-transaction intent in (runOnce), letting a duplicate
// of one still in flight wait for its outcome when c asked to (awaitFirst).
func (s *Service) once(ctx context.Context, c Caller, in idempotency.Intent, exec func(tx *gorm.DB) (idempotency.Result, error)) (idempotency.Result, error) {
	return s.awaitFirst(ctx, c, in.Scope, func() (idempotency.Result, error) { return s.runOnce(ctx, in, exec) })
}

// A duplicate that arrives while its intent's first attempt is still in
// flight is answered 409 request_in_progress at once, unless its caller
// asked to wait (Door.Wait, HTTP's Prefer: wait). It then waits, holding
// no connection, until the first attempt's outcome is stored, and asks
// again, which replays it.

// awaitFirst runs an idempotent use case (the intent scope) and, when its first attempt is
// still in flight and the caller asked to wait, waits for that attempt's
// outcome, then runs it again. The wait ends with the 409 when it runs out
// (c.Wait, capped by MaxWait), when the caller hangs up, or when the
// service begins to stop (Stopping).
func (s *Service) awaitFirst(ctx context.Context, c Caller, scope idempotency.Scope, run func() (idempotency.Result, error)) (idempotency.Result, error) {
	res, err := run()
	wait := min(c.Wait, s.MaxWait)
	if wait <= 0 || s.Waiter == nil || problem.CodeOf(err) != problem.RequestInProgress {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	defer cancelOn(s.Stopping, cancel)()
	c.yield() // it waits holding neither the door's slot nor a connection
	for problem.CodeOf(err) == problem.RequestInProgress && s.Waiter.Await(ctx, s.DB, scope) {
		res, err = run()
	}
	if err == nil && c.Waited != nil {
		c.Waited(wait)
	}
	return res, err
}

// runOnce runs a single-transaction operation exactly once per intent:
//
//  1. answer with the stored result, found by one plain read, if there is one;
//  2. otherwise run exec, which executes the business write and records its
//     result (insertRecordFirst, insertRecordLast), in ONE transaction, so a crash
//     leaves both or neither;
//  3. if a concurrent duplicate recorded the intent first, roll ours back
//     and go to 1, which now finds the duplicate's result.
//
// The record is written once, SUCCEEDED or FAILED_FINAL
// (idempotency.Store.Insert): PROCESSING would be seen by nobody. Any error
// but a final one rolls everything back and records nothing, so the same
// key may simply be sent again.
func (s *Service) runOnce(ctx context.Context, in idempotency.Intent, exec func(tx *gorm.DB) (idempotency.Result, error)) (res idempotency.Result, err error) {
	ctx, end := traced(ctx, in)
	defer func() { end(res, err) }()
	for race := 1; ; race++ {
		replay, err := s.Records.Replay(s.DB.WithContext(ctx), in)
		if err != nil {
			return idempotency.Result{}, err
		}
		if replay != nil {
			mark(ctx, "replayed")
			return *replay, nil
		}
		err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
			var err error
			res, err = exec(tx)
			return err
		})
		switch {
		case !errors.Is(err, idempotency.ErrTaken):
			if err == nil {
				mark(ctx, "inserted", attribute.String("idempotency.record.state", string(stateAfter(res, nil))))
			}
			return res, err
		case race == maxRecordRaces: // the key is held by a record the read cannot replay
			return idempotency.Result{}, errSuperseded()
		}
		mark(ctx, "lost_race")
	}
}

// maxRecordRaces bounds how often once goes back to the read after losing
// the record's insert: once is enough, for the winner's result is committed.
// Only a key held by a record the read cannot replay (removed in between,
// or not definitive: never written by a one-transaction intent) loses every
// round; that ends in 409.
const maxRecordRaces = 3

// insertRecordFirst is how an intent whose result is known before it writes
// anything runs, inside once's transaction (a create: the new order's id,
// times and representation are chosen before its first statement): its
// record goes first, so a concurrent duplicate waits at the record's key
// before it does any work, then write runs.
func (s *Service) insertRecordFirst(tx *gorm.DB, in idempotency.Intent, res idempotency.Result, write func() error) (idempotency.Result, error) {
	if err := s.Records.Insert(tx, in, res); err != nil {
		return idempotency.Result{}, err
	}
	return res, write()
}

// insertRecordLast is how an intent whose result is only known once it has run
// runs (a transition, which reads the order it changes under its row lock):
// exec runs, then its record stores what it ended with, success or final
// error (see resultOf). A final error must be returned before exec writes
// anything.
func (s *Service) insertRecordLast(in idempotency.Intent, exec func(tx *gorm.DB) (idempotency.Result, error)) func(tx *gorm.DB) (idempotency.Result, error) {
	return func(tx *gorm.DB) (idempotency.Result, error) {
		executed, err := exec(tx)
		res, err := resultOf(in, executed, err)
		if err != nil {
			return idempotency.Result{}, err
		}
		return res, s.Records.Insert(tx, in, res)
	}
}

// resultOf is the result an intent's execution ended with: its success, or
// the final error it ended with, as a failed result to store and replay.
// Any other error is returned for a rollback.
func resultOf(in idempotency.Intent, res idempotency.Result, err error) (idempotency.Result, error) {
	if err == nil {
		return res, nil
	}
	failure, ok := asFinal(err)
	if !ok {
		return idempotency.Result{}, err
	}
	return idempotency.Failed(in.ResourceID, failure), nil
}

// finish stores the result of a claimed intent on its record, in the
// caller's transaction (see resultOf).
func (s *Service) finish(tx *gorm.DB, in idempotency.Intent, token int64, res idempotency.Result, err error) (idempotency.Result, error) {
	if res, err = resultOf(in, res, err); err != nil {
		return idempotency.Result{}, err
	}
	return res, s.Records.Complete(tx, in.Scope, token, res)
}

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
// Each phase that commits stores on the intent's record the point it
// reached (its recovery point: started, then paymentCreated once phase 1
// committed, finished once phase 3 did). A retry of an unfinished intent
// (failed retryably, or its owner's lease expired) switches on it: at
// paymentCreated it skips the rule and resumes the payment phase 1 wrote;
// the sweeper (Sweep) does the same for intents nobody retries.

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
	defer func() { s.step(ctx, func() steps.Event { return answerStep(in, res, err) }) }()
	slot := s.channelSlot()
	defer slot.release()
	claimed := time.Now() // the lease the claim takes runs from no earlier than this
	opened, err := s.open(ctx, c, id, in, rule, slot)
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
	// the replay. Its slot at the channel, held until its reply is
	// stored, bounds what it does from now on.
	c.yield()
	work, cancel := s.detach(ctx)
	defer cancel()
	return s.finishPayment(work, opened.claim.Record, opened.payment, s.howToAsk(opened.claim), claimed)
}

// Phase 1, open: claim or replay the intent and apply the order's rule, in
// one transaction.

// paymentCreated is a money intent's recovery point once phase 1 has
// committed: its payment is written, with the channel key every attempt
// asks under, and the channel is to be asked (phase 2). open writes it in
// phase 1's transaction; a retry (open) and the sweeper (resume) that find
// it skip the rule and finish that payment.
const paymentCreated idempotency.RecoveryPoint = "payment_created"

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
// channel leaves it holding slot.
func (s *Service) open(ctx context.Context, c Caller, id uuid.UUID, in idempotency.Intent, rule func(*Order) (plan, error), slot *channelSlot) (opened opening, err error) {
	err = s.transact(ctx, func(tx *gorm.DB) (err error) {
		defer func() { s.txStep(tx, func() steps.Event { return claimStep(in, opened, err) }) }()
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
		// Where the intent stands is stored on its record, written with
		// the step that reached it: switch on it.
		switch point := claim.Record.RecoveryPoint; point {
		case paymentCreated: // an earlier attempt committed phase 1: resume at phase 2
			p, err := paymentOf(tx, claim.Record)
			if err != nil {
				return err
			}
			opened.awaitsChannel, opened.payment = true, p
			return slot.take()
		case idempotency.Started: // a new claim, or one whose phase 1 never committed: run it
		default:
			return unknownPoint(claim.Record)
		}
		res, pending, err := s.applyRule(tx, c, in.Operation, id, rule)
		if err == nil && pending != nil {
			opened.awaitsChannel, opened.payment = true, *pending
			if err := slot.take(); err != nil {
				return err
			}
			return s.Records.Advance(tx, in.Scope, claim.Token(), paymentCreated)
		}
		opened.result, err = s.finish(tx, in, claim.Token(), res, err)
		return err
	})
	return opened, err
}

// paymentOf is the payment an intent at paymentCreated wrote in its phase 1.
func paymentOf(db *gorm.DB, rec idempotency.Record) (Payment, error) {
	p, found, err := pendingPayment(db, rec.Scope())
	if err == nil && !found { // phase 1 writes both in one transaction, so this is a bug
		err = fmt.Errorf("order: the %s intent of key %q is at %s but has no payment", rec.Operation, rec.IdempotencyKey, paymentCreated)
	}
	return p, err
}

// unknownPoint refuses to resume an intent at a recovery point this build
// does not know (a newer build's, met while two run side by side): it is
// left to an instance that knows it.
func unknownPoint(rec idempotency.Record) error {
	return fmt.Errorf("order: the %s intent of key %q is at recovery point %q, which this build does not know",
		rec.Operation, rec.IdempotencyKey, rec.RecoveryPoint)
}

// Phase 2, ask: then store. How the claim asks the channel is decided
// here, from how it was claimed; askChannel (payment_intent.go) asks.

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

// finishPayment finishes the intent of a pending payment: phase 2, then
// phase 3. It is used by the request that started the payment, by a client
// retry, and by the sweeper after a takeover.
func (s *Service) finishPayment(ctx context.Context, rec idempotency.Record, p Payment, how asking, claimed time.Time) (idempotency.Result, error) {
	ctx = steps.Owning(ctx, rec.LeaseToken)
	if s.leaseLapsed(claimed) {
		s.step(ctx, func() steps.Event { return steps.Lapsed{Intent: intentOf(rec), Token: rec.LeaseToken} })
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
		s.step(ctx, func() steps.Event { return steps.Store{Intent: intentOf(rec), Token: rec.LeaseToken, Fenced: true} })
		return idempotency.Result{}, errSuperseded()
	case transientStore(err):
		// The channel answered but the reply could not be stored: the
		// intent is resumable at once, and its retry sends the same key
		// again, which the channel answers from its own record.
		return idempotency.Result{}, s.postpone(ctx, rec, s.Money.RetryAfter)
	}
	return res, err
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

// storeReply is phase 3: one transaction that stores the channel's reply
// on the payment, moves the order and completes the intent, fenced by the
// lease token. A decline or refusal is the intent's failed result; a charge
// the channel took on to finish later is its accepted result (202), the
// order waiting in PAYMENT_PENDING.
func (s *Service) storeReply(ctx context.Context, rec idempotency.Record, p Payment, reply channelReply) (result idempotency.Result, err error) {
	err = s.transact(ctx, func(tx *gorm.DB) error {
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
		s.txStep(tx, func() steps.Event { return storeStep(rec, p, o, result, err) })
		return err
	})
	return result, err
}

// postpone records that the verdict is unknown: FAILED_RETRYABLE with the
// lease released until after, when the sweeper resumes the intent if no
// client has. The error it returns tells the client to send the same key
// again (at once, or after after).
func (s *Service) postpone(ctx context.Context, rec idempotency.Record, after time.Duration) error {
	err := s.transact(ctx, func(tx *gorm.DB) error {
		err := s.Records.Fail(tx, rec.Scope(), rec.LeaseToken, after)
		if err == nil {
			s.txStep(tx, func() steps.Event { return postponeStep(rec, false) })
		}
		return err
	})
	switch {
	case errors.Is(err, idempotency.ErrFenced):
		s.step(ctx, func() steps.Event { return postponeStep(rec, true) })
		return errSuperseded()
	case err != nil:
		return err
	}
	return errPostponed(after)
}
