package messaging

import (
	"bytes"
	"context"
	stdjson "encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/nats-io/nats.go"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/decode"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/problem"
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

// runUseCase reads cmd's body with the decoder HTTP uses and runs its
// operation's use case on it: to a command what routes.go is to a request.
func runUseCase(ctx context.Context, s Orders, c order.Caller, cmd command) (idempotency.Result, error) {
	switch cmd.operation {
	case order.OpCreate:
		return withBody(cmd.body, func(r order.CreateRequest) (idempotency.Result, error) { return s.Create(ctx, c, r) })
	case order.OpPay:
		return withBody(cmd.body, func(r order.PayRequest) (idempotency.Result, error) { return s.Pay(ctx, c, cmd.orderID, r) })
	case order.OpCancel:
		return withBody(cmd.body, func(r order.CancelRequest) (idempotency.Result, error) { return s.Cancel(ctx, c, cmd.orderID, r) })
	case order.OpShip:
		return withBody(cmd.body, func(r order.ShipRequest) (idempotency.Result, error) { return s.Ship(ctx, c, cmd.orderID, r) })
	case order.OpDeliver:
		return withBody(cmd.body, func(r order.DeliverRequest) (idempotency.Result, error) { return s.Deliver(ctx, c, cmd.orderID, r) })
	}
	// parseSubject admits only order.Operations, each of which has its case.
	return idempotency.Result{}, fmt.Errorf("messaging: no use case runs %q", cmd.operation)
}

// withBody decodes body into a request, as HTTP decodes a request's body,
// and runs the use case on it. A body that is not a valid request is the
// decoder's 400, a definitive answer, as over HTTP.
func withBody[Req any](body []byte, useCase func(Req) (idempotency.Result, error)) (idempotency.Result, error) {
	var req Req
	if err := decode.JSON(body, &req); err != nil {
		return idempotency.Result{}, err
	}
	return useCase(req)
}

// command is a message read far enough to run: who, what, which intent.
// tenant and op are set only once the subject named a known tenant and a
// known operation: every subject published for the command is built from
// them (ResultSubject, dlqSubject), never from the subject as it came. op
// is the subject's last token, operation the order operation it names.
type command struct {
	tenant, op, operation, key, orderID string
	body                                []byte
}

// opLabel is the op for metrics: one of Ops, or "unknown".
func (cmd command) opLabel() string {
	if cmd.op == "" {
		return "unknown"
	}
	return cmd.op
}

// MaxTenantLength bounds a tenant's name. The name is a token of every
// subject the service publishes for the tenant (its results and events)
// and its NATS user name: 64 bytes keep the longest of those subjects, and
// the protocol line that carries it, far under the broker's 4,096-byte
// control line, which a longer line would make the broker close the
// service's connection for.
const MaxTenantLength = 64

// CheckTenant says why name cannot be a tenant's: it must be one subject
// token (IsToken) of at most MaxTenantLength bytes.
func CheckTenant(name string) error {
	if !IsToken(name) {
		return fmt.Errorf("tenant %s must be letters, digits, '-' and '_' only: it is a NATS subject token and user name", quoteBounded(name))
	}
	if len(name) > MaxTenantLength {
		return fmt.Errorf("tenant %s is %d bytes, longer than %d: it is a token of every subject published for it", quoteBounded(name), len(name), MaxTenantLength)
	}
	return nil
}

// parseSubject reads a command's subject, orders.commands.<tenant>.<op>,
// before any part of it is used: tenant must be a known one and op one of
// Ops. A subject that is not is refused, and tenant is still returned
// when it named a known one, so the tenant can be told why. A subject may
// be as long as the broker's control line allows (about 4 KB): the
// refusal quotes it bounded.
func parseSubject(subject string, known func(tenant string) bool) (tenant, op string, refusal *problem.Error) {
	rest, ok := strings.CutPrefix(subject, CommandPrefix)
	name, op, _ := strings.Cut(rest, ".")
	if !ok {
		return "", "", subjectRefused("subject %s is not orders.commands.<tenant>.<op>", quoteBounded(subject))
	}
	if !known(name) {
		return "", "", subjectRefused("unknown tenant %s in subject %s", quoteBounded(name), quoteBounded(subject))
	}
	switch {
	case strings.Contains(op, "."):
		return name, "", subjectRefused("subject %s is not orders.commands.<tenant>.<op>: one token follows the tenant", quoteBounded(subject))
	case !slices.Contains(Ops, op):
		return name, "", subjectRefused("unknown operation %s (want one of %s)", quoteBounded(op), strings.Join(Ops, ", "))
	}
	return name, op, nil
}

func subjectRefused(format string, args ...any) *problem.Error {
	return problem.Errorf(problem.InvalidRequest, format, args...).With("field", "subject")
}

// maxShown is how much of a subject, or of a name read from one, the
// service keeps or shows (in a refusal, a log, a dead letter's
// Dead-Letter-Subject): enough to recognise it, never the 4 KB a subject
// may be.
const maxShown = 256

// quoteBounded quotes s, cut to maxShown bytes and saying so.
func quoteBounded(s string) string {
	if len(s) <= maxShown {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:maxShown]), len(s))
}

