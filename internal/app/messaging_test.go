package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/tests/apptest"
)

// preCreateCommandsStream makes ORDER_COMMANDS with maxAge in storeDir, as
// an operator who configured the broker before the service would.
func preCreateCommandsStream(t *testing.T, storeDir string, maxAge time.Duration) {
	t.Helper()
	srv, err := messaging.StartEmbedded(messaging.EmbeddedOptions{Addr: "127.0.0.1:0", StoreDir: storeDir, ServicePassword: "orderservice-dev-secret"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	nc, err := nats.Connect(srv.URL(), nats.UserInfo(messaging.ServiceUser, "orderservice-dev-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: messaging.CommandsStream,
		Subjects: []string{messaging.CommandPrefix + ">"}, MaxAge: maxAge}); err != nil {
		t.Fatal(err)
	}
}

func TestTheBrokersRedeliveryWindowMustFitTheRetention(t *testing.T) {
	for name, tc := range map[string]struct {
		maxAge    time.Duration
		retention string
		want      string
	}{
		"a stream keeping commands longer than the records": {1000 * time.Hour, "800h", "ORDER_COMMANDS keeps messages for 1000h0m0s"},
		"a stream keeping commands forever":                 {0, "", "forever"},
	} {
		t.Run(name+" stops the start with a one-line reason", func(t *testing.T) {
			dir := t.TempDir()
			preCreateCommandsStream(t, dir, tc.maxAge)
			env := map[string]string{"NATS_STORE_DIR": dir}
			if tc.retention != "" {
				env["IDEMPOTENCY_RETENTION"] = tc.retention
			}
			cfg := apptest.Config(t, dbURL, env)
			m, err := app.Start(context.Background(), cfg, slog.New(slog.DiscardHandler))
			if err == nil {
				m.Close()
				t.Fatal("the service started")
			}
			if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "refusing to start") {
				t.Fatalf("err = %v", err)
			}
			t.Log(err)
		})
	}
	t.Run("a stream the records cover starts, and the policy names the stream as the window's source", func(t *testing.T) {
		dir := t.TempDir()
		preCreateCommandsStream(t, dir, 72*time.Hour)
		m := apptest.Start(t, dbURL, map[string]string{"NATS_STORE_DIR": dir})
		r := apptest.NewClient(m, apptest.KeyAcme).Do(t, http.MethodGet, "/v1/idempotency-policy", "", nil)
		p := r.JSON(t)
		windows := p["replay_windows"].(map[string]any)
		sources := p["window_sources"].(map[string]any)
		if windows["message_redelivery"] != "72h0m0s" || sources["message_redelivery"] != "stream ORDER_COMMANDS max_age" {
			t.Errorf("policy = %s", r.Body)
		}
		if p["outbox_retention"] != "744h0m0s" {
			t.Errorf("outbox_retention = %v", p["outbox_retention"])
		}
	})
}

// Tests and demos run windows of seconds: every window the configuration
// accepts starts the service, and the streams it creates carry them (a
// duplicate window never longer than the stream's max_age).
func TestShortWindowsStartTheService(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"REPLAY_WINDOW_CLIENT_RETRY": "10s",
		"REPLAY_WINDOW_MESSAGE_REDELIVERY": "60s", "REPLAY_WINDOW_MANUAL_COMPENSATION": "30s", "RETENTION_MARGIN": "5s"})
	for name, want := range map[string]time.Duration{messaging.CommandsStream: time.Minute, messaging.DLQStream: 30 * time.Second,
		messaging.ResultsStream: time.Minute, messaging.EventsStream: time.Minute} {
		s, err := m.Door.JS().Stream(context.Background(), name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if cfg := s.CachedInfo().Config; cfg.MaxAge != want || cfg.Duplicates > cfg.MaxAge {
			t.Errorf("%s: max_age %s (want %s), duplicates %s", name, cfg.MaxAge, want, cfg.Duplicates)
		}
	}
	// The chain: a client's retry by message, redelivered for a minute.
	p := apptest.NewClient(m, apptest.KeyAcme).Do(t, http.MethodGet, "/v1/idempotency-policy", "", nil).JSON(t)
	if p["longest_window"] != "client_retry+message_redelivery" {
		t.Errorf("longest_window = %v, want the chain of client_retry and message_redelivery", p["longest_window"])
	}
}

