package lessons

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/client"
)

// Config is what a session needs to know about the system it talks to.
type Config struct {
	// BaseURL is the order service's API (e.g. http://localhost:8080).
	BaseURL string
	// ChannelURL is the payment channel, for its /admin endpoints.
	ChannelURL string
	// APIKey is the key of the tenant the session plays as.
	APIKey string
	// Tenant is the tenant APIKey belongs to: its NATS user name.
	Tenant string
	// NeighbourAPIKey and NeighbourTenant are another tenant's, the quiet
	// one beside the session's flood in the fair-share lesson.
	NeighbourAPIKey, NeighbourTenant string
	// NATSURL is the broker the service uses (nats://127.0.0.1:4223 for
	// `make run`'s embedded server); the session connects as the tenant,
	// with its API key as the password.
	NATSURL string
	// NATSOperator is "user:password" of the service's own NATS user, for
	// what only an operator does: replay the DLQ, republish an event as
	// the relay would. Empty: those steps are shown, not done.
	NATSOperator string
	// NaiveDatabaseURL is the PostgreSQL where the pitfall lessons' naive
	// service (lab/naiveorders) keeps its tables, in schemas of its own.
	NaiveDatabaseURL string
	// TraceURL, when set, is a trace UI's URL with {trace_id} in it: every
	// request a lesson sends then carries a traceparent of a new trace, and
	// its timeline event the trace's id and link.
	TraceURL string
	// SweepWait bounds how long lesson 8 waits for the service's sweeper.
	SweepWait time.Duration
	// Observe makes the session read the record, the order and the
	// channel's charges after every answer, and emit what changed: the lab
	// draws them as lanes; the terminal narration has no use for them.
	Observe bool
}

// Sink receives every event of a session, in order, from one goroutine at
// a time.
type Sink func(Event)

// StepFunc is called before each request of a lesson is sent; it returns
// when the request may go (a learner stepping through a lesson), or an
// error to stop the lesson.
type StepFunc func(ctx context.Context, next Request) error

// Session plays lessons against one live service, as one tenant. Keys and
// customers carry the session's run id, so a session can play against a
// database that earlier sessions used.
type Session struct {
	cfg   Config
	runID string

	// api is the Go client the way an application would use it: it makes
	// one key per intent and retries under it.
	api *client.Client
	// once is the same client with retries off, to show single answers.
	once *client.Client
	// http sends the raw requests whose headers the lessons show.
	http *http.Client
	// look reads what the lessons observe (records, charges, metrics);
	// its requests are not part of the story and are not shown.
	look *http.Client
	// view is the Go client over look, for reads that check a story.
	view *client.Client

	natsMu     sync.Mutex // guards the broker connections, made on first use
	tenantNC   *nats.Conn
	tenantJS   jetstream.JetStream
	operatorNC *nats.Conn
	operatorJS jetstream.JetStream

	// naive are the naive services the pitfall lessons started.
	naive naiveServices

	mu     sync.Mutex // guards what follows and serialises emit
	sink   Sink
	seq    int
	reqID  int
	step   StepFunc
	resume time.Time // when the last step was let go, for waits in step mode
	// inFlight counts the lesson's requests sent and not yet answered.
	inFlight int
	seen     observed
	// requests are the requests sent so far, by id, for Resend.
	requests map[int]Request

	// metricsAtStart is scraped at the first lesson, for lesson 10.
	metricsAtStart metricSnapshot
	// played counts how often each lesson ran; ran is true for those that did.
	played map[int]int
	// Per lesson: its number, the key prefix and the checks it made.
	num       int
	keyPrefix string
	checks    []checkResult
}

type checkResult struct {
	ok   bool
	what string
}

// NewSession returns a session that reports to sink.
func NewSession(cfg Config, sink Sink) *Session {
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	cfg.ChannelURL = strings.TrimRight(cfg.ChannelURL, "/")
	if cfg.SweepWait == 0 {
		cfg.SweepWait = 45 * time.Second
	}
	id := make([]byte, 4)
	_, _ = rand.Read(id)
	s := &Session{
		cfg:      cfg,
		runID:    "demo-" + hex.EncodeToString(id),
		look:     &http.Client{Timeout: 30 * time.Second},
		sink:     sink,
		played:   map[int]int{},
		seen:     newObserved(),
		requests: map[int]Request{},
	}
	s.view = client.New(cfg.BaseURL, cfg.APIKey, client.WithHTTPClient(s.look))
	wire := &http.Client{Timeout: 30 * time.Second, Transport: &recorder{s: s, next: http.DefaultTransport}}
	s.http = wire
	s.api = client.New(cfg.BaseURL, cfg.APIKey, client.WithHTTPClient(wire))
	s.once = client.New(cfg.BaseURL, cfg.APIKey, client.WithHTTPClient(wire), client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	return s
}

// RunID is the prefix of every key and customer the session makes.
func (s *Session) RunID() string { return s.runID }

// Config is the configuration the session runs with.
func (s *Session) Config() Config { return s.cfg }

// Preflight fails early, with a hint, when the service or the channel does
// not answer or the key is refused.
func (s *Session) Preflight(ctx context.Context) error {
	if _, err := s.get(ctx, s.cfg.BaseURL+"/healthz", false); err != nil {
		return fmt.Errorf("the order service does not answer at %s (start it with `make run`, or pass -url): %w", s.cfg.BaseURL, err)
	}
	if _, err := s.channelStats(ctx); err != nil {
		return fmt.Errorf("the payment channel's admin API does not answer at %s (pass -channel): %w", s.cfg.ChannelURL, err)
	}
	var list struct{}
	if err := s.getJSON(ctx, s.cfg.BaseURL+"/v1/orders?limit=1", true, &list); err != nil {
		return fmt.Errorf("the service refuses the API key (pass -api-key): %w", err)
	}
	return nil
}

// Outcome is how a lesson ended.
type Outcome struct {
	// Passed is true when the lesson finished and every check held.
	Passed bool
	// Err is what stopped the lesson early, if anything.
	Err error
}

// Play runs one lesson: it emits KindLessonStart, the lesson's requests
// and narration, KindWhy, one KindCheck per claim, KindMetrics and
// KindLessonEnd. step, when not nil, is asked before every request.
func (s *Session) Play(ctx context.Context, l Lesson, step StepFunc) Outcome {
	s.mu.Lock()
	s.num = l.Number
	s.played[l.Number]++
	s.keyPrefix = fmt.Sprintf("%s-%d", s.runID, l.Number)
	if n := s.played[l.Number]; n > 1 {
		s.keyPrefix = fmt.Sprintf("%s-%dr%d", s.runID, l.Number, n)
	}
	s.checks = nil
	s.step = step
	s.resume = time.Now()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.step = nil
		s.mu.Unlock()
	}()

	s.emit(Event{Kind: KindLessonStart, Text: l.Title})
	before, err := s.scrapeMetrics(ctx)
	if err == nil && s.metricsAtStart == nil {
		s.metricsAtStart = before
	}
	if err == nil {
		err = l.run(ctx, s)
	}
	s.emit(Event{Kind: KindWhy, Text: l.Why})
	s.mu.Lock()
	checks := s.checks
	s.mu.Unlock()
	for _, c := range checks {
		s.emit(Event{Kind: KindCheck, OK: c.ok, Text: c.what})
	}
	if after, merr := s.scrapeMetrics(ctx); merr == nil && before != nil {
		s.emit(Event{Kind: KindMetrics, Signals: signals(before, after)})
	}
	out := Outcome{Err: err, Passed: err == nil && len(checks) > 0 && allOK(checks)}
	end := Event{Kind: KindLessonEnd, OK: out.Passed}
	if err != nil {
		end.Text = err.Error()
	}
	s.emit(end)
	return out
}

