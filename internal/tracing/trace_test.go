package tracing_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/tracing"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

// The traces of the whole program (service, embedded channel, embedded
// NATS, real PostgreSQL), recorded by the SDK's own in-memory recorder:
// what an operator sees in a trace UI, span by span.

var (
	dbURL    string
	recorder = tracetest.NewSpanRecorder()
)

func TestMain(m *testing.M) {
	// Installed before anything obtains a tracer: every span of this
	// process, the service's and the channel's, is recorded.
	shutdown := tracing.Install(context.Background(), "orderservice", sdktrace.WithSpanProcessor(recorder),
		sdktrace.WithSampler(sdktrace.AlwaysSample()))
	code := testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "tracing")
	_ = shutdown(context.Background())
	os.Exit(code)
}

// client is a caller that traces: each request is sent in a new trace of
// its own, started by the test, so the service's spans can be told apart
// from those of any other request.
type client struct {
	*apptest.Client
}

// send sends a request under a new root span and returns the answer and
// the trace it belongs to.
func (c client) send(t *testing.T, method, path, key string, body any) (apptest.Response, trace.TraceID) {
	t.Helper()
	ctx, span := otel.Tracer("test").Start(context.Background(), "test "+method+" "+path)
	defer span.End()
	h := http.Header{}
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
	r, err := c.Send(method, path, key, body, h)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r, span.SpanContext().TraceID()
}

