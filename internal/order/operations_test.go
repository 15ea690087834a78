package order_test

import (
	"slices"
	"testing"

	"github.com/orderservice/orderservice/internal/order"
)

// Each operation has one verb, the name every door gives it, and the verb
// leads back to the operation.
func TestEachOperationIsNamedByItsVerb(t *testing.T) {
	if got, want := order.Verbs(), []string{"create", "pay", "cancel", "ship", "deliver"}; !slices.Equal(got, want) {
		t.Fatalf("verbs = %v, want %v", got, want)
	}
	for _, op := range order.Operations {
		if named, ok := order.OperationNamed(order.Verb(op)); !ok || named != op {
			t.Errorf("OperationNamed(%q) = %q, %v, want %q", order.Verb(op), named, ok, op)
		}
	}
	for _, verb := range []string{"", "refund", "order.pay", "PAY"} {
		if op, ok := order.OperationNamed(verb); ok {
			t.Errorf("OperationNamed(%q) = %q, want none", verb, op)
		}
	}
	if order.OnOrder(order.OpCreate) || !order.OnOrder(order.OpPay) {
		t.Error("create makes an order; every other operation acts on one")
	}
}
