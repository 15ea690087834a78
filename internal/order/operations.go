package order

import "strings"

// Operation names, the middle part of every idempotency scope. This is the
// one list of what a caller can ask of an order exactly once: each door
// names an operation by its Verb (the last segment of its route, the last
// token of its command's subject), and the metrics, the retention policy
// and the doors derive their lists from Operations.
const (
	OpCreate  = "order.create"
	OpPay     = "order.pay"
	OpCancel  = "order.cancel"
	OpShip    = "order.ship"
	OpDeliver = "order.deliver"
)

// Operations lists every idempotent order operation, in the order of an
// order's life.
var Operations = []string{OpCreate, OpPay, OpCancel, OpShip, OpDeliver}

// MoneyOperations move money through the payment channel: their records are
// archived before they are deleted. A cancel may refund.
var MoneyOperations = []string{OpPay, OpCancel}

// Verb is how the doors name operation: its last word, "pay" for
// order.pay.
func Verb(operation string) string { return strings.TrimPrefix(operation, "order.") }

// Verbs are the verbs of Operations, in their order.
func Verbs() []string {
	verbs := make([]string, len(Operations))
	for i, op := range Operations {
		verbs[i] = Verb(op)
	}
	return verbs
}

// OperationNamed is the operation whose verb is verb, and false when no
// operation has it.
func OperationNamed(verb string) (string, bool) {
	for _, op := range Operations {
		if Verb(op) == verb {
			return op, true
		}
	}
	return "", false
}

// OnOrder reports whether operation acts on an order that exists (every
// one but create): a door names the order, the route by its path, a
// command by its order_id.
func OnOrder(operation string) bool { return operation != OpCreate }