// parseCommand reads a command message, or says why it is refused for its
// form, as the problem HTTP answers the same fault with: a subject that
// parseSubject refuses, a missing, repeated or malformed Idempotency-Key,
// a Nats-Msg-Id (see msgIDRefused), a body larger than HTTP accepts or
// that is not JSON, or a command on an order without its order_id. A
// refused command is answered with the problem and dead-lettered at once.
// A body that is JSON but not a valid request is not refused here: the
// use case answers it with the 400 HTTP would send, as a definitive result.
func parseCommand(subject string, header nats.Header, data []byte, tenants map[string]string) (command, *problem.Error) {
	tenant, op, refusal := parseSubject(subject, func(t string) bool { _, ok := tenants[t]; return ok })
	cmd := command{tenant: tenant, op: op, body: data}
	if refusal != nil {
		return cmd, refusal
	}
	cmd.operation, _ = order.OperationNamed(op)
	key, err := idempotency.ParseKeyHeader(headerValues(header, HeaderKey))
	if err != nil {
		return cmd, answer.Problem(err)
	}
	cmd.key = key
	if len(headerValues(header, HeaderMsgID)) > 0 {
		return cmd, problem.Errorf(problem.InvalidRequest, "%s", msgIDRefused).With("field", HeaderMsgID)
	}
	if len(data) > decode.MaxBody {
		return cmd, answer.Problem(decode.TooLarge())
	}
	if len(bytes.TrimSpace(data)) > 0 && !stdjson.Valid(data) {
		// The decoder every door shares names the fault, as HTTP's 400 does.
		if err := decode.JSON(data, new(jsontext.Value)); err != nil {
			return cmd, answer.Problem(err)
		}
		return cmd, answer.Problem(decode.InvalidBody("body", "is not valid JSON"))
	}
	if order.OnOrder(cmd.operation) {
		id, rest, err := splitOrderID(data)
		if err != nil {
			return cmd, answer.Problem(err)
		}
		cmd.orderID, cmd.body = id, rest
	}
	return cmd, nil
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
func splitOrderID(body []byte) (orderID string, rest []byte, err error) {
	missing := decode.InvalidBody("order_id", "is required: a command on an order names it, as a string")
	notJSON := decode.InvalidBody("body", "is not valid JSON")
	dec := jsontext.NewDecoder(bytes.NewReader(body), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return "", nil, missing
	}
	out, found := []byte{'{'}, 0
	for dec.PeekKind() != '}' {
		tok, err := dec.ReadToken()
		if err != nil {
			return "", nil, notJSON
		}
		name := tok.String() // before the next read voids the token
		value, err := dec.ReadValue()
		if err != nil {
			return "", nil, notJSON
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
		return orderID, append(out, '}'), nil
	}
	return "", nil, decode.InvalidBody("order_id", "appears more than once")
}