// A dead letter first published longer ago than its record is sure to be
// kept is refused by `dlq replay`, with the reason, and kept; the others are
// replayed. The scenario of issue 28: an HTTP create, the same command
// dead-lettered long ago, the record cleaned up since: a replay would have
// made a second order for one key.
func TestDLQReplayRefusesADeadLetterWhoseRecordMayBeGone(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	c := apptest.NewClient(m, apptest.KeyAcme)
	body := map[string]any{"customer_id": "cus_gone", "currency": "EUR", "items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": 500}}}
	if r := c.Do(t, http.MethodPost, "/v1/orders", "gone-create", body); r.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.Status, r.Body)
	}
	env := map[string]string{"NATS_EMBEDDED_ADDR": m.Embedded.Addr(), "LOG_LEVEL": "warn", "DATABASE_URL": dbURL}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := app.Run(context.Background(), args, env, &out)
		return out.String(), err
	}
	if err := m.DB.Exec("UPDATE idempotency_records SET expires_at = now() - interval '1 second' WHERE idempotency_key = 'gone-create'").Error; err != nil {
		t.Fatal(err)
	}
	if out, err := run("cleanup"); err != nil {
		t.Fatalf("cleanup: %v\n%s", err, out)
	}

	// Two dead letters of that create, as the consumer writes them: one
	// first published 700h ago (past the default policy's horizon of
	// 744h - 24h margin - 24h client retry = 696h), one an hour ago.
	bodyJSON, _ := json.Marshal(body)
	for key, age := range map[string]time.Duration{"gone-create": 700 * time.Hour, "recent-create": time.Hour} {
		d := nats.NewMsg(messaging.DLQPrefix + "commands.acme.create")
		d.Header.Set(messaging.HeaderKey, key)
		d.Header.Set(messaging.HeaderDLSubject, messaging.CommandSubject("acme", "create"))
		d.Header.Set(messaging.HeaderReason, "still failing after 5 deliveries: 503 service_unavailable")
		d.Header.Set(messaging.HeaderFirstPublished, time.Now().Add(-age).UTC().Format(time.RFC3339Nano))
		d.Data = bodyJSON
		if _, err := m.Door.JS().PublishMsg(context.Background(), d); err != nil {
			t.Fatal(err)
		}
	}
	out, err := run("dlq", "replay", "--all")
	if err == nil || !strings.Contains(out, "record may be gone") || !strings.Contains(out, "replayed") || !strings.Contains(out, "1 dead-lettered commands replayed, 1 kept") {
		t.Fatalf("dlq replay: %v\n%s", err, out)
	}
	t.Log(out)
	deadline := time.Now().Add(time.Minute)
	for apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'recent-create'") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the recent dead letter was never run")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM orders WHERE customer_id = 'cus_gone'"); n != 2 {
		t.Errorf("orders = %d, want 2: the HTTP create's and the recent dead letter's, not a third for the old one", n)
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'gone-create'"); n != 0 {
		t.Errorf("the refused dead letter made a record (%d)", n)
	}
	if list, _ := run("dlq", "list"); !strings.Contains(list, "gone-create") || !strings.Contains(list, "1 dead-lettered commands") {
		t.Errorf("dlq list after the replay:\n%s", list)
	}
}

