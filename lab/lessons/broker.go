package lessons

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/messaging"
)

// The broker, as a client of the service sees it: the tenant's NATS user
// (user = tenant, password = its API key, CONTRACT.md "Messages"), which
// may publish commands on orders.commands.<tenant>.<op> and subscribe to its
// own results and events, and nothing else; and, for what only an operator
// does (replay the DLQ, republish an event as the relay would), the
// service's own NATS user.

// errNoOperator: the lesson needs the operator's NATS credentials and has none.
var errNoOperator = errors.New("no operator NATS credentials (pass -nats-operator user:password)")

// tenantBroker is the session's connection as the tenant, made on first use.
func (s *Session) tenantBroker() (jetstream.JetStream, *nats.Conn, error) {
	s.natsMu.Lock()
	defer s.natsMu.Unlock()
	if s.tenantNC != nil {
		return s.tenantJS, s.tenantNC, nil
	}
	if s.cfg.Tenant == "" {
		return nil, nil, errors.New("no tenant name for the broker (pass -tenant)")
	}
	nc, err := nats.Connect(s.cfg.NATSURL, nats.Name("orderservice-lessons "+s.runID),
		nats.UserInfo(s.cfg.Tenant, s.cfg.APIKey), nats.CustomInboxPrefix(messaging.InboxPrefix(s.cfg.Tenant)), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("the broker refuses tenant %s at %s (start it with `make run`, or pass -nats-url and -tenant): %w",
			s.cfg.Tenant, s.cfg.NATSURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	s.tenantNC, s.tenantJS = nc, js
	return js, nc, nil
}

// operatorBroker is the session's connection as the operator, or
// errNoOperator when the session has no such credentials.
func (s *Session) operatorBroker() (jetstream.JetStream, error) {
	s.natsMu.Lock()
	defer s.natsMu.Unlock()
	if s.operatorNC != nil {
		return s.operatorJS, nil
	}
	user, password, ok := strings.Cut(s.cfg.NATSOperator, ":")
	if !ok || user == "" {
		return nil, errNoOperator
	}
	nc, err := nats.Connect(s.cfg.NATSURL, nats.Name("orderservice-lessons operator "+s.runID),
		nats.UserInfo(user, password), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("%w: the broker at %s refuses user %s: %w", errNoOperator, s.cfg.NATSURL, user, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	s.operatorNC, s.operatorJS = nc, js
	return js, nil
}

// Close closes the session's connections to the broker, and stops the
// naive services its pitfall lessons started.
func (s *Session) Close() {
	s.naive.close()
	s.natsMu.Lock()
	defer s.natsMu.Unlock()
	for _, nc := range []*nats.Conn{s.tenantNC, s.operatorNC} {
		if nc != nil {
			nc.Close()
		}
	}
	s.tenantNC, s.operatorNC = nil, nil
}

// publishCommand publishes a command as the tenant, the way a checkout
// service would: header Idempotency-Key, the HTTP body (plus order_id for a
// command on an order). It waits for its step, like an HTTP request, and
// puts the command on the broker lane.
func (s *Session) publishCommand(ctx context.Context, op, key string, body []byte) (*jetstream.PubAck, error) {
	js, _, err := s.tenantBroker()
	if err != nil {
		return nil, err
	}
	subject := messaging.CommandSubject(s.cfg.Tenant, op)
	if err := s.waitStep(ctx, Request{Method: "PUB", Path: subject, Key: key, Body: string(body), Operation: "order." + op}); err != nil {
		return nil, err
	}
	m := nats.NewMsg(subject)
	m.Header.Set(messaging.HeaderKey, key)
	m.Data = body
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ack, err := js.PublishMsg(pctx, m)
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", subject, err)
	}
	s.emit(Event{Kind: KindMessage, Message: &Message{Kind: MessageCommand, Subject: subject, Key: key, Seq: ack.Sequence}})
	return ack, nil
}

// waitStep asks the step function, when a learner steps through the
// lesson, before something the client sends.
func (s *Session) waitStep(ctx context.Context, r Request) error {
	s.mu.Lock()
	step, inFlight := s.step, s.inFlight
	s.mu.Unlock()
	if step == nil || inFlight > 0 {
		return nil
	}
	if err := step(ctx, r); err != nil {
		return err
	}
	s.mu.Lock()
	s.resume = time.Now()
	s.mu.Unlock()
	return nil
}

// brokerMsg is one message a subscription received.
type brokerMsg struct {
	subject string
	header  nats.Header
	data    []byte
}

func (m brokerMsg) status() int {
	n, _ := strconv.Atoi(m.header.Get(messaging.HeaderStatus))
	return n
}

func (m brokerMsg) replayed() bool { return m.header.Get(messaging.HeaderReplayed) == "true" }

// field reads a top-level string field of the JSON body.
func (m brokerMsg) field(name string) string {
	return rawAnswer{body: m.data}.field(name)
}

// String is a result the way the demo prints it, as rawAnswer prints HTTP.
func (m brokerMsg) String() string {
	parts := []string{m.subject, fmt.Sprintf("Status: %d", m.status())}
	if id := m.field("id"); id != "" {
		parts = append(parts, "order "+short(id)+" "+m.field("status"))
	}
	if code := m.field("code"); code != "" {
		parts = append(parts, "code "+code)
	}
	for _, h := range []string{messaging.HeaderReplayed, messaging.HeaderLocation} {
		if v := m.header.Get(h); v != "" {
			parts = append(parts, h+": "+v)
		}
	}
	return strings.Join(parts, "  ")
}

// subscription collects what the tenant receives on a subject, from the
// moment it subscribed (core NATS: what is published while it listens).
type subscription struct {
	sub *nats.Subscription

	mu      sync.Mutex
	msgs    []brokerMsg
	arrived chan struct{} // closed and replaced on every message
}

// subscribe listens on subject as the tenant. Results and events are put
// on the broker lane as they arrive; keep filters them to this lesson's.
func (s *Session) subscribe(subject string, keep func(brokerMsg) bool) (*subscription, error) {
	_, nc, err := s.tenantBroker()
	if err != nil {
		return nil, err
	}
	w := &subscription{arrived: make(chan struct{})}
	w.sub, err = nc.Subscribe(subject, func(m *nats.Msg) {
		bm := brokerMsg{subject: m.Subject, header: m.Header, data: m.Data}
		if keep != nil && !keep(bm) {
			return
		}
		s.emit(Event{Kind: KindMessage, Message: laneMessage(bm)})
		w.mu.Lock()
		w.msgs = append(w.msgs, bm)
		close(w.arrived)
		w.arrived = make(chan struct{})
		w.mu.Unlock()
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe to %s as tenant %s: %w", subject, s.cfg.Tenant, err)
	}
	// The subscription must be in place at the server before anything is
	// published, or the first message could pass unseen.
	if err := nc.Flush(); err != nil {
		_ = w.sub.Unsubscribe()
		return nil, err
	}
	return w, nil
}

// laneMessage is what the broker lane shows of a received message.
func laneMessage(m brokerMsg) *Message {
	if strings.HasPrefix(m.subject, messaging.EventPrefix) {
		var e struct {
			EventID string `json:"event_id"`
			Event   string `json:"event"`
			OrderID string `json:"order_id"`
			To      string `json:"to_status"`
		}
		_ = json.Unmarshal(m.data, &e)
		return &Message{Kind: MessageEvent, Subject: m.subject, Key: m.header.Get(messaging.HeaderKey),
			MsgID: m.header.Get(messaging.HeaderMsgID), Event: e.Event, OrderID: e.OrderID, OrderStatus: e.To}
	}
	msg := &Message{Kind: MessageResult, Subject: m.subject, Key: m.header.Get(messaging.HeaderKey),
		Status: m.status(), Replayed: m.replayed(), Code: m.field("code")}
	if id := m.field("id"); id != "" {
		msg.OrderID, msg.OrderStatus = id, m.field("status")
	}
	return msg
}

func (w *subscription) stop() { _ = w.sub.Unsubscribe() }

// all returns what arrived so far.
func (w *subscription) all() []brokerMsg {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]brokerMsg(nil), w.msgs...)
}

// await waits until ok holds for what arrived, or timeout passes (time a
// learner takes to step does not count).
func (s *Session) await(ctx context.Context, w *subscription, timeout time.Duration, what string, ok func([]brokerMsg) bool) ([]brokerMsg, error) {
	start := time.Now()
	for {
		w.mu.Lock()
		msgs, arrived := append([]brokerMsg(nil), w.msgs...), w.arrived
		w.mu.Unlock()
		if ok(msgs) {
			return msgs, nil
		}
		left := time.Until(s.deadline(start, timeout))
		if left <= 0 {
			return msgs, fmt.Errorf("%s did not arrive on %s within %s", what, w.sub.Subject, timeout)
		}
		select {
		case <-ctx.Done():
			return msgs, ctx.Err()
		case <-arrived:
		case <-time.After(min(left, time.Second)):
		}
	}
}

// resultsFor are the results under key, in the order they arrived.
func resultsFor(msgs []brokerMsg, key string) []brokerMsg {
	var out []brokerMsg
	for _, m := range msgs {
		if m.header.Get(messaging.HeaderKey) == key {
			out = append(out, m)
		}
	}
	return out
}

// awaitResults waits for the n-th result under key and returns them all.
func (s *Session) awaitResults(ctx context.Context, w *subscription, key string, n int, timeout time.Duration) ([]brokerMsg, error) {
	msgs, err := s.await(ctx, w, timeout, fmt.Sprintf("result %d under %s", n, key),
		func(m []brokerMsg) bool { return len(resultsFor(m, key)) >= n })
	return resultsFor(msgs, key), err
}

// observeIntent puts what a command changed on the record, order and
// channel lanes, as the recorder does after an HTTP answer.
func (s *Session) observeIntent(ctx context.Context, op, key, orderID string, res brokerMsg) {
	if !s.cfg.Observe {
		return
	}
	path := "/v1/orders"
	if op != "create" {
		path = "/v1/orders/" + orderID + "/" + op
	}
	a := Answer{OrderID: res.field("id"), OrderStatus: res.field("status")}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s.observe(ctx, Request{Method: http.MethodPost, Path: path, Key: key, Operation: "order." + op}, a)
}