// spansOf returns the ended spans of trace id, waiting up to 5s for the
// spans that end after the answer was sent (until has them).
func spansOf(t *testing.T, id trace.TraceID, until func([]sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var got []sdktrace.ReadOnlySpan
		for _, s := range recorder.Ended() {
			if s.SpanContext().TraceID() == id {
				got = append(got, s)
			}
		}
		if until(got) || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func named(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// has is spansOf's wait for the spans named: a span ends after the answer
// it made was sent, so the caller may read the answer first.
func has(names ...string) func([]sdktrace.ReadOnlySpan) bool {
	return func(spans []sdktrace.ReadOnlySpan) bool {
		for _, name := range names {
			if len(named(spans, name)) == 0 {
				return false
			}
		}
		return true
	}
}

func one(t *testing.T, spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	found := named(spans, name)
	if len(found) != 1 {
		t.Fatalf("%d spans named %q, want 1; the trace:\n%s", len(found), name, tree(spans))
	}
	return found[0]
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

func events(s sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, e := range s.Events() {
		out = append(out, e.Name)
	}
	return out
}

// childOf reports whether s's parent is p.
func childOf(s, p sdktrace.ReadOnlySpan) bool {
	return s.Parent().SpanID() == p.SpanContext().SpanID() && s.Parent().TraceID() == p.SpanContext().TraceID()
}

// tree renders spans for a failure message.
func tree(spans []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %q parent=%s kind=%s events=%v\n", s.SpanContext().SpanID(), s.Name(), s.Parent().SpanID(), s.SpanKind(), events(s))
	}
	return b.String()
}

func databaseWrites(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		if attr(s, "db.system.name") != "postgresql" {
			continue
		}
		q := strings.TrimSpace(attr(s, "db.query.text"))
		if op := strings.ToUpper(strings.Fields(q + " x")[0]); op == "INSERT" || op == "UPDATE" || op == "DELETE" {
			out = append(out, q)
		}
	}
	return out
}

func order() map[string]any {
	return map[string]any{"customer_id": "cus_trace", "currency": "EUR",
		"items": []map[string]any{{"sku": "T", "quantity": 1, "unit_price": 700}}}
}

func TestAFirstCreateAndItsReplay(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	c := client{apptest.NewClient(m, apptest.KeyAcme)}
	key := "trace-create-" + uuid.NewString()[:8]

	first, firstTrace := c.send(t, http.MethodPost, "/v1/orders", key, order())
	if first.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", first.Status, first.Body)
	}
	spans := spansOf(t, firstTrace, has("order.create", "POST /v1/orders"))
	server := one(t, spans, "POST /v1/orders")
	useCase := one(t, spans, "order.create")
	if server.SpanKind() != trace.SpanKindServer || attr(server, "http.route") != "/v1/orders" ||
		attr(server, "http.response.status_code") != "201" || attr(server, "idempotency.disposition") != "executed" {
		t.Errorf("server span: kind %s, attributes %v", server.SpanKind(), server.Attributes())
	}
	if !childOf(useCase, server) {
		t.Errorf("the use case's span is not the server span's child:\n%s", tree(spans))
	}
	if attr(useCase, "idempotency.key") != key || attr(useCase, "idempotency.disposition") != "executed" ||
		attr(useCase, "idempotency.record.state") != "SUCCEEDED" || !slices.Contains(events(useCase), "idempotency.record.inserted") {
		t.Errorf("use case span: attributes %v, events %v", useCase.Attributes(), events(useCase))
	}
	writes := databaseWrites(spans)
	if !slices.ContainsFunc(writes, func(q string) bool { return strings.Contains(q, "INSERT INTO idempotency_records") }) ||
		!slices.ContainsFunc(writes, func(q string) bool {
			return strings.Contains(q, "INSERT INTO \"orders\"") || strings.Contains(q, "INSERT INTO orders")
		}) {
		t.Errorf("the first create's database writes: %q; want the record's and the order's inserts", writes)
	}
	for _, s := range spans {
		if attr(s, "db.system.name") == "postgresql" && strings.Contains(attr(s, "db.query.text"), "cus_trace") {
			t.Errorf("a database span carries a bound value: %q", attr(s, "db.query.text"))
		}
	}

	again, replayTrace := c.send(t, http.MethodPost, "/v1/orders", key, order())
	apptest.WantReplay(t, first, again)
	spans = spansOf(t, replayTrace, has("order.create", "POST /v1/orders"))
	useCase = one(t, spans, "order.create")
	if attr(useCase, "idempotency.disposition") != "replayed" || !slices.Contains(events(useCase), "idempotency.record.replayed") {
		t.Errorf("replay's use case span: attributes %v, events %v", useCase.Attributes(), events(useCase))
	}
	if w := databaseWrites(spans); len(w) != 0 {
		t.Errorf("the replay wrote to the database: %q", w)
	}
	for _, s := range spans {
		if strings.HasPrefix(s.Name(), "payment_channel") {
			t.Errorf("the replay called the channel: %q", s.Name())
		}
	}
}

func TestAPayWhoseAnswerWasLostAndItsRetrySendTheSameKey(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	c := client{apptest.NewClient(m, apptest.KeyAcme)}
	admin := &apptest.Client{BaseURL: "http://" + m.ChannelAddr, HTTP: &http.Client{Timeout: 10 * time.Second}}
	run := uuid.NewString()[:8]
	created, _ := c.send(t, http.MethodPost, "/v1/orders", "trace-pay-create-"+run, order())
	id := created.JSON(t)["id"].(string)

	if r := admin.Do(t, http.MethodPost, "/admin/faults", "", map[string]any{"lost_response_rate": 1}); r.Status != http.StatusOK {
		t.Fatalf("faults: %d", r.Status)
	}
	lost, lostTrace := c.send(t, http.MethodPost, "/v1/orders/"+id+"/pay", "trace-pay-"+run, map[string]any{"payment_method": payment.MethodOK})
	apptest.WantProblem(t, lost, http.StatusServiceUnavailable, "service_unavailable")
	if r := admin.Do(t, http.MethodPost, "/admin/faults", "", map[string]any{}); r.Status != http.StatusOK {
		t.Fatalf("faults: %d", r.Status)
	}
	paid, retryTrace := c.send(t, http.MethodPost, "/v1/orders/"+id+"/pay", "trace-pay-"+run, map[string]any{"payment_method": payment.MethodOK})
	if paid.Status != http.StatusOK {
		t.Fatalf("retry: %d %s", paid.Status, paid.Body)
	}

	const call = "payment_channel POST /v1/charges"
	var keys []string
	for i, tr := range []trace.TraceID{lostTrace, retryTrace} {
		spans := spansOf(t, tr, has("order.pay", call, "paymentchannel POST /v1/charges"))
		useCase := one(t, spans, "order.pay")
		client := one(t, spans, call)
		if client.SpanKind() != trace.SpanKindClient || !childOf(client, useCase) {
			t.Errorf("attempt %d: the channel call is not a client span under the use case:\n%s", i+1, tree(spans))
		}
		channel := one(t, spans, "paymentchannel POST /v1/charges")
		if channel.SpanKind() != trace.SpanKindServer || !childOf(channel, client) {
			t.Errorf("attempt %d: the channel's server span is not joined to the call:\n%s", i+1, tree(spans))
		}
		keys = append(keys, attr(client, "payment.idempotency_key"))
		switch i {
		case 0:
			if attr(client, "http.request.resend_count") != "" || attr(useCase, "idempotency.disposition") != "unavailable" {
				t.Errorf("first attempt: call %v, use case %v", client.Attributes(), useCase.Attributes())
			}
		case 1:
			if attr(client, "http.request.resend_count") != "1" || attr(useCase, "idempotency.disposition") != "executed" ||
				!slices.Contains(events(useCase), "idempotency.record.taken_over") {
				t.Errorf("retry: call %v, use case %v %v", client.Attributes(), useCase.Attributes(), events(useCase))
			}
		}
	}
	if keys[0] == "" || keys[0] != keys[1] {
		t.Errorf("the two calls were sent under keys %q: want one stable key, twice", keys)
	}
	if got := apptest.ChannelStats(t, admin).Charges; got != 1 {
		t.Errorf("the channel made %d charges, want 1", got)
	}
}

func TestACommandOverNATSIsOneTraceFromItsPublisherToItsResult(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	nc, err := nats.Connect(m.NATSURL, nats.UserInfo("acme", apptest.KeyAcme), nats.CustomInboxPrefix(messaging.InboxPrefix("acme")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	results := make(chan *nats.Msg, 4)
	if _, err := nc.ChanSubscribe(messaging.ResultSubject("acme", "create"), results); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)

	ctx, publisher := otel.Tracer("test").Start(context.Background(), "test publish")
	cmd := nats.NewMsg(messaging.CommandSubject("acme", "create"))
	cmd.Header.Set(messaging.HeaderKey, "trace-cmd-"+uuid.NewString()[:8])
	cmd.Header.Set("traceparent", tracing.Traceparent(ctx)) // as another service's SDK would
	cmd.Data = []byte(`{"customer_id":"cus_trace","currency":"EUR","items":[{"sku":"N","quantity":1,"unit_price":300}]}`)
	if _, err := js.PublishMsg(ctx, cmd); err != nil {
		t.Fatal(err)
	}
	publisher.End()
	var result *nats.Msg
	select {
	case result = <-results:
	case <-time.After(30 * time.Second):
		t.Fatal("no result")
	}
	if result.Header.Get(messaging.HeaderStatus) != "201" {
		t.Fatalf("result: %v %s", result.Header, result.Data)
	}
	id := publisher.SpanContext().TraceID()
	if got := tracing.SpanContextOf(result.Header.Get("traceparent")).TraceID(); got != id {
		t.Errorf("the result carries trace %s, want the publisher's %s", got, id)
	}

	// The consumer span ends once the result is published and the command acknowledged.
	spans := spansOf(t, id, has("process "+cmd.Subject))
	process := one(t, spans, "process "+cmd.Subject)
	useCase := one(t, spans, "order.create")
	if process.SpanKind() != trace.SpanKindConsumer || process.Parent().SpanID() != publisher.SpanContext().SpanID() ||
		attr(process, "messaging.system") != "nats" || !childOf(useCase, process) {
		t.Errorf("the command's spans:\n%s", tree(spans))
	}

	// The create's outbox event is published by a relay, later, in a
	// trace of its own linked to the transaction that wrote it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		linked := false
		for _, s := range recorder.Ended() {
			if s.SpanKind() != trace.SpanKindProducer || !strings.HasPrefix(s.Name(), "send orders.events.acme.") {
				continue
			}
			for _, l := range s.Links() {
				linked = linked || l.SpanContext.TraceID() == id
			}
		}
		if linked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no outbox publish span is linked to the command's trace")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestAWebhookIsTracedFromTheChannelsDeliveryToItsApplication(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"PAYMENT_ASYNC_DELAY": "200ms"})
	c := client{apptest.NewClient(m, apptest.KeyAcme)}
	run := uuid.NewString()[:8]
	created, _ := c.send(t, http.MethodPost, "/v1/orders", "trace-wh-create-"+run, order())
	id := created.JSON(t)["id"].(string)
	pay, _ := c.send(t, http.MethodPost, "/v1/orders/"+id+"/pay", "trace-wh-pay-"+run, map[string]any{"payment_method": payment.MethodAsyncOK})
	if pay.Status != http.StatusAccepted {
		t.Fatalf("pay: %d %s", pay.Status, pay.Body)
	}
	var key string
	if err := m.DB.Raw("SELECT channel_key FROM payments WHERE order_id = ?", id).Scan(&key).Error; err != nil || key == "" {
		t.Fatalf("the payment's channel key: %q, %v", key, err)
	}

	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, s := range recorder.Ended() {
			if s.Name() != "POST /webhooks/payment-channel" || attr(s, "payment.idempotency_key") != key {
				continue
			}
			if attr(s, "webhook.outcome") != "applied" || attr(s, "webhook.event_type") != payment.EventChargeSucceeded {
				t.Errorf("the webhook's server span: %v", s.Attributes())
			}
			spans := spansOf(t, s.SpanContext().TraceID(), has("webhook deliver"))
			deliver := one(t, spans, "webhook deliver")
			if deliver.SpanKind() != trace.SpanKindClient || !childOf(s, deliver) {
				t.Errorf("the application is not joined to the channel's delivery:\n%s", tree(spans))
			}
			if w := databaseWrites(spans); !slices.ContainsFunc(w, func(q string) bool { return strings.Contains(q, "webhook_inbox") }) {
				t.Errorf("the application's writes %q do not note the delivery in the inbox", w)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no traced webhook delivery about the payment within 15s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestALatencyBucketCarriesItsTraceAsAnExemplar(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	c := client{apptest.NewClient(m, apptest.KeyAcme)}
	r, id := c.send(t, http.MethodPost, "/v1/orders", "trace-exemplar-"+uuid.NewString()[:8], order())
	if r.Status != http.StatusCreated {
		t.Fatalf("create: %d", r.Status)
	}
	req, _ := http.NewRequest(http.MethodGet, m.URL()+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	exemplar := regexp.MustCompile(`orderservice_http_request_duration_seconds_bucket\{method="POST",route="/v1/orders",status="201",le="[^"]+"\} \d+ # \{trace_id="` + id.String() + `"\}`)
	if !exemplar.Match(body) {
		t.Errorf("no bucket of POST /v1/orders carries trace %s as its exemplar (Content-Type %s)", id, res.Header.Get("Content-Type"))
	}
}