func TestOperatorReplaysADeadLetteredCommand(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	c := apptest.NewClient(m, apptest.KeyAcme)
	admin := &apptest.Client{BaseURL: "http://" + m.ChannelAddr, HTTP: &http.Client{Timeout: 10 * time.Second}}
	created := c.Do(t, http.MethodPost, "/v1/orders", "ops-create", map[string]any{"customer_id": "cus_ops", "currency": "EUR",
		"items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": 500}}})
	id := created.JSON(t)["id"].(string)
	if r := admin.Do(t, http.MethodPost, "/admin/faults", "", map[string]any{"unavailable_rate": 1}); r.Status != http.StatusOK {
		t.Fatalf("faults: %d", r.Status)
	}

	acme, err := nats.Connect(m.NATSURL, nats.UserInfo("acme", apptest.KeyAcme), nats.CustomInboxPrefix(messaging.InboxPrefix("acme")))
	if err != nil {
		t.Fatal(err)
	}
	defer acme.Close()
	results := make(chan *nats.Msg, 8)
	if _, err := acme.ChanSubscribe(messaging.ResultSubject("acme", "pay"), results); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(acme)
	cmd := nats.NewMsg(messaging.CommandSubject("acme", "pay"))
	cmd.Header.Set(messaging.HeaderKey, "ops-pay")
	cmd.Data = []byte(fmt.Sprintf(`{"order_id":%q,"payment_method":"pm_ok"}`, id))
	if _, err := js.PublishMsg(context.Background(), cmd); err != nil {
		t.Fatal(err)
	}

	env := map[string]string{"NATS_EMBEDDED_ADDR": m.Embedded.Addr(), "LOG_LEVEL": "warn"}
	run := func(args ...string) string {
		var out bytes.Buffer
		if err := app.Run(context.Background(), args, env, &out); err != nil {
			t.Fatalf("orderservice %s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(run("dlq", "list"), "1 dead-lettered commands") {
		if time.Now().After(deadline) {
			t.Fatalf("the command never reached the DLQ:\n%s", run("dlq", "list"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	list := run("dlq", "list")
	if !strings.Contains(list, "ops-pay") || !strings.Contains(list, "orders.commands.acme.pay") || !strings.Contains(list, "after 5 deliveries") {
		t.Errorf("dlq list:\n%s", list)
	}
	if len(results) != 0 {
		t.Errorf("%d results before the replay", len(results))
	}
	if got := apptest.Metric(t, m.URL(), "orderservice_dlq_depth"); got != 1 {
		t.Errorf("orderservice_dlq_depth = %v with one dead letter, want 1", got)
	}

	if r := admin.Do(t, http.MethodPost, "/admin/faults", "", map[string]any{"unavailable_rate": 0}); r.Status != http.StatusOK {
		t.Fatalf("faults: %d", r.Status)
	}
	out := run("dlq", "replay", "--all")
	if !strings.Contains(out, "replayed 1 to orders.commands.acme.pay (Idempotency-Key ops-pay)") {
		t.Errorf("dlq replay:\n%s", out)
	}
	select {
	case r := <-results:
		if r.Header.Get(messaging.HeaderStatus) != "200" {
			t.Errorf("result %v %s", r.Header, r.Data)
		}
	case <-time.After(time.Minute):
		t.Fatal("no result after the replay")
	}
	if got := c.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil).JSON(t)["status"]; got != "PAID" {
		t.Errorf("status = %v", got)
	}
	if got := m.Channel.Stats().Charges; got != 1 {
		t.Errorf("charges = %d, want 1", got)
	}
	if !strings.Contains(run("dlq", "list"), "0 dead-lettered commands") {
		t.Error("the DLQ still holds the replayed command")
	}
	if got := apptest.Metric(t, m.URL(), "orderservice_dlq_depth"); got != 0 {
		t.Errorf("orderservice_dlq_depth = %v after the replay, want 0", got)
	}
}

func TestMessageMetricsAreExportedFromTheStart(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	res, err := http.Get(m.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, op := range messaging.Ops {
		for _, name := range []string{"received", "acked", "redelivered", "dead_lettered", "replayed"} {
			line := fmt.Sprintf("orderservice_messages_%s_total{op=%q} 0\n", name, op)
			if !bytes.Contains(body, []byte(line)) {
				t.Errorf("/metrics has no %q", strings.TrimSpace(line))
			}
		}
	}
	for _, line := range []string{"orderservice_outbox_lag_seconds ", "orderservice_dlq_depth 0\n", `orderservice_outbox_relay_publishes_total{result="published"} `,
		`orderservice_outbox_relay_publishes_total{result="duplicate"} 0`} {
		if !bytes.Contains(body, []byte(line)) {
			t.Errorf("/metrics has no %q", line)
		}
	}
}
