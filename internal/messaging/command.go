package messaging

import (
	"bytes"
	"context"
	stdjson "encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/nats-io/nats.go"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/decode"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
)

// Orders is what the consumer needs of the order use cases: the very
// methods httpapi calls, so one intent runs the same code whichever door
// it came in by. *order.Service is one.
type Orders interface {
	Create(context.Context, order.Caller, order.CreateRequest) (idempotency.Result, error)
	Pay(context.Context, order.Caller, string, order.PayRequest) (idempotency.Result, error)
	Cancel(context.Context, order.Caller, string, order.CancelRequest) (idempotency.Result, error)
	Ship(context.Context, order.Caller, string, order.ShipRequest) (idempotency.Result, error)
	Deliver(context.Context, order.Caller, string, order.DeliverRequest) (idempotency.Result, error)
	// IntentState is the state of the intent's record, "" when it has none.
	IntentState(ctx context.Context, c order.Caller, operation string) (idempotency.State, error)
}

// useCase runs one operation's use case on a decoded body.
type useCase struct {
	onOrder bool
	run     func(ctx context.Context, s Orders, c order.Caller, orderID string, body []byte) (idempotency.Result, error)
}

// useCases maps a subject's <op> to its use case, as routes.go maps paths.
var useCases = map[string]useCase{
	"create": {false, decoded(func(s Orders) func(context.Context, order.Caller, string, order.CreateRequest) (idempotency.Result, error) {
		return func(ctx context.Context, c order.Caller, _ string, r order.CreateRequest) (idempotency.Result, error) {
			return s.Create(ctx, c, r)
		}
	})},
	"pay": {true, decoded(func(s Orders) func(context.Context, order.Caller, string, order.PayRequest) (idempotency.Result, error) {
		return s.Pay
	})},
	"cancel": {true, decoded(func(s Orders) func(context.Context, order.Caller, string, order.CancelRequest) (idempotency.Result, error) {
		return s.Cancel
	})},
	"ship": {true, decoded(func(s Orders) func(context.Context, order.Caller, string, order.ShipRequest) (idempotency.Result, error) {
		return s.Ship
	})},
	"deliver": {true, decoded(func(s Orders) func(context.Context, order.Caller, string, order.DeliverRequest) (idempotency.Result, error) {
		return s.Deliver
	})},
}

// decoded adapts a use case to a raw body, read with the decoder HTTP uses.
func decoded[Req any](pick func(Orders) func(context.Context, order.Caller, string, Req) (idempotency.Result, error)) func(context.Context, Orders, order.Caller, string, []byte) (idempotency.Result, error) {
	return func(ctx context.Context, s Orders, c order.Caller, orderID string, body []byte) (idempotency.Result, error) {
		var req Req
		if err := decode.JSON(body, &req); err != nil {
			return idempotency.Result{}, err
		}
		return pick(s)(ctx, c, orderID, req)
	}
}

// command is a message read far enough to run: who, what, which intent.
type command struct {
	tenant, op, key, orderID string
	body                     []byte
}

// opLabel is the op for metrics: one of Ops, or "unknown".
func opLabel(subject string) string {
	parts := strings.Split(subject, ".")
	if len(parts) == 4 && slices.Contains(Ops, parts[3]) {
		return parts[3]
	}
	return "unknown"
}

// parseCommand reads a command message, or says why it cannot be run at
// all (the reason it is dead-lettered at once): a subject that is not
// orders.commands.<tenant>.<op> with a known tenant and op, a missing or
// malformed Idempotency-Key, a Nats-Msg-Id (see msgIDRefused), a body
// that is not JSON, or a command on an order without its order_id. A body
// that is JSON but not a valid request is not malformed: it gets the 400
// HTTP would send, as a result.
func parseCommand(subject string, header nats.Header, data []byte, tenants map[string]string) (command, string) {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 || parts[0]+"."+parts[1]+"." != CommandPrefix {
		return command{}, fmt.Sprintf("subject %q is not orders.commands.<tenant>.<op>", subject)
	}
	cmd := command{tenant: parts[2], op: parts[3], body: data}
	if _, ok := tenants[cmd.tenant]; !ok {
		return cmd, fmt.Sprintf("unknown tenant %q", cmd.tenant)
	}
	uc, ok := useCases[cmd.op]
	if !ok {
		return cmd, fmt.Sprintf("unknown operation %q (want one of %s)", cmd.op, strings.Join(Ops, ", "))
	}
	key, err := idempotency.ParseKeyHeader(headerValues(header, HeaderKey))
	if err != nil {
		return cmd, "Idempotency-Key: " + answer.Problem(err).Detail
	}
	cmd.key = key
	if len(headerValues(header, HeaderMsgID)) > 0 {
		return cmd, msgIDRefused
	}
	if len(bytes.TrimSpace(data)) > 0 && !stdjson.Valid(data) {
		return cmd, "body is not JSON"
	}
	if uc.onOrder {
		id, rest, reason := splitOrderID(data)
		if reason != "" {
			return cmd, reason
		}
		cmd.orderID, cmd.body = id, rest
	}
	return cmd, ""
}

// msgIDRefused is why a command may not carry a Nats-Msg-Id. JetStream
// drops a message whose id it saw in the stream's duplicate window, and
// that window spans all of ORDER_COMMANDS: one tenant's id would drop
// another tenant's command before the service sees it, and the broker
// cannot scope ids by subject. Refused, a tenant learns it at its first
// command; and a tenant that sends none never loses a command to another's.
const msgIDRefused = "Nats-Msg-Id: a command may not carry one, since JetStream deduplicates it across every tenant's commands; " +
	"its Idempotency-Key already makes sending it again safe"

// headerValues is every value of the header name, whatever the case its
// publisher wrote it in: NATS header names are case-sensitive, HTTP's are
// not, and one intent must be read the same whichever door it used.
func headerValues(h nats.Header, name string) []string {
	var out []string
	for k, vs := range h {
		if strings.EqualFold(k, name) {
			out = append(out, vs...)
		}
	}
	return out
}

// splitOrderID takes the top-level "order_id" out of a command body on an
// order, and returns the rest, which is exactly the HTTP request body, for
// the strict decoder. Every other member keeps its bytes, so the decoder
// answers the same as it does over HTTP.
func splitOrderID(body []byte) (orderID string, rest []byte, reason string) {
	const missing = "order_id: a command on an order needs its order_id, a string"
	dec := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return "", nil, missing
	}
	out, found := []byte{'{'}, 0
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return "", nil, "body is not JSON"
		}
		name := tok.String() // before the next read voids the token
		value, err := dec.ReadValue()
		if err != nil {
			return "", nil, "body is not JSON"
		}
		if name == "order_id" {
			found++
			if value.Kind() != '"' {
				return "", nil, missing
			}
			var id string
			if err := stdjson.Unmarshal(value, &id); err != nil {
				return "", nil, missing
			}
			orderID = id
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out, _ = jsontext.AppendQuote(out, name)
		out = append(out, ':')
		out = append(out, value...)
	}
	switch found {
	case 0:
		return "", nil, missing
	case 1:
		return orderID, append(out, '}'), ""
	}
	return "", nil, "order_id: appears more than once"
}
