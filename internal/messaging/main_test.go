package messaging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/metrics"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "messaging"))
}

// tenants are the test tenants and their API keys (= NATS passwords).
var tenants = map[string]string{"acme": apptest.KeyAcme, "globex": apptest.KeyGlobex}

const servicePassword = "test-service-password"

// world is one instance's worth of real parts: the package's PostgreSQL,
// an embedded NATS server with JetStream on a random port and a store of
// its own, the mock payment channel, the order use cases and the HTTP API
// in front of them.
type world struct {
	t        *testing.T
	db       *gorm.DB
	orders   *order.Service
	channel  string // base URL of the mock channel
	api      *apptest.Client
	nats     *messaging.Embedded
	nc       *nats.Conn
	js       jetstream.JetStream
	policy   idempotency.Policy
	logger   *slog.Logger
	counters *counters
}

func newWorld(t *testing.T) *world {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx := context.Background()
	db, err := database.Open(ctx, dbURL, database.Options{MaxConns: 10, StatementTimeout: 5 * time.Second, LockTimeout: 3 * time.Second})
	if err != nil {
		t.Fatalf("database: %v", err)
	}
	t.Cleanup(func() { _ = database.Close(db) })

	channelSrv, err := mockchannel.Open(ctx, testdb.Fresh(t, "messaging_channel"), mockchannel.Options{SlowDelay: 300 * time.Millisecond})
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	t.Cleanup(func() { _ = channelSrv.Close() })
	ch := httptest.NewServer(channelSrv.Handler())
	t.Cleanup(ch.Close)

	policy := idempotency.Policy{
		Windows: []idempotency.Window{{Name: "client_retry", Duration: 24 * time.Hour},
			{Name: "message_redelivery", Duration: 168 * time.Hour}, {Name: "manual_compensation", Duration: 720 * time.Hour}},
		Margin: 24 * time.Hour, MoneyFloor: 2160 * time.Hour, MoneyOperations: order.MoneyOperations, Operations: order.Operations,
	}
	records := &idempotency.Store{Lease: 3 * time.Second, Policy: policy}
	svc := order.NewService(order.Deps{DB: db, Records: records, Logger: logger,
		Channel: payment.NewClient(ch.URL, &http.Client{}),
		Money:   order.MoneyConfig{ChannelTimeout: 2 * time.Second, RetryAfter: time.Second}})
	api := httptest.NewServer((&httpapi.Server{Orders: svc, Logger: logger,
		Tenants: httpapi.NewTenants(tenants), Metrics: metrics.New(func(ctx context.Context) (idempotency.Gauges, error) { return records.Gauges(db.WithContext(ctx)) }, logger, order.Operations, order.MoneyOperations)}).Handler())
	t.Cleanup(api.Close)

	srv, err := messaging.StartEmbedded(messaging.EmbeddedOptions{Addr: "127.0.0.1:0", StoreDir: t.TempDir(),
		Tenants: tenants, ServicePassword: servicePassword})
	if err != nil {
		t.Fatalf("embedded NATS: %v", err)
	}
	t.Cleanup(srv.Close)
	nc, err := nats.Connect(srv.URL(), nats.UserInfo(messaging.ServiceUser, servicePassword))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := messaging.EnsureStreams(ctx, js, messaging.StreamWindows{Redelivery: 168 * time.Hour, Compensation: 720 * time.Hour}); err != nil {
		t.Fatalf("streams: %v", err)
	}
	return &world{t: t, db: db, orders: svc, channel: ch.URL, nats: srv, nc: nc, js: js, policy: policy, logger: logger,
		api:      &apptest.Client{BaseURL: api.URL, APIKey: apptest.KeyAcme, HTTP: &http.Client{Timeout: 30 * time.Second}},
		counters: newCounters()}
}

// consumer starts one instance's consumer (stopped at the end of the test).
func (w *world) consumer(hooks messaging.ConsumerHooks, obs messaging.Observer, opts ...func(*messaging.Consumer)) *messaging.Consumer {
	w.t.Helper()
	if obs == nil {
		obs = w.counters
	}
	c := &messaging.Consumer{JS: w.js, Orders: w.orders, Tenants: tenants, MaxDeliver: 5, AckWait: 2 * time.Second,
		Backoff: messaging.Backoff{Base: 20 * time.Millisecond, Max: 2 * time.Second}, Workers: 4,
		Observe: obs, Logger: w.logger, Hooks: hooks}
	for _, o := range opts {
		o(c)
	}
	if err := c.Start(context.Background()); err != nil {
		w.t.Fatalf("start consumer: %v", err)
	}
	w.t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

// tenantConn connects as tenant with its API key, as a checkout service would.
func (w *world) tenantConn(tenant string, opts ...nats.Option) *nats.Conn {
	w.t.Helper()
	nc, err := nats.Connect(w.nats.URL(), append(opts, nats.UserInfo(tenant, tenants[tenant]), nats.CustomInboxPrefix(messaging.InboxPrefix(tenant)))...)
	if err != nil {
		w.t.Fatalf("connect as %s: %v", tenant, err)
	}
	w.t.Cleanup(nc.Close)
	return nc
}

// tenantJS connects as tenant, as tenantConn does, with its JetStream.
func (w *world) tenantJS(tenant string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	w.t.Helper()
	nc := w.tenantConn(tenant, opts...)
	js, err := jetstream.New(nc)
	if err != nil {
		w.t.Fatalf("JetStream as %s: %v", tenant, err)
	}
	return nc, js
}

// subscribe collects every message on subject.
func subscribe(t *testing.T, nc *nats.Conn, subject string) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatalf("subscribe %s: %v", subject, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// next waits for the next message on ch; the bound only keeps a broken
// test from hanging, it is not what the test measures.
func next(t *testing.T, ch chan *nats.Msg, what string) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(60 * time.Second):
		t.Fatalf("no %s arrived", what)
		return nil
	}
}

