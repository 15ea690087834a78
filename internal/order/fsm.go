package order

import (
	"context"
	"errors"

	"github.com/looplab/fsm"
)

// Status is an order's stored status. The row in the database is the truth;
// a state machine is built from it for one transition and thrown away.
type Status string

// The statuses of an order.
const (
	StatusCreated        Status = "CREATED"
	StatusPaymentPending Status = "PAYMENT_PENDING"
	StatusPaid           Status = "PAID"
	StatusPaymentFailed  Status = "PAYMENT_FAILED"
	StatusRefundPending  Status = "REFUND_PENDING"
	StatusShipped        Status = "SHIPPED"
	StatusDelivered      Status = "DELIVERED"
	StatusCancelled      Status = "CANCELLED"
)

// Statuses lists every status, in lifecycle order.
var Statuses = []Status{
	StatusCreated, StatusPaymentPending, StatusPaid, StatusPaymentFailed,
	StatusRefundPending, StatusShipped, StatusDelivered, StatusCancelled,
}

// Event names a transition.
type Event string

// The events of the order lifecycle. Create is not a transition: it brings
// the order into being in StatusCreated.
const (
	EventCreate           Event = "create"
	EventPay              Event = "pay"
	EventPaymentSucceeded Event = "payment_succeeded"
	EventPaymentFailed    Event = "payment_failed"
	EventShip             Event = "ship"
	EventDeliver          Event = "deliver"
	EventCancel           Event = "cancel"
	EventRefund           Event = "refund"
	EventRefundSucceeded  Event = "refund_succeeded"
	EventRefundFailed     Event = "refund_failed"
)

// lifecycle is the whole order state machine, declared once. Idempotency
// stops identical requests; this table stops different but illegal ones:
// PAID has no pay event (it cannot be charged again) and CANCELLED has no
// ship event (it cannot ship).
var lifecycle = fsm.Events{
	// PAYMENT_PENDING lasts while the channel works, and, for a charge it
	// took on to finish later, until its verdict arrives (webhook or
	// sweeper): only that verdict leaves it. A cancel meanwhile is forbidden,
	// for the money may be moving; cancel once the order is PAID (refund)
	// or PAYMENT_FAILED.
	{Name: string(EventPay), Src: []string{string(StatusCreated), string(StatusPaymentFailed)}, Dst: string(StatusPaymentPending)},
	{Name: string(EventPaymentSucceeded), Src: []string{string(StatusPaymentPending)}, Dst: string(StatusPaid)},
	{Name: string(EventPaymentFailed), Src: []string{string(StatusPaymentPending)}, Dst: string(StatusPaymentFailed)},
	{Name: string(EventShip), Src: []string{string(StatusPaid)}, Dst: string(StatusShipped)},
	{Name: string(EventDeliver), Src: []string{string(StatusShipped)}, Dst: string(StatusDelivered)},
	{Name: string(EventCancel), Src: []string{string(StatusCreated), string(StatusPaymentFailed)}, Dst: string(StatusCancelled)},
	// A paid order is refunded before it counts as cancelled; while the
	// refund is in flight nothing else (ship, a second cancel) may happen.
	{Name: string(EventRefund), Src: []string{string(StatusPaid)}, Dst: string(StatusRefundPending)},
	{Name: string(EventRefundSucceeded), Src: []string{string(StatusRefundPending)}, Dst: string(StatusCancelled)},
	// A refund the channel refuses leaves the money where it is: the order
	// is paid again, and may ship or be cancelled with a new key.
	{Name: string(EventRefundFailed), Src: []string{string(StatusRefundPending)}, Dst: string(StatusPaid)},
}

// errNothingToCharge is the pay guard's reason: a free order has no payment.
var errNothingToCharge = errors.New("the order total is zero, so there is nothing to charge")

// machine builds a throwaway state machine positioned at o's stored status.
// Guards live in before_ callbacks and only read the order: no I/O here.
func machine(o *Order) *fsm.FSM {
	return fsm.NewFSM(string(o.Status), lifecycle, fsm.Callbacks{
		"before_" + string(EventPay): func(_ context.Context, e *fsm.Event) {
			if o.TotalAmount <= 0 {
				e.Cancel(errNothingToCharge)
			}
		},
	})
}

// fire applies ev to o, or returns invalid_transition, a final error,
// naming the current status and the forbidden event. On success o.Status
// is the new status.
func (o *Order) fire(ev Event) error {
	m := machine(o)
	if err := m.Event(context.Background(), string(ev)); err != nil {
		var canceled fsm.CanceledError
		if errors.As(err, &canceled) && canceled.Err != nil {
			return errTransition(o.Status, ev, canceled.Err)
		}
		return errTransition(o.Status, ev, nil)
	}
	o.Status = Status(m.Current())
	return nil
}

// Diagram renders the lifecycle table as a Mermaid state diagram. A test
// compares it with the diagram in the docs so the two cannot drift.
func Diagram() string {
	out, _ := fsm.VisualizeForMermaidWithGraphType(machine(&Order{Status: StatusCreated}), fsm.StateDiagram)
	return out
}
