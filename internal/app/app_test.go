package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "app"))
}

func TestBadConfigurationStopsTheStart(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"an unknown log level":                  {"LOG_LEVEL": "loud"},
		"a duration that is not one":            {"IDEMPOTENCY_LEASE": "soon"},
		"a lease shorter than a channel call":   {"IDEMPOTENCY_LEASE": "5s", "PAYMENT_CHANNEL_TIMEOUT": "10s"},
		"a retention of one day":                {"IDEMPOTENCY_RETENTION": "24h"},
		"a payment channel URL that is not one": {"PAYMENT_CHANNEL_URL": "ftp://x"},
		"two tenants sharing a key":             {"API_KEYS": "a=same-key-1,b=same-key-1"},
		"a database URL of another kind":        {"DATABASE_URL": "mysql://x"},
		// Issue 11.2: windows of 60s and a margin of -58s made a 2s retention.
		"a negative retention margin": {"REPLAY_WINDOW_CLIENT_RETRY": "60s", "REPLAY_WINDOW_MESSAGE_REDELIVERY": "60s",
			"REPLAY_WINDOW_MANUAL_COMPENSATION": "60s", "RETENTION_MARGIN": "-58s"},
		"a negative replay window":                        {"REPLAY_WINDOW_CLIENT_RETRY": "-1h"},
		"a lock timeout as long as the statement timeout": {"DB_LOCK_TIMEOUT": "5s", "DB_STATEMENT_TIMEOUT": "5s"},
		"a NATS URL of another kind":                      {"NATS_URL": "http://nats:4222"},
		"no delivery of a command at all":                 {"COMMAND_MAX_DELIVER": "0"},
		"a backoff cap below its first step":              {"COMMAND_BACKOFF": "10s", "COMMAND_BACKOFF_MAX": "1s"},
		"a database URL with a bad port":                  {"DATABASE_URL": "postgres://u@h1:5432,h2:port/db"},
		// Issue 28: a tenant is a subject token and a NATS user; "a.b", "*"
		// or ">" would be patterns in its permissions.
		"a tenant named like a subject pattern": {"API_KEYS": "a.b=key-of-ab-1,c=key-of-c-12"},
		"a tenant named >":                      {"API_KEYS": ">=key-of-gt-1"},
		// Issue 48: a tenant is a token of every subject published for it.
		"a tenant named in 65 bytes": {"API_KEYS": strings.Repeat("t", 65) + "=key-of-long-1"},
		// A window of 0 would be a stream keeping commands forever.
		"a message window of zero":  {"REPLAY_WINDOW_MESSAGE_REDELIVERY": "0s"},
		"five replicas too many":    {"NATS_STREAM_REPLICAS": "7"},
		"a CORS wildcard":           {"CORS_ALLOWED_ORIGINS": "*"},
		"a CORS origin with a path": {"CORS_ALLOWED_ORIGINS": "https://shop.example/app"},

		// Issue 48: a tenant's share of ORDER_COMMANDS is a bound or none (0).
		"a negative share of the commands stream": {"NATS_MAX_COMMANDS_PER_SUBJECT": "-1"},

		// Issue 49: a tenant's limits, and a bound on every phase of a request.
		"limits of a tenant API_KEYS does not name": {"HTTP_TENANT_LIMITS": "initech;weight=2"},
		"a tenant's weight of zero":                 {"HTTP_TENANT_LIMITS": "acme;weight=0"},
		"a tenant limit of no known name":           {"HTTP_TENANT_LIMITS": "acme;burst=3"},
		"a quota window of half a second":           {"HTTP_TENANT_WINDOW": "500ms"},
		"a write timeout shorter than a wait":       {"HTTP_WRITE_TIMEOUT": "10s"},
		"no bound on a body":                        {"HTTP_BODY_TIMEOUT": "0s"},
	} {
		t.Run(name+" is refused in one line", func(t *testing.T) {
			var out bytes.Buffer
			err := app.Run(context.Background(), nil, env, &out)
			if err == nil || strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %v", err)
			}
			t.Log(err)
		})
	}
	t.Run("the unsafe retention names the window that makes it unsafe", func(t *testing.T) {
		err := app.Run(context.Background(), nil, map[string]string{"IDEMPOTENCY_RETENTION": "24h"}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "manual_compensation") {
			t.Fatalf("err = %v", err)
		}
	})
	// Cleanup.Batch and Outbox.Batch are both fields named Batch: the
	// error names the variable, not the field.
	t.Run("a value that does not parse names its variable", func(t *testing.T) {
		err := app.Run(context.Background(), nil, map[string]string{"OUTBOX_BATCH": "many", "CLEANUP_BATCH": "50"}, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), "OUTBOX_BATCH: ") || strings.Contains(err.Error(), "CLEANUP_BATCH") {
			t.Fatalf("err = %v", err)
		}
	})
}