// publish sends a command as a tenant would, with JetStream's ack.
func publish(t *testing.T, js jetstream.JetStream, subject, key string, body string, extra ...string) {
	t.Helper()
	m := nats.NewMsg(subject)
	if key != "" {
		m.Header.Set(messaging.HeaderKey, key)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		m.Header.Set(extra[i], extra[i+1])
	}
	m.Data = []byte(body)
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
}

func createBody(customer string) string {
	return fmt.Sprintf(`{"customer_id":%q,"currency":"EUR","items":[{"sku":"SKU-1","quantity":2,"unit_price":1250}]}`, customer)
}

// count runs a SELECT count(*) … and returns the number.
func (w *world) count(query string, args ...any) int64 {
	w.t.Helper()
	var n int64
	if err := w.db.Raw(query, args...).Scan(&n).Error; err != nil {
		w.t.Fatalf("%s: %v", query, err)
	}
	return n
}

// faults sets the mock channel's fault injection.
func (w *world) faults(f map[string]any) {
	w.t.Helper()
	admin := &apptest.Client{BaseURL: w.channel, HTTP: &http.Client{Timeout: 10 * time.Second}}
	if r := admin.Do(w.t, http.MethodPost, "/admin/faults", "", f); r.Status != http.StatusOK {
		w.t.Fatalf("set faults: %d %s", r.Status, r.Body)
	}
}

func (w *world) channelStats() map[string]any {
	w.t.Helper()
	admin := &apptest.Client{BaseURL: w.channel, HTTP: &http.Client{Timeout: 10 * time.Second}}
	return admin.Do(w.t, http.MethodGet, "/admin/stats", "", nil).JSON(w.t)
}

// counters is an Observer that counts, for exact assertions.
type counters struct {
	mu                                                    sync.Mutex
	received, redelivered, acked, replayed, dead, givenUp map[string]int
	postponed, handedBack                                 map[string]int
	published, duplicates                                 int
	ackedCh, deadCh, postponedCh, handedCh                chan string
}

func newCounters() *counters {
	return &counters{received: map[string]int{}, redelivered: map[string]int{}, acked: map[string]int{},
		replayed: map[string]int{}, dead: map[string]int{}, givenUp: map[string]int{}, postponed: map[string]int{}, handedBack: map[string]int{},
		ackedCh: make(chan string, 1024), deadCh: make(chan string, 1024), postponedCh: make(chan string, 1024), handedCh: make(chan string, 1024)}
}

func (c *counters) MessageReceived(op string, redelivered bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.received[op]++
	if redelivered {
		c.redelivered[op]++
	}
}

func (c *counters) MessageAcked(_ context.Context, op string, replayed bool, _ time.Duration) {
	c.mu.Lock()
	c.acked[op]++
	if replayed {
		c.replayed[op]++
	}
	c.mu.Unlock()
	c.ackedCh <- op
}

func (c *counters) MessageDeadLettered(op string) {
	c.mu.Lock()
	c.dead[op]++
	c.mu.Unlock()
	c.deadCh <- op
}

func (c *counters) MessagePostponed(op string) {
	c.mu.Lock()
	c.postponed[op]++
	c.mu.Unlock()
	c.postponedCh <- op
}

func (c *counters) MessageHandedBack(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handedBack[op]++
	select { // one a second per command handed back, for as long as a test holds its intent
	case c.handedCh <- op:
	default:
	}
}

func (c *counters) DeadLetterGivenUp(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.givenUp[op]++
}

func (c *counters) OutboxPublished(published, duplicates int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.published += published
	c.duplicates += duplicates
}

func (c *counters) get(m map[string]int, op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m[op]
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// jsonField reads one top-level string field of a JSON body.
func jsonField(t *testing.T, body []byte, field string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("not JSON: %v: %s", err, body)
	}
	s, _ := m[field].(string)
	return s
}

var _ = bytes.Equal
var _ = io.Discard
