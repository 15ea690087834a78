package order

// Payments that finish later. The channel may take a charge on as pending
// (3-D Secure, a bank transfer, a wallet) and reach its verdict afterwards;
// the intent has answered 202 meanwhile, and the order waits in
// PAYMENT_PENDING. The verdict reaches the service by one of two ways,
// whichever comes first: an event the channel delivers by webhook
// (ReceiveChannelEvent), or the sweeper asking the channel by the charge's
// key (SweepPending, through ResolvePending).
//
// An event is a hint, not the truth: it may arrive late, twice, or before
// the one it follows. So the channel is asked for the payment as it is
// now, and the transaction that stores its verdict finds the payment still
// pending under the order's row lock, or does nothing: one transition and
// one outbox event, however many ways and times the verdict arrives.

import (
	"context"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order/steps"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/problem"
)

// Receipt says what came of a payment's verdict arriving late, by a
// channel event or by the sweeper's lookup. These are the words of the
// webhook's answer, its metric and the inbox (each calls them "outcome").
type Receipt string

// What came of a late verdict.
const (
	// ReceiptApplied: the payment was pending and its verdict is now
	// stored, the order moved.
	ReceiptApplied Receipt = "applied"
	// ReceiptDuplicate: the channel delivered this event before (its
	// webhook-id is in the inbox); nothing was done.
	ReceiptDuplicate Receipt = "duplicate"
	// ReceiptIgnored: nothing to move: the event tells no payment's
	// verdict, the payment is unknown, its verdict was stored already, or
	// the channel still has it pending.
	ReceiptIgnored Receipt = "ignored"
)

// tellsVerdict are the channel's event types that tell a payment's verdict.
var tellsVerdict = map[string]bool{
	payment.EventChargeSucceeded: true, payment.EventChargeDeclined: true,
	payment.EventRefundSucceeded: true, payment.EventRefundFailed: true,
}

// ReceiveChannelEvent acts once on an event the payment channel delivered
// by webhook: webhookID names the delivery, eventType its event and
// channelKey the charge or refund it is about ("" for none). The transport
// verified the delivery; the event is still only a hint: one that tells a
// payment's verdict has the channel asked for it (see ResolvePending), any
// other is ignored. The delivery is noted in the inbox in the transaction
// of its effect, so both commit or neither, and a delivery noted before is
// a duplicate that does nothing. An error is transient: nothing was
// recorded, and the channel delivers the event again.
func (s *Service) ReceiveChannelEvent(ctx context.Context, webhookID, eventType, channelKey string) (Receipt, error) {
	// A cheap read spares a duplicate the channel's lookup; the note, below,
	// still decides.
	seen, err := s.Inbox.Seen(s.DB.WithContext(ctx), webhookID)
	switch {
	case err != nil:
		return "", err
	case seen:
		return ReceiptDuplicate, nil
	}
	var late lateReply
	if tellsVerdict[eventType] && channelKey != "" {
		if late, err = s.askLate(ctx, channelKey); err != nil {
			return "", err
		}
	}
	var receipt Receipt
	err = s.transact(ctx, func(tx *gorm.DB) error {
		var err error
		if receipt, err = late.store(tx); err != nil {
			return err
		}
		err = s.Inbox.Note(tx, webhookID, eventType, string(receipt))
		s.txStep(tx, func() steps.Event { return lateStep(late, receipt, err) })
		return err
	})
	if errors.Is(err, idempotency.ErrDelivered) {
		return ReceiptDuplicate, nil
	}
	return receipt, err
}

// ResolvePending learns the verdict on the payment the channel holds under
// channelKey and, when it is final and the payment still pending, stores
// it and moves the order (ReceiptApplied; else ReceiptIgnored). An error
// is transient (the database or the
// channel is unavailable): nothing was recorded, and the verdict may be
// resolved again.
//
// A payment whose intent is still running is left to it: its phase 3, its
// retry or the sweeper's takeover asks the channel and stores the verdict
// itself, so a late verdict never races the intent that asked for it.
func (s *Service) ResolvePending(ctx context.Context, channelKey string) (Receipt, error) {
	late, err := s.askLate(ctx, channelKey)
	if err != nil {
		return "", err
	}
	var receipt Receipt
	err = s.transact(ctx, func(tx *gorm.DB) error {
		var err error
		receipt, err = late.store(tx)
		s.txStep(tx, func() steps.Event { return lateStep(late, receipt, err) })
		return err
	})
	return receipt, err
}

// lateReply is what the channel now says of a payment that waits for its
// verdict. Its zero value, or a reply that is still pending, stores
// nothing.
type lateReply struct {
	payment Payment
	reply   channelReply
}

// askLate asks the channel about the payment under channelKey when only
// the channel can tell its verdict now (waitingForChannel); otherwise there
// is nothing to ask, and nothing to store.
func (s *Service) askLate(ctx context.Context, channelKey string) (lateReply, error) {
	p, waiting, err := s.waitingForChannel(s.DB.WithContext(ctx), channelKey)
	if err != nil || !waiting {
		return lateReply{}, err
	}
	reply, err := s.askChannel(ctx, p, lookUpOnly)
	switch {
	case err != nil:
		return lateReply{}, err
	case reply.verdict == unknown:
		return lateReply{}, errChannelUnknown
	}
	return lateReply{payment: p, reply: reply}, nil
}

// store stores a final verdict on the payment, if it is still pending, and
// moves the order, in tx.
func (l lateReply) store(tx *gorm.DB) (Receipt, error) {
	if !l.reply.final() {
		return ReceiptIgnored, nil
	}
	_, stored, err := moveOnReply(tx, l.payment, l.reply)
	switch {
	case err != nil:
		return "", err
	case !stored:
		return ReceiptIgnored, nil
	}
	return ReceiptApplied, nil
}

// errChannelUnknown: the channel could not say what it holds under the
// key; the verdict is resolved on a later try (a webhook is delivered
// again, the sweeper asks again).
var errChannelUnknown = &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: time.Second,
	Detail: "The payment channel could not be asked for the payment's outcome; nothing was recorded, deliver it again."}

// waitingForChannel finds the payment under channelKey and reports whether
// only the channel can tell its verdict now: it is pending and its intent
// has ended. An intent still running (PROCESSING, or FAILED_RETRYABLE
// waiting for its retry or the sweeper) stores the verdict itself.
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