// help and version need no configuration at all: they work where the
// service could not start.
func TestHelpAndVersionNeedNoConfiguration(t *testing.T) {
	bad := map[string]string{"LOG_LEVEL": "loud"}
	for _, arg := range []string{"help", "-h", "--help"} {
		var out bytes.Buffer
		if err := app.Run(context.Background(), []string{arg}, bad, &out); err != nil {
			t.Fatalf("%s: %v", arg, err)
		}
		for _, want := range []string{"serve", "migrate", "cleanup", "dlq replay", "version", "docs/configuration.md"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s does not mention %q:\n%s", arg, want, out.String())
			}
		}
	}
	var out bytes.Buffer
	if err := app.Run(context.Background(), []string{"version"}, bad, &out); err != nil || out.String() != "orderservice "+app.Version()+"\n" || app.Version() == "" {
		t.Errorf("version = %q, %v", out.String(), err)
	}
}

func TestReadiness(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	get := func(path string) int {
		res, err := http.Get(m.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if s := get("/readyz"); s != 200 {
		t.Fatalf("readyz = %d", s)
	}
	t.Run("readyz fails while migrations are pending, healthz stays up", func(t *testing.T) {
		if err := m.DB.Exec("UPDATE schema_migrations SET version = 1").Error; err != nil {
			t.Fatal(err)
		}
		latest, _ := database.LatestVersion()
		defer m.DB.Exec("UPDATE schema_migrations SET version = ?", latest)
		if s := get("/readyz"); s != http.StatusServiceUnavailable {
			t.Errorf("readyz = %d, want 503", s)
		}
		if s := get("/healthz"); s != 200 {
			t.Errorf("healthz = %d", s)
		}
	})
}

func TestShutdownFinishesAcceptedRequests(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "drain=drain-key-1"})
	c := apptest.NewClient(m, "drain-key-1")
	// Orders to pay while the service stops; pm_slow keeps payments in flight.
	ids := make([]string, 20)
	for i := range ids {
		r := c.Do(t, http.MethodPost, "/v1/orders", fmt.Sprintf("drain-create-%d", i),
			`{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":100}]}`)
		ids[i] = r.JSON(t)["id"].(string)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered, refused := 0, 0
	started := make(chan struct{}, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started <- struct{}{}
			var r apptest.Response
			var err error
			if i%2 == 0 {
				r, err = c.Send(http.MethodPost, "/v1/orders/"+ids[i/2]+"/pay", fmt.Sprintf("drain-pay-%d", i), `{"payment_method":"pm_slow"}`, nil)
			} else {
				r, err = c.Send(http.MethodPost, "/v1/orders", fmt.Sprintf("drain-new-%d", i),
					`{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":100}]}`, nil)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil: // the listener was already closed: never accepted
				refused++
			case r.Status >= 500:
				t.Errorf("an accepted request got %d: %s", r.Status, r.Body)
			default:
				answered++
			}
		}()
	}
	for range 40 {
		<-started
	}
	// Close while payments are inside the channel's slow path.
	for deadline := time.Now().Add(5 * time.Second); m.Channel.Stats().Requests < 10 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	wg.Wait()
	t.Logf("answered %d, refused before acceptance %d", answered, refused)
	if answered == 0 {
		t.Fatal("no request was in flight during the shutdown")
	}
	// Close ran the pool down; look at the records through a new connection.
	check := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "drain=drain-key-1"})
	var processing int64
	check.DB.Raw("SELECT count(*) FROM idempotency_records WHERE tenant_id = 'drain' AND state = 'PROCESSING'").Scan(&processing)
	if processing != 0 {
		t.Errorf("%d records left in PROCESSING by the shutdown", processing)
	}
}

