package order

// Recording the protocol's steps (internal/order/steps), for tests that
// replay a run against the model (tools/tracecheck). Each step is one line
// where the code takes it, s.step(ctx, func() steps.Event { … }); in
// production Deps.Steps is nil, a step costs one nil check and its event
// is never built. The helpers below turn what the code holds at that line
// into the step's event, and return nil when there is no step to record
// (the transaction failed).
//
// A step taken in a transaction (a claim, phase 3's store, a postpone, a
// late verdict) is recorded inside it, before it commits, so that steps
// whose transactions conflict are recorded in the order the database
// serialized them; the transaction runs through transact and its step
// through txStep, so the step stands only if the transaction commits
// (steps.Attempt): not when its commit fails, nor twice when it is rerun.

import (
	"context"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order/steps"
)

// step tells the recorder the event ev makes, when there is a recorder
// and an event: without one (production), ev is never called, so nothing
// of the event is built.
func (s *Service) step(ctx context.Context, ev func() steps.Event) {
	if s.Steps == nil {
		return
	}
	if e := ev(); e != nil {
		s.Steps.Record(ctx, e)
	}
}

// transact runs fn in one transaction (database.Transact). With a
// recorder, each attempt of it runs under a context steps.Attempt marks,
// which tx carries: a step recorded in it (txStep) stands only if that
// attempt commits. Without one (production), it is database.Transact.
func (s *Service) transact(ctx context.Context, fn func(tx *gorm.DB) error) error {
	var attempt database.Attempt // nil: unmarked
	if s.Steps != nil {
		attempt = steps.Attempt
	}
	return database.TransactAttempts(ctx, s.DB, attempt, fn)
}

// txStep is a step taken in the transaction tx, which transact runs: it
// keeps its place in the run, and stands only if tx commits.
func (s *Service) txStep(tx *gorm.DB, ev func() steps.Event) {
	if s.Steps != nil {
		s.step(tx.Statement.Context, ev)
	}
}

func intentOf(rec idempotency.Record) steps.Intent {
	return steps.Intent{Order: deref(rec.ResourceID), Op: rec.Operation, Key: rec.IdempotencyKey}
}

func paymentIntentOf(p Payment) steps.Intent {
	return steps.Intent{Order: p.OrderID.String(), Op: p.Operation, Key: p.IdempotencyKey}
}

// answerOf names a result as the trace spells answers: done, accepted, or
// failed:<code>.
func answerOf(res idempotency.Result) string {
	if res.Outcome == idempotency.OutcomeFailed && res.Failure != nil {
		return "failed:" + string(res.Failure.Code)
	}
	return string(res.Outcome)
}

// claimStep is phase 1's claim, once its transaction is about to commit.
func claimStep(in idempotency.Intent, opened opening, err error) steps.Event {
	if err != nil {
		return nil
	}
	ev := steps.Claim{Intent: steps.Intent{Order: in.ResourceID, Op: in.Scope.Operation, Key: in.Scope.Key},
		Kind: "new", By: "client", Token: opened.claim.Token(), Point: string(opened.claim.Record.RecoveryPoint)}
	switch {
	case opened.claim.Replay != nil:
		ev.Kind, ev.Token = "replay", 0
	case opened.claim.ResumedFrom == idempotency.Processing:
		ev.Kind = "takeover"
	case opened.claim.Resumes():
		ev.Kind = "resume"
	}
	if !opened.awaitsChannel {
		ev.Answer = answerOf(opened.result)
	}
	return ev
}

// swept records the sweeper's claims of a batch, in its transaction tx.
func (s *Service) swept(tx *gorm.DB, claimed []idempotency.Record) {
	for _, rec := range claimed {
		s.txStep(tx, func() steps.Event {
			return steps.Claim{Intent: intentOf(rec), Kind: "sweep", By: "sweeper", Token: rec.LeaseToken, Point: string(rec.RecoveryPoint)}
		})
	}
}

// CleanupSteps is a hook for idempotency.Store.Removed that tells r, as a
// step (steps.Cleanup), each record the cleanup removes: the idempotency
// package does not know the steps, so whoever makes the store wires it
// (the order tests do), with Store.Attempt set to steps.Attempt so that a
// removal stands only if its batch commits. Nil when r is nil: the cleanup
// then builds nothing.
func CleanupSteps(r steps.Recorder) func(context.Context, idempotency.Removed) {
	if r == nil {
		return nil
	}
	return func(ctx context.Context, gone idempotency.Removed) {
		r.Record(ctx, steps.Cleanup{Intent: steps.Intent{Order: gone.ResourceID, Op: gone.Operation, Key: gone.Key}, State: string(gone.State)})
	}
}

// postponeStep is the owner's postpone: done, or fenced (its transaction
// rolled back, so it is recorded after it, like a fenced store).
func postponeStep(rec idempotency.Record, fenced bool) steps.Event {
	return steps.Postpone{Intent: intentOf(rec), Token: rec.LeaseToken, Fenced: fenced}
}

// storeStep is phase 3's store, once its transaction is about to commit.
func storeStep(rec idempotency.Record, p Payment, o *Order, result idempotency.Result, err error) steps.Event {
	if err != nil || o == nil {
		return nil
	}
	ev := steps.Store{Intent: intentOf(rec), Token: rec.LeaseToken, Answer: answerOf(result),
		PaymentBefore: string(p.Status), OrderAfter: string(o.Status)}
	if now := o.payment(p.ID); now != nil {
		ev.PaymentAfter = string(now.Status)
	}
	return ev
}

// lateStep is a late verdict's transaction: nil when nothing was asked.
func lateStep(l lateReply, receipt Receipt, err error) steps.Event {
	if err != nil || l.payment.ChannelKey == "" {
		return nil
	}
	return steps.Late{Intent: paymentIntentOf(l.payment), Verdict: l.reply.verdict.String(), Applied: receipt == ReceiptApplied}
}

// replyStep is what phase 2 made of the channel's answer.
func replyStep(ctx context.Context, p Payment, res channelReply, err error) steps.Event {
	if err != nil {
		return nil
	}
	return steps.Reply{Intent: paymentIntentOf(p), Token: steps.OwnerOf(ctx), Verdict: res.verdict.String(), Replayed: res.replayed}
}

// answerStep is the answer a client of the intent was given.
func answerStep(in idempotency.Intent, res idempotency.Result, err error) steps.Event {
	a := answerOf(res)
	switch {
	case err != nil:
		a = "error"
	case res.Outcome == "":
		return nil // a panic: no answer was given
	}
	return steps.Answer{Intent: steps.Intent{Order: in.ResourceID, Op: in.Scope.Operation, Key: in.Scope.Key}, Answer: a}
}

func (v verdict) String() string {
	switch v {
	case moved:
		return "moved"
	case declined:
		return "declined"
	case refused:
		return "refused"
	case pending:
		return "pending"
	}
	return "unknown"
}

func (a asking) String() string {
	switch a {
	case lookUpThenSend:
		return "lookup"
	case lookUpOnly:
		return "lookup_only"
	}
	return "send"
}
