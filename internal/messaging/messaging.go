// Package messaging is the service's second door: commands arrive on NATS
// JetStream (orders.commands.<tenant>.<op>), run through the same order use
// cases and idempotency records as HTTP, and their outcomes leave on
// orders.results.<tenant>.<op>. A command that keeps failing transiently,
// or cannot be read at all, is moved to a dead-letter stream that an
// operator replays by hand. Order events leave through the transactional
// outbox, published by a relay on orders.events.<tenant>.<event>.
//
// The broker is a replay source: JetStream redelivers a command that was
// not acknowledged, and its stream's max_age is how long it may do so. The
// records must outlive that window, which CheckRetention enforces at start.
package messaging

import "github.com/orderservice/orderservice/internal/order"

// The streams the service uses, and creates when they are missing.
const (
	// CommandsStream holds commands; its max_age is the message redelivery window.
	CommandsStream = "ORDER_COMMANDS"
	// DLQStream holds dead-lettered commands until an operator replays them.
	DLQStream = "ORDER_COMMANDS_DLQ"
	// ResultsStream keeps the published results, so a reader may come late.
	ResultsStream = "ORDER_RESULTS"
	// EventsStream holds the order events the outbox relay publishes.
	EventsStream = "ORDER_EVENTS"
)

// Subject prefixes; a tenant's credentials may only publish commands under
// its own orders.commands.<tenant>. prefix.
const (
	CommandPrefix = "orders.commands."
	ResultPrefix  = "orders.results."
	EventPrefix   = "orders.events."
	DLQPrefix     = "orders.dlq."
)

// Headers of commands, results and dead letters.
const (
	HeaderKey         = "Idempotency-Key"
	HeaderStatus      = "Status"
	HeaderReplayed    = "Idempotent-Replayed"
	HeaderLocation    = "Location"
	HeaderContentType = "Content-Type"
	HeaderMsgID       = "Nats-Msg-Id"
	// HeaderReason says why a command was dead-lettered.
	HeaderReason = "Dead-Letter-Reason"
	// HeaderDLSubject is the subject the command was published on, where
	// `orderservice dlq replay` sends it again.
	HeaderDLSubject = "Dead-Letter-Subject"
	// HeaderDLDeliveries is how often the command had been delivered.
	HeaderDLDeliveries = "Dead-Letter-Deliveries"
	// HeaderDLSequence is the command's sequence in ORDER_COMMANDS.
	HeaderDLSequence = "Dead-Letter-Sequence"
	// HeaderFirstPublished is when the command was first published (RFC
	// 3339), carried by its dead letter and by the replay of that: how old
	// the intent may be, which a replay does not reset.
	HeaderFirstPublished = "Orderservice-First-Published"
	// HeaderDLSubjectTruncated is on a dead letter whose subject was longer
	// than maxKeptSubject: its length in bytes, Dead-Letter-Subject then
	// holding only the first maxKeptSubject of them.
	HeaderDLSubjectTruncated = "Dead-Letter-Subject-Truncated"
	// HeaderDLBodySize and HeaderDLBodyDigest are on a dead letter stored
	// without its body (too large for the DLQ): the body's length in bytes
	// and its SHA-256, as RFC 9530's Content-Digest writes it.
	HeaderDLBodySize   = "Dead-Letter-Body-Size"
	HeaderDLBodyDigest = "Dead-Letter-Body-Digest"
)

// Malformed stands for the operation of a command whose subject named
// none: its tenant's answer is on orders.results.<tenant>.malformed, and
// its dead letter, like that of any command whose subject did not parse,
// under DLQMalformed. Ops never holds it.
const Malformed = "malformed"

// DLQMalformed is the one subject the dead letters of commands whose
// subject did not parse are kept under: a subject the service publishes to
// is built from validated parts only.
const DLQMalformed = DLQPrefix + Malformed

// Ops lists the operations a command subject may name, as the last token:
// their verbs (order.Verb).
var Ops = order.Verbs()

// CommandSubject is the subject a tenant publishes op on.
func CommandSubject(tenant, op string) string { return CommandPrefix + tenant + "." + op }

// ResultSubject is the subject op's outcomes for tenant are published on.
func ResultSubject(tenant, op string) string { return ResultPrefix + tenant + "." + op }

// EventSubject is the subject an order event of tenant is published on.
func EventSubject(tenant, event string) string { return EventPrefix + tenant + "." + event }

// IsToken reports whether name can be one token of a subject and a NATS
// user name as it is: letters, digits, '-' and '_'. A tenant named "a.b",
// "*" or ">" would otherwise reach other tenants' subjects through its
// permissions, which are patterns.
func IsToken(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}
