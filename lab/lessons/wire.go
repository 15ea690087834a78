package lessons

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// recorder is the transport of every request a lesson's client sends the
// service: it waits for the step, emits the request and its answer, and
// (with Config.Observe) what the answer changed in the record, the order
// and the channel. The clients above it (the Go client, raw posts) do not
// know it is there, exactly as an application's would not.
type recorder struct {
	s    *Session
	next http.RoundTripper
}

// stepSkipped is the note on a request that a step does not hold.
const stepSkipped = "step mode sends #%d at once: another request is still in flight, and time does not wait"

// stepBurst is the note on a request that goes with the first of its burst.
const stepBurst = "step mode sends #%d with the first of its burst: one step lets the whole burst go"

type burstKey struct{}

// burstStep is the one step of a burst of concurrent requests: the first
// to arrive waits for it, the others wait for that, and all go together.
type burstStep struct {
	once sync.Once
	err  error
}

// withBurst marks the requests sent with ctx as one burst, for one step.
func withBurst(ctx context.Context) context.Context {
	return context.WithValue(ctx, burstKey{}, &burstStep{})
}

type resendKey struct{}

// withResend marks a request as a re-send of request id: it is not a step
// of the lesson, so it never waits for one.
func withResend(ctx context.Context, id int) context.Context {
	return context.WithValue(ctx, resendKey{}, id)
}

func (t *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	s := t.s
	r := Request{Method: req.Method, Path: req.URL.RequestURI(), Key: req.Header.Get("Idempotency-Key")}
	r.Operation = operationOf(req.Method, req.URL.Path)
	// The body is kept so that the request can be sent again (the lab's ↻).
	// A client may leave no GetBody (the Go client drops it, so net/http
	// never resends a POST behind its back): the body is then read here
	// and the request goes on with a copy.
	switch {
	case req.GetBody != nil:
		if b, err := req.GetBody(); err == nil {
			raw, _ := io.ReadAll(b)
			r.Body = string(raw)
		}
	case req.Body != nil && req.Body != http.NoBody:
		raw, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		r.Body = string(raw)
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(raw))
	}
	resend, _ := req.Context().Value(resendKey{}).(int)
	r.Resend = resend
	r.Naive = s.naive.naiveOf(req.URL)
	if s.cfg.TraceURL != "" {
		// Each request starts a trace of its own: the service (and the
		// channel it calls) record their spans under it, and the timeline
		// links to it.
		var header string
		header, r.TraceID = traceparent()
		r.TraceURL = strings.ReplaceAll(s.cfg.TraceURL, "{trace_id}", r.TraceID)
		req = req.Clone(req.Context())
		req.Header.Set("traceparent", header)
	}

	s.mu.Lock()
	s.reqID++
	r.ID = s.reqID
	s.requests[r.ID] = r
	step, inFlight := s.step, s.inFlight
	s.mu.Unlock()
	skipped := ""
	burst, _ := req.Context().Value(burstKey{}).(*burstStep)
	switch {
	case step == nil || resend != 0:
	case burst != nil:
		stepped := false
		burst.once.Do(func() {
			stepped = true
			if burst.err = step(req.Context(), r); burst.err == nil {
				s.mu.Lock()
				s.resume = time.Now()
				s.mu.Unlock()
			}
		})
		if burst.err != nil {
			return nil, burst.err
		}
		if !stepped {
			skipped = stepBurst
		}
	case inFlight > 0:
		// Holding it would let the request in flight finish first and tell
		// another story (a replay where the lesson shows a 409).
		skipped = stepSkipped
	default:
		if err := step(req.Context(), r); err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.resume = time.Now()
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.inFlight++
	// The note and its request go out together, even when other requests
	// of a burst are on their way at the same moment.
	if skipped != "" {
		s.emitLocked(Event{Kind: KindSay, Style: StyleNote, Text: fmt.Sprintf(skipped, r.ID)})
	}
	s.emitLocked(Event{Kind: KindRequest, Request: &r})
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	a := Answer{RequestID: r.ID}
	var body []byte
	if err == nil {
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	a.Millis = time.Since(start).Milliseconds()
	if err != nil {
		a.Error = "no answer: " + hangUp(req.Context(), err)
	} else {
		a.Status = resp.StatusCode
		a.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
		a.RetryAfter = resp.Header.Get("Retry-After")
		a.Location = resp.Header.Get("Location")
		a.Key = resp.Header.Get("Idempotency-Key")
		a.Instance = resp.Header.Get("X-Upstream-Addr")
		var fields struct {
			ID     string `json:"id"`
			Status any    `json:"status"`
			Code   string `json:"code"`
		}
		_ = json.Unmarshal(body, &fields)
		a.Code = fields.Code
		if st, ok := fields.Status.(string); ok && fields.ID != "" {
			a.OrderID, a.OrderStatus = fields.ID, st
		}
	}
	s.emit(Event{Kind: KindAnswer, Answer: &a})
	if s.cfg.Observe {
		// The client may have hung up; what it left behind is still worth a look.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), 5*time.Second)
		s.observe(ctx, r, a)
		cancel()
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// traceparent starts a new W3C trace: version 00, a random trace id and
// parent id, sampled (01) so that a sampling service keeps the trace.
func traceparent() (header, traceID string) {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	traceID = hex.EncodeToString(b[:16])
	return "00-" + traceID + "-" + hex.EncodeToString(b[16:]) + "-01", traceID
}

// hangUp says why no answer came, in a learner's words.
func hangUp(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		return "the client hung up (" + ctx.Err().Error() + ")"
	}
	return err.Error()
}

// operationOf names the idempotent operation of a request, as the
// service's records do, or "" for a read.
func operationOf(method, path string) string {
	if method != http.MethodPost {
		return ""
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) == 2 && parts[0] == "v1" && parts[1] == "orders":
		return "order.create"
	case len(parts) == 4 && parts[0] == "v1" && parts[1] == "orders":
		return "order." + parts[3]
	}
	return ""
}

// orderInPath is the order id of /v1/orders/{id}/…, or "".
func orderInPath(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) >= 3 && parts[0] == "v1" && parts[1] == "orders" {
		return parts[2]
	}
	return ""
}