func TestMetricsNameTheSeedsFiveSignals(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	c := apptest.NewClient(m, apptest.KeyAcme)
	body := `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":100}]}`
	id := c.Do(t, http.MethodPost, "/v1/orders", "metrics-1", body).JSON(t)["id"].(string)
	c.Do(t, http.MethodPost, "/v1/orders", "metrics-1", body)
	c.Do(t, http.MethodPost, "/v1/orders", "metrics-1", strings.Replace(body, "EUR", "USD", 1))
	c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", "metrics-pay", `{"payment_method":"pm_unavailable_once"}`)
	c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", "metrics-pay", `{"payment_method":"pm_unavailable_once"}`)

	res, err := http.Get(m.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`orderservice_idempotent_requests_total{operation="order.create",outcome="executed"} 1`,
		`orderservice_idempotent_requests_total{operation="order.create",outcome="replayed"} 1`,
		`orderservice_idempotency_key_conflicts_total{operation="order.create"} 1`,
		`orderservice_idempotency_takeovers_total{by="retry",operation="order.pay"} 1`,
		`orderservice_idempotency_processing_expired 0`,
		`orderservice_idempotency_records{state="SUCCEEDED"}`,
		`orderservice_idempotency_table_bytes`,
		`orderservice_payment_channel_call_duration_seconds_count{kind="charge",outcome="ok"} 1`,
		`orderservice_payment_channel_call_duration_seconds_count{kind="charge",outcome="unavailable"} 1`,
		`orderservice_http_request_duration_seconds_count{method="POST",route="/v1/orders",status="201"} 2`,
	} {
		if !bytes.Contains(text, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestOneLogLinePerRequestWithoutSecrets(t *testing.T) {
	var buf lockedBuffer
	cfg := apptest.Config(t, dbURL, map[string]string{"API_KEYS": "logged=secret-key-logged"})
	m, err := app.Start(context.Background(), cfg, slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	c := apptest.NewClient(m, "secret-key-logged")
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	r, err := c.Send(http.MethodPost, "/v1/orders", "log-key-1",
		`{"customer_id":"private-customer-name","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":100}]}`, h)
	if err != nil || r.Status != http.StatusCreated {
		t.Fatalf("create: %v %d %s", err, r.Status, r.Body)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	logs := buf.String()
	for _, secret := range []string{"secret-key-logged", "private-customer-name"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs contain %q", secret)
		}
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		var v map[string]any
		if json.Unmarshal([]byte(l), &v) == nil && v["msg"] == "request" && v["route"] == "/v1/orders" {
			lines = append(lines, v)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("%d request lines for one request:\n%s", len(lines), logs)
	}
	line := lines[0]
	for k, want := range map[string]any{"tenant": "logged", "operation": "order.create", "idempotency_key": "log-key-1",
		"outcome": "executed", "status": float64(201), "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"} {
		if line[k] != want {
			t.Errorf("%s = %v, want %v", k, line[k], want)
		}
	}
	if line["order_id"] != r.JSON(t)["id"] || line["latency_ms"] == nil {
		t.Errorf("line = %v", line)
	}
}

// lockedBuffer is a bytes.Buffer safe for the service's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Issue 11.5: with SHUTDOWN_TIMEOUT=1s a shutdown took 14s, because the
// sweeper finished its whole batch of slow channel calls first.
func TestShutdownIsBoundedBySHUTDOWN_TIMEOUTWithTheSweeperMidBatch(t *testing.T) {
	const shutdownTimeout = time.Second
	env := map[string]string{"API_KEYS": "bounded=bounded-key-1", "SHUTDOWN_TIMEOUT": shutdownTimeout.String(),
		"PAYMENT_CHANNEL_TIMEOUT": "1s", "IDEMPOTENCY_LEASE": "3s", "PAYMENT_RETRY_AFTER": "1s", "SWEEP_INTERVAL": "100ms"}
	m := apptest.Start(t, dbURL, env)
	// Every channel call runs into the 1s channel timeout before anything is
	// charged, so each intent stays retryable and the sweeper keeps a batch
	// of one-second calls going.
	if err := m.Channel.SetFaults(mockchannel.Faults{LatencyMS: 5000}); err != nil {
		t.Fatal(err)
	}
	c := apptest.NewClient(m, "bounded-key-1")
	var wg sync.WaitGroup
	for i := range 8 {
		r := c.Do(t, http.MethodPost, "/v1/orders", fmt.Sprintf("bounded-create-%d", i),
			`{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":100}]}`)
		id := r.JSON(t)["id"].(string)
		wg.Go(func() {
			_, _ = c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", fmt.Sprintf("bounded-pay-%d", i), `{"payment_method":"pm_ok"}`, nil)
		})
	}
	wg.Wait()
	sweeping := func() int64 {
		var n int64
		m.DB.Raw("SELECT count(*) FROM idempotency_records WHERE tenant_id = 'bounded' AND state = 'PROCESSING' AND attempts >= 2").Scan(&n)
		return n
	}
	for deadline := time.Now().Add(10 * time.Second); sweeping() < 2 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if n := sweeping(); n < 2 {
		t.Fatalf("the sweeper took over %d intents, want a batch in flight", n)
	}

	began := time.Now()
	_ = m.Close() // it may report that the deadline cut work short
	took := time.Since(began)
	t.Logf("shutdown took %s with SHUTDOWN_TIMEOUT %s and a sweep batch of 8 one-second calls", took, shutdownTimeout)
	// Unbounded, the batch alone takes 8 × 1s; bounded, the deadline plus
	// the moment cancelled work needs to return. The grace is wide (a loaded
	// machine is slow to return too) and still well short of the batch.
	if took > shutdownTimeout+3*time.Second {
		t.Errorf("shutdown took %s, more than SHUTDOWN_TIMEOUT %s (+3s grace; the unbounded batch takes 8s)", took, shutdownTimeout)
	}
	// Bounded means stopped, not abandoned: no sweep and no request (the
	// channel's, sleeping out its injected latency) is still running against
	// the pool and the ledger that Close has closed.
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	if strings.Contains(stacks, "order.(*Service).Sweep") {
		t.Errorf("a sweep is still running after Close returned")
	}
	if strings.Contains(stacks, "net/http.serverHandler.ServeHTTP") {
		t.Errorf("a request is still being served after Close returned")
	}
	// What the deadline cut short is still there to be taken over.
	check := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "bounded=bounded-key-1"})
	var finished int64
	check.DB.Raw("SELECT count(*) FROM idempotency_records WHERE tenant_id = 'bounded' AND operation = 'order.pay' AND state IN ('SUCCEEDED','FAILED_FINAL')").Scan(&finished)
	var all int64
	check.DB.Raw("SELECT count(*) FROM idempotency_records WHERE tenant_id = 'bounded' AND operation = 'order.pay'").Scan(&all)
	if all != 8 || finished != 0 {
		t.Errorf("pay records = %d (%d finished), want 8 unfinished, left to leases and the sweeper", all, finished)
	}
	check.DB.Exec("DELETE FROM idempotency_records WHERE tenant_id = 'bounded'")
}

func TestAMultiHostDatabaseURLIsAccepted(t *testing.T) {
	cfg, err := app.LoadConfig(map[string]string{"DATABASE_URL": "postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Database.ConnMaxLifetime <= 0 || cfg.Database.StartTimeout <= 0 {
		t.Errorf("defaults: DB_CONN_MAX_LIFETIME %s, DB_START_TIMEOUT %s", cfg.Database.ConnMaxLifetime, cfg.Database.StartTimeout)
	}
}
