package order

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/orderservice/orderservice/internal/problem"
)

// The expectations below are written out by hand, not derived from the
// lifecycle table, so that a change to the table fails here until someone
// decides it was meant.

// allStatuses and allEvents are every status and event the lifecycle knows.
var (
	allStatuses = []Status{
		StatusCreated, StatusPaymentPending, StatusPaid, StatusPaymentFailed,
		StatusRefundPending, StatusShipped, StatusDelivered, StatusCancelled,
	}
	allEvents = []Event{
		EventCreate, EventPay, EventPaymentSucceeded, EventPaymentFailed,
		EventShip, EventDeliver, EventCancel, EventRefund, EventRefundSucceeded, EventRefundFailed,
	}
)

// wantMoves is the contract's state machine: from -> event -> to. Every
// (status, event) pair missing here must be forbidden.
var wantMoves = map[Status]map[Event]Status{
	StatusCreated: {
		EventPay:    StatusPaymentPending,
		EventCancel: StatusCancelled,
	},
	StatusPaymentPending: {
		EventPaymentSucceeded: StatusPaid,
		EventPaymentFailed:    StatusPaymentFailed,
	},
	StatusPaid: {
		EventShip:   StatusShipped,
		EventRefund: StatusRefundPending,
	},
	StatusPaymentFailed: {
		EventPay:    StatusPaymentPending,
		EventCancel: StatusCancelled,
	},
	StatusRefundPending: {
		EventRefundSucceeded: StatusCancelled,
		EventRefundFailed:    StatusPaid,
	},
	StatusShipped: {
		EventDeliver: StatusDelivered,
	},
	StatusDelivered: {},
	StatusCancelled: {},
}

func TestLifecycleTableAllowsExactlyTheContractsMoves(t *testing.T) {
	allowedPairs := 0
	for _, from := range allStatuses {
		for _, ev := range allEvents {
			to, allowed := wantMoves[from][ev]
			if !allowed {
				t.Run(fmt.Sprintf("%s on a %s order is forbidden as invalid_transition", ev, from), func(t *testing.T) {
					if tableAllows(from, ev) {
						t.Fatalf("the table allows %s from %s, want not", ev, from)
					}
					o := &Order{Status: from, TotalAmount: 2500}
					err := o.fire(ev)
					wantForbidden(t, err, from, ev)
					if o.Status != from {
						t.Errorf("a forbidden %s moved the order from %s to %s", ev, from, o.Status)
					}
				})
				continue
			}
			allowedPairs++
			t.Run(fmt.Sprintf("%s on a %s order moves it to %s", ev, from, to), func(t *testing.T) {
				if !tableAllows(from, ev) {
					t.Fatalf("the table does not allow %s from %s, want it to", ev, from)
				}
				o := &Order{Status: from, TotalAmount: 2500}
				if err := o.fire(ev); err != nil {
					t.Fatalf("fire(%s) from %s: %v", ev, from, err)
				}
				if o.Status != to {
					t.Errorf("fire(%s) from %s left status %s, want %s", ev, from, o.Status, to)
				}
			})
		}
	}
	if allowedPairs != 11 {
		t.Errorf("the contract has 11 transitions, the expectations list %d", allowedPairs)
	}
}

func TestLifecycleTableNamesOnlyKnownStatusesAndEvents(t *testing.T) {
	t.Run("Statuses lists every status, in lifecycle order", func(t *testing.T) {
		if !slices.Equal(Statuses, allStatuses) {
			t.Errorf("Statuses = %v, want %v", Statuses, allStatuses)
		}
	})
	t.Run("every event and status in the table is one the test knows", func(t *testing.T) {
		// A new event or status must come with its expectations above.
		for _, e := range lifecycle {
			if !slices.Contains(allEvents, Event(e.Name)) {
				t.Errorf("table event %q is not in allEvents", e.Name)
			}
			for _, s := range append(slices.Clone(e.Src), e.Dst) {
				if !slices.Contains(allStatuses, Status(s)) {
					t.Errorf("table event %q names unknown status %q", e.Name, s)
				}
			}
		}
	})
	t.Run("create is not a transition of any status", func(t *testing.T) {
		for _, s := range allStatuses {
			if tableAllows(s, EventCreate) {
				t.Errorf("create is allowed from %s", s)
			}
		}
	})
}

func TestPayGuardRefusesAnOrderWithNothingToCharge(t *testing.T) {
	o := &Order{Status: StatusCreated, TotalAmount: 0}
	err := o.fire(EventPay)
	wantForbidden(t, err, StatusCreated, EventPay)
	var p *problem.Error
	if errors.As(err, &p) && p.Detail != "A CREATED order cannot be paid: the order total is zero, so there is nothing to charge." {
		t.Errorf("detail = %q, want the guard's reason", p.Detail)
	}
	if o.Status != StatusCreated {
		t.Errorf("a guarded pay moved the order to %s", o.Status)
	}
}

// tableAllows reports whether the lifecycle table lists ev from status s
// (guards aside).
func tableAllows(s Status, ev Event) bool {
	for _, e := range lifecycle {
		if e.Name == string(ev) && slices.Contains(e.Src, string(s)) {
			return true
		}
	}
	return false
}

// wantForbidden checks err is invalid_transition naming from and ev.
func wantForbidden(t *testing.T, err error, from Status, ev Event) {
	t.Helper()
	var p *problem.Error
	if !errors.As(err, &p) {
		t.Fatalf("fire(%s) from %s = %v, want a problem", ev, from, err)
	}
	// Its status, 409, is httpapi's: TestEveryCodeHasTheContractsStatus.
	if p.Code != CodeInvalidTransition {
		t.Errorf("code = %s, want invalid_transition", p.Code)
	}
	if got := p.Extensions["current_status"]; got != from {
		t.Errorf("current_status = %v, want %s", got, from)
	}
	if got := p.Extensions["event"]; got != ev {
		t.Errorf("event = %v, want %s", got, ev)
	}
}

// TestRefusalsSayWhatTheOrderCanDoInstead: invalid_transition's detail is
// a sentence a client can act on, generated from the lifecycle table.
func TestRefusalsSayWhatTheOrderCanDoInstead(t *testing.T) {
	for _, c := range []struct {
		from Status
		ev   Event
		want string
	}{
		{StatusPaid, EventPay, "A PAID order cannot be paid; it can be shipped or cancelled."},
		{StatusCancelled, EventShip, "A CANCELLED order cannot be shipped; nothing more can happen to it."},
		{StatusShipped, EventCancel, "A SHIPPED order cannot be cancelled; it can be delivered."},
		{StatusCreated, EventShip, "A CREATED order cannot be shipped; it can be paid or cancelled."},
		{StatusPaymentPending, EventCancel, "A PAYMENT_PENDING order cannot be cancelled; it waits for the payment channel's verdict."},
		{StatusDelivered, EventPay, "A DELIVERED order cannot be paid; nothing more can happen to it."},
	} {
		err := (&Order{Status: c.from, TotalAmount: 100}).fire(c.ev)
		wantForbidden(t, err, c.from, c.ev)
		var p *problem.Error
		if errors.As(err, &p) && p.Detail != c.want {
			t.Errorf("%s from %s: detail %q, want %q", c.ev, c.from, p.Detail, c.want)
		}
	}
}