// observed is what the lanes showed last, so only changes are emitted.
type observed struct {
	records map[string]string // key|operation -> state/attempts/token
	orders  map[string]string // id -> status
	charges map[string]string // id -> status/requests
}

func newObserved() observed {
	return observed{records: map[string]string{}, orders: map[string]string{}, charges: map[string]string{}}
}

// observe reads what an answer may have changed and emits what did.
func (s *Session) observe(ctx context.Context, r Request, a Answer) {
	// A naive service's records are its own, out of the service's API's
	// sight; the service's record under the same key is the lesson's other half.
	if r.Key != "" && r.Operation != "" && r.Naive == "" {
		if recs, err := s.records(ctx, r.Key); err == nil {
			for _, rec := range recs {
				s.noteRecord(rec)
			}
		}
	}
	switch {
	case a.OrderID == "":
	case a.Replayed && r.Naive == "":
		// A replay is the first answer as it was stored: its order status is
		// that moment's, not the order's now (a 202 PAYMENT_PENDING replayed
		// after the order was PAID). The order lane shows the order as it is.
		if o, err := s.view.GetOrder(ctx, a.OrderID); err == nil {
			s.noteOrder(Order{ID: o.Value.ID, Status: string(o.Value.Status)})
		}
	default:
		s.noteOrder(Order{ID: a.OrderID, Status: a.OrderStatus})
	}
	order := orderInPath(r.Path)
	if order == "" {
		order = a.OrderID
	}
	if order != "" && (r.Operation == "order.pay" || r.Operation == "order.cancel") {
		if charges, err := s.chargesFor(ctx, order); err == nil {
			for _, c := range charges {
				s.noteCharge(c)
			}
		}
	}
}

// noteRecord emits a record when its state, attempts or lease token
// changed since the lane last showed it.
func (s *Session) noteRecord(r Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, v := r.Key+"|"+r.Operation, fmt.Sprintf("%s/%d/%d", r.State, r.Attempts, r.LeaseToken)
	if s.seen.records[id] == v {
		return
	}
	s.seen.records[id] = v
	s.emitLocked(Event{Kind: KindRecord, Record: &r})
}

func (s *Session) noteOrder(o Order) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen.orders[o.ID] == o.Status {
		return
	}
	s.seen.orders[o.ID] = o.Status
	s.emitLocked(Event{Kind: KindOrder, Order: &o})
}

func (s *Session) noteCharge(c channelCharge) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := c.Status + "/" + strconv.Itoa(c.Requests)
	if s.seen.charges[c.ID] == v {
		return
	}
	s.seen.charges[c.ID] = v
	s.emitLocked(Event{Kind: KindCharge, Charge: &Charge{ID: c.ID, Status: c.Status, Amount: c.Amount,
		OrderID: c.Reference, IdempotencyKey: c.IdempotencyKey, Requests: c.Requests}})
}

// Resend sends request id again, as a client would, with the same key or
// a new one; its request and answer are emitted like the lesson's own. A
// request that carried no key (a GET, a webhook) goes again without one:
// inventing a key would make it another request than the one on screen.
func (s *Session) Resend(ctx context.Context, id int, newKey bool) (Answer, error) {
	s.mu.Lock()
	orig, ok := s.requests[id]
	s.mu.Unlock()
	if !ok {
		return Answer{}, fmt.Errorf("no request %d in this session", id)
	}
	key := orig.Key
	if newKey {
		key = fmt.Sprintf("%s-lab-%d", s.runID, time.Now().UnixNano())
	}
	base := s.cfg.BaseURL
	if orig.Naive != "" { // to the naive service it went to
		if base = s.naive.baseOf(orig.Naive); base == "" {
			return Answer{}, fmt.Errorf("the naive service of request %d (%s) is no longer running", id, orig.Naive)
		}
	}
	return s.sendTo(withResend(ctx, id), base, orig.Method, orig.Path, key, orig.Body)
}

// Send sends one request of the learner's own to the service, as the
// session's tenant, and returns the answer the timeline shows for it.
func (s *Session) Send(ctx context.Context, method, path, key, body string) (Answer, error) {
	return s.sendTo(ctx, s.cfg.BaseURL, method, path, key, body)
}

func (s *Session) sendTo(ctx context.Context, base, method, path, key, body string) (Answer, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	if _, ok := ctx.Value(resendKey{}).(int); !ok {
		ctx = withResend(ctx, -1) // not a step of any lesson
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+s.cfg.APIKey)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	a, err := s.do(s.http, req)
	if err != nil {
		return Answer{Error: err.Error()}, err
	}
	return Answer{Status: a.status, Replayed: a.header.Get("Idempotent-Replayed") == "true",
		Code: a.field("code"), OrderID: a.field("id")}, nil
}