// emit stamps an event with its sequence number, lesson and time, and hands
// it to the sink.
func (s *Session) emit(e Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.emitLocked(e)
}

func (s *Session) emitLocked(e Event) {
	s.seq++
	e.Seq, e.At = s.seq, time.Now()
	if e.Lesson == 0 {
		e.Lesson = s.num
	}
	if s.sink != nil {
		s.sink(e)
	}
}

func allOK(checks []checkResult) bool {
	for _, c := range checks {
		if !c.ok {
			return false
		}
	}
	return true
}

// check records one verified claim of the current lesson; the claims are
// emitted after the lesson's "why".
func (s *Session) check(ok bool, format string, args ...any) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks = append(s.checks, checkResult{ok: ok, what: fmt.Sprintf(format, args...)})
	return ok
}

// ran reports whether lesson n was played in this session.
func (s *Session) ran(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.played[n] > 0
}

// key is a fresh idempotency key of the current lesson: the run id makes
// it unique across sessions, the name (R1, R2, …) matches the seed's story.
func (s *Session) key(name string) string { return s.keyPrefix + "-" + name }

// customer is a customer id of its own for the current lesson, so that
// listing its orders counts only this play's.
func (s *Session) customer() string { return "cus_" + strings.ReplaceAll(s.keyPrefix, "-", "_") }

// purchase is the create body the lessons send: two of SKU-1 at 12.50 EUR
// (unit_price 1250: prices are in minor units).
func (s *Session) purchase() client.CreateOrderRequest {
	return client.CreateOrderRequest{CustomerID: s.customer(), Currency: "EUR",
		Items: []client.ItemRequest{{SKU: "SKU-1", Quantity: 2, UnitPrice: 1250}}}
}

// newOrder creates an order under a fresh key, for lessons about what
// happens after creation.
func (s *Session) newOrder(ctx context.Context, keyName string) (client.Order, error) {
	s.send("client.CreateOrder(2 × SKU-1, WithKey(%q))", s.key(keyName))
	res, err := s.api.CreateOrder(ctx, s.purchase(), client.WithKey(s.key(keyName)))
	if err != nil {
		return client.Order{}, err
	}
	s.got("%d order %s %s", res.Status, short(res.Value.ID), res.Value.Status)
	return res.Value, nil
}

// problemOf returns the service's problem behind err, or a stand-in whose
// fields match nothing when err is not one.
func problemOf(err error) *client.ProblemError {
	var pe *client.ProblemError
	if errors.As(err, &pe) {
		return pe
	}
	return &client.ProblemError{Detail: fmt.Sprint(err)}
}

// Narration.

func (s *Session) say(style, format string, args ...any) {
	s.emit(Event{Kind: KindSay, Style: style, Text: fmt.Sprintf(format, args...)})
}

// send narrates something the client does.
func (s *Session) send(format string, args ...any) { s.say(StyleSend, format, args...) }

// got narrates what came back.
func (s *Session) got(format string, args ...any) { s.say(StyleGot, format, args...) }

// note narrates anything else: a pause, an aside; "" is a blank line.
func (s *Session) note(format string, args ...any) { s.say(StyleNote, format, args...) }

// table shows rows as a table, the first row as the header.
func (s *Session) table(rows [][]string) { s.emit(Event{Kind: KindTable, Rows: rows}) }

// prefix is the first n bytes of s, or s when it is shorter.
func prefix(s string, n int) string { return s[:min(n, len(s))] }

// short abbreviates an order id (a UUIDv7, whose first digits are a clock)
// to its random tail, enough to tell two orders apart on screen.
func short(id string) string {
	if len(id) <= 8 {
		return id
	}
	return "…" + id[len(id)-8:]
}
