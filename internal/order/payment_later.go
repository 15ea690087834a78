package order

// Payments that finish later. The channel may take a charge on as pending
// (3-D Secure, a bank transfer, a wallet) and learn its outcome afterwards;
// the intent has answered 202 meanwhile, and the order waits in
// PAYMENT_PENDING. The outcome reaches the service by one of two ways,
// whichever comes first: the channel's webhook (httpapi's receiver, which
// notes the delivery in the webhook inbox), or the sweeper asking the
// channel by the charge's key (SweepPending). Both come here.
//
// An event is a hint, not the truth: it may arrive late, twice, or before
// the one it follows. So the channel is asked for the payment as it is
// now, and the transaction that stores its outcome finds the payment still
// pending under the order's row lock, or does nothing: one transition and
// one outbox event, however many ways and times the outcome arrives.

import (
	"context"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/problem"
)

// Late says what came of a late outcome.
type Late string

// What came of a late outcome.
const (
	// LateApplied: the payment was pending and its outcome is now stored,
	// the order moved.
	LateApplied Late = "applied"
	// LateIgnored: nothing to move: the payment is unknown, its outcome was
	// stored already, or the channel still has it pending.
	LateIgnored Late = "ignored"
)

// Note is called inside the transaction that applies (or ignores) a late
// outcome, so that whatever brought it is recorded with its effect or not
// at all: the webhook receiver's inbox row. An error rolls everything back.
type Note func(tx *gorm.DB, late Late) error

// ResolvePending learns the outcome of the payment the channel holds under
// channelKey and, when it is final and the payment still pending, stores
// it and moves the order. note, when set, runs in the same transaction.
// An error is transient (the database or the channel is unavailable):
// nothing was recorded, and the outcome may be resolved again.
//
// A payment whose intent is still running is left to it: its phase 3, its
// retry or the sweeper's takeover asks the channel and stores the outcome
// itself, so a late outcome never races the intent that asked for it.
func (s *Service) ResolvePending(ctx context.Context, channelKey string, note Note) (Late, error) {
	p, waiting, err := s.waitingForChannel(s.DB.WithContext(ctx), channelKey)
	if err != nil {
		return "", err
	}
	reply := channelReply{verdict: pending}
	if waiting {
		if reply, err = s.askChannel(ctx, p, lookUpOnly); err != nil {
			return "", err
		}
		if reply.verdict == unknown {
			return "", errChannelUnknown
		}
	}
	late := LateIgnored
	err = database.Transact(ctx, s.DB, func(tx *gorm.DB) error {
		late = LateIgnored
		if reply.verdict != pending {
			_, stored, err := moveOnReply(tx, p, reply)
			if err != nil {
				return err
			}
			if stored {
				late = LateApplied
			}
		}
		if note == nil {
			return nil
		}
		return note(tx, late)
	})
	return late, err
}

// errChannelUnknown: the channel could not say what it holds under the
// key; the outcome is resolved on a later try (a webhook is delivered
// again, the sweeper asks again).
var errChannelUnknown = &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: time.Second,
	Detail: "The payment channel could not be asked for the payment's outcome; nothing was recorded, deliver it again."}

// waitingForChannel finds the payment under channelKey and reports whether
// only the channel can tell its outcome now: it is pending and its intent
// has ended. An intent still running (PROCESSING, or FAILED_RETRYABLE
// waiting for its retry or the sweeper) stores the outcome itself.
func (s *Service) waitingForChannel(db *gorm.DB, channelKey string) (Payment, bool, error) {
	p, found, err := paymentByChannelKey(db, channelKey)
	if err != nil || !found || p.Status != PaymentPending {
		return p, false, err
	}
	rec, err := s.Records.Get(db, idempotency.Scope{TenantID: p.TenantID, Operation: p.Operation, Key: p.IdempotencyKey})
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
	case err != nil || !rec.State.Definitive():
		return p, false, err
	}
	// Read again once the intent is known to have ended: its last
	// transaction stored the payment's reply with the record, so what is
	// still pending now is pending at the channel too, not a reply that was
	// being stored as the payment was first read.
	p, found, err = paymentByChannelKey(db, channelKey)
	return p, found && p.Status == PaymentPending, err
}

// SweepPending asks the channel about up to batch payments still pending
// whose intent has ended, each at most once per PendingCheckEvery, and
// stores the outcomes that are final: a webhook that never comes leaves no
// order waiting. It returns how many it resolved.
func (s *Service) SweepPending(ctx context.Context, batch int) (int, error) {
	every := s.Money.PendingCheckEvery
	if every <= 0 {
		every = time.Minute
	}
	due, err := pendingAfterTheirIntent(s.DB.WithContext(ctx), time.Now().Add(-every), batch)
	if err != nil {
		return 0, err
	}
	resolved := 0
	for _, p := range due {
		late, err := s.ResolvePending(ctx, p.ChannelKey, nil)
		switch {
		case err != nil && err != errChannelUnknown: // the database failed: the next sweep
			return resolved, err
		case late == LateApplied:
			resolved++
		default: // still pending, or the channel could not say: ask again later
			if err := touchPending(s.DB.WithContext(ctx), p.ID); err != nil {
				return resolved, err
			}
		}
	}
	return resolved, nil
}
