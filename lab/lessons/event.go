package lessons

import "time"

// Kind says what an Event reports.
type Kind string

// The kinds of events a lesson emits, in the order a front end meets them.
const (
	// KindLessonStart opens a lesson: Lesson, Text (its title).
	KindLessonStart Kind = "lesson_start"
	// KindSay is a line of narration: Style (send, got or note) and Text.
	KindSay Kind = "say"
	// KindTable is a table to show: Rows, the first row the header.
	KindTable Kind = "table"
	// KindRequest is a request on its way to the service: Request.
	KindRequest Kind = "request"
	// KindAnswer is what came back for a request (or that nothing did): Answer.
	KindAnswer Kind = "answer"
	// KindRecord is the idempotency record of a key as the service shows
	// it, emitted when it changed since it was last seen: Record.
	KindRecord Kind = "record"
	// KindOrder is an order whose status changed since it was last seen: Order.
	KindOrder Kind = "order"
	// KindCharge is a charge at the payment channel that is new or got
	// more requests since it was last seen: Charge.
	KindCharge Kind = "charge"
	// KindMessage is a message on the broker: a command the client
	// published, a result or an event it received, a dead letter or an
	// operator's replay: Message.
	KindMessage Kind = "message"
	// KindWhy is the lesson's "why" paragraph: Text.
	KindWhy Kind = "why"
	// KindCheck is one verified claim: OK and Text.
	KindCheck Kind = "check"
	// KindMetrics holds the signals before and after the lesson: Signals.
	KindMetrics Kind = "metrics"
	// KindLessonEnd closes a lesson: OK (every check passed), Text (an
	// error that stopped it early, if any).
	KindLessonEnd Kind = "lesson_end"
)

// Narration styles of KindSay.
const (
	StyleSend = "send" // something the client does
	StyleGot  = "got"  // what it saw
	StyleNote = "note" // an aside, a pause, an explanation
)

// Event is one thing that happened while a lesson ran. Every front end
// reads the same events: the terminal prints the narration, the lab draws
// the wire events as a timeline.
type Event struct {
	Seq     int        `json:"seq"`
	Kind    Kind       `json:"kind"`
	Lesson  int        `json:"lesson"`
	At      time.Time  `json:"at"`
	Style   string     `json:"style,omitempty"`
	Text    string     `json:"text,omitempty"`
	OK      bool       `json:"ok,omitempty"`
	Rows    [][]string `json:"rows,omitempty"`
	Request *Request   `json:"request,omitempty"`
	Answer  *Answer    `json:"answer,omitempty"`
	Record  *Record    `json:"record,omitempty"`
	Order   *Order     `json:"order,omitempty"`
	Charge  *Charge    `json:"charge,omitempty"`
	Message *Message   `json:"message,omitempty"`
	Signals []Signal   `json:"signals,omitempty"`
}

// Request is one HTTP request a client sent the service in a lesson.
type Request struct {
	// ID numbers the requests of a session, so an answer and a re-send
	// can name the request they belong to.
	ID     int    `json:"id"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Key    string `json:"key,omitempty"`
	Body   string `json:"body,omitempty"`
	// Operation is the idempotent operation the path names (order.pay, …).
	Operation string `json:"operation,omitempty"`
	// Resend names the request this one sends again, if it does.
	Resend int `json:"resend,omitempty"`
	// Naive names the mistake of the naive service the request went to
	// (a pitfall lesson's first half); empty: it went to the service.
	Naive string `json:"naive,omitempty"`
	// TraceID is the trace the request's traceparent started, and
	// TraceURL its page in the trace UI, when the session has Config.TraceURL.
	TraceID  string `json:"trace_id,omitempty"`
	TraceURL string `json:"trace_url,omitempty"`
}

// Answer is what came back for a request, with the headers that matter.
type Answer struct {
	RequestID  int    `json:"request_id"`
	Status     int    `json:"status,omitempty"`
	Replayed   bool   `json:"replayed,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	Location   string `json:"location,omitempty"`
	Key        string `json:"key,omitempty"`
	// Instance names the process that answered, when a load balancer
	// says (header X-Upstream-Addr); empty otherwise.
	Instance    string `json:"instance,omitempty"`
	OrderID     string `json:"order_id,omitempty"`
	OrderStatus string `json:"order_status,omitempty"`
	Code        string `json:"code,omitempty"`
	Millis      int64  `json:"ms"`
	// Error says why no answer arrived (the client hung up, …).
	Error string `json:"error,omitempty"`
}

// Record is an idempotency record as GET /v1/idempotency-records shows it.
type Record struct {
	Key        string `json:"key"`
	Operation  string `json:"operation"`
	State      string `json:"state"`
	Attempts   int    `json:"attempts"`
	LeaseToken int64  `json:"lease_token"`
	// Lease says how the lease stands when it was read ("expires in 2.9s").
	Lease      string `json:"lease"`
	ResourceID string `json:"resource_id,omitempty"`
}

// Order is an order's status as an answer showed it.
type Order struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// Charge is one charge at the payment channel (GET /admin/charges).
type Charge struct {
	ID             string `json:"id"`
	Status         string `json:"status"`
	Amount         int64  `json:"amount"`
	OrderID        string `json:"order_id"`
	IdempotencyKey string `json:"idempotency_key"`
	// Requests counts the POSTs that arrived under its key; every one
	// after the first was a duplicate the channel absorbed.
	Requests int `json:"requests"`
}

// What a Message on the broker lane is.
const (
	MessageCommand    = "command"     // the client published a command
	MessageResult     = "result"      // a result arrived on orders.results.<tenant>.<op>
	MessageEvent      = "event"       // an order event arrived on orders.events.<tenant>.<event>
	MessageDeadLetter = "dead_letter" // a command lies in ORDER_COMMANDS_DLQ
	MessageReplay     = "replay"      // an operator republished a dead letter
	MessageRepublish  = "republish"   // an event published again, as a relay would after a crash
)

// Message is one message on the broker a lesson published or saw.
type Message struct {
	// Kind is one of the Message* constants.
	Kind    string `json:"kind"`
	Subject string `json:"subject"`
	Key     string `json:"key,omitempty"`
	// Status and Replayed are a result's headers (Status, Idempotent-Replayed).
	Status   int    `json:"status,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	Code     string `json:"code,omitempty"`
	// MsgID is an event's Nats-Msg-Id, its event id.
	MsgID       string `json:"msg_id,omitempty"`
	Event       string `json:"event,omitempty"`
	OrderID     string `json:"order_id,omitempty"`
	OrderStatus string `json:"order_status,omitempty"`
	// Seq is the message's sequence in its stream, when known.
	Seq uint64 `json:"seq,omitempty"`
	// Duplicate is true when JetStream dropped a publish as a copy of a
	// Nats-Msg-Id it already holds.
	Duplicate bool `json:"duplicate,omitempty"`
	// Deliveries and Reason describe a dead letter.
	Deliveries int    `json:"deliveries,omitempty"`
	Reason     string `json:"reason,omitempty"`
}

// Signal is one of the seed's monitoring signals, read from /metrics
// before and after a lesson.
type Signal struct {
	Name   string  `json:"name"`
	Series string  `json:"series"`
	Before float64 `json:"before"`
	After  float64 `json:"after"`
}
