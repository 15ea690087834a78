package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testproc"
)

// The broker door (issue 48): whatever closes the service's connection to
// NATS under a running instance (the broker stopped for longer than a
// blip, the server closing it for a protocol error or for credentials it
// no longer accepts), the service is never up and deaf. While the door is
// down, /readyz answers 503 naming the broker and
// orderservice_broker_door_up (the alert's metric) is 0; when the broker
// is back the door opens again by itself: /readyz 200, commands answered,
// and the outbox events written meanwhile published.
func TestTheBrokerDoorComesBackByItself(t *testing.T) {
	b := startBroker(t)
	m := apptest.Start(t, dbURL, map[string]string{"NATS_URL": b.serviceURL()})
	acme := apptest.NewClient(m, apptest.KeyAcme)
	answered(t, b, "door-before")
	waitDoor(t, m, http.StatusOK)

	t.Run("the broker stopped and started again", func(t *testing.T) {
		b.stop()
		waitDoor(t, m, http.StatusServiceUnavailable)
		r := acme.Do(t, http.MethodPost, "/v1/orders", "door-while-down", map[string]any{"customer_id": "cus_door_down",
			"currency": "EUR", "items": []map[string]any{{"sku": "S", "quantity": 1, "unit_price": 100}}})
		if r.Status != http.StatusCreated {
			t.Fatalf("a create over HTTP while the broker is down: %d %s", r.Status, r.Body)
		}
		b.start()
		waitDoor(t, m, http.StatusOK)
		answered(t, b, "door-after-restart")
		published(t, b, r.JSON(t)["id"].(string))
	})

	t.Run("the server closed the connection for a protocol error", func(t *testing.T) {
		reopened := apptest.Metric(t, m.URL(), "orderservice_broker_door_reopened_total")
		conn := m.Door.Conn()
		// A control line longer than the server's max_control_line (4KB):
		// it answers -ERR 'Maximum Control Line Exceeded' and closes the
		// connection, which nats.go then never reconnects.
		if err := conn.Publish("orders.x."+strings.Repeat("x", 5000), nil); err != nil {
			t.Fatal(err)
		}
		apptest.Eventually(t, time.Minute, "the connection closed by the server", func() (bool, string) {
			return conn.IsClosed(), conn.Status().String()
		})
		waitReopened(t, m, reopened)
		if err := conn.LastError(); err == nil || !strings.Contains(err.Error(), "maximum control line exceeded") {
			t.Errorf("the old connection's last error = %v, want the server's \"maximum control line exceeded\"", err)
		}
		waitDoor(t, m, http.StatusOK)
		answered(t, b, "door-after-protocol-error")
	})

	t.Run("the broker came back without the service's credentials, then with them", func(t *testing.T) {
		reopened := apptest.Metric(t, m.URL(), "orderservice_broker_door_reopened_total")
		conn := m.Door.Conn()
		all := b.users
		b.stop()
		b.users = all[1:] // the service's user removed: nats.go gives up after two refusals in a row
		b.start()
		apptest.Eventually(t, time.Minute, "the connection closed after its credentials were refused", func() (bool, string) {
			return conn.IsClosed(), fmt.Sprint(conn.Status(), " ", conn.LastError())
		})
		if err := conn.LastError(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Errorf("the old connection's last error = %v, want the server's authorization violation", err)
		}
		waitDoor(t, m, http.StatusServiceUnavailable)
		b.stop()
		b.users = all
		b.start()
		waitReopened(t, m, reopened)
		waitDoor(t, m, http.StatusOK)
		answered(t, b, "door-after-auth")
	})
}

// testBroker is a NATS server with JetStream that a test stops, starts
// again and reconfigures under a running service, always on one address
// with one store, as a broker restarted in place would be.
type testBroker struct {
	t     *testing.T
	opts  server.Options
	srv   *server.Server
	users []*server.User
}

const brokerPassword = "door-test-secret"

func startBroker(t *testing.T) *testBroker {
	host, port, _ := strings.Cut(testproc.FreeAddr(t), ":")
	b := &testBroker{t: t, users: []*server.User{{Username: messaging.ServiceUser, Password: brokerPassword}}}
	for tenant, key := range map[string]string{"acme": apptest.KeyAcme, "globex": apptest.KeyGlobex} {
		b.users = append(b.users, &server.User{Username: tenant, Password: key, Permissions: messaging.TenantPermissions(tenant)})
	}
	fmt.Sscan(port, &b.opts.Port)
	b.opts.Host, b.opts.JetStream, b.opts.StoreDir, b.opts.NoSigs, b.opts.NoLog = host, true, t.TempDir(), true, true
	b.start()
	t.Cleanup(b.stop)
	return b
}

func (b *testBroker) start() {
	b.t.Helper()
	opts := b.opts
	opts.Users = b.users
	srv, err := server.NewServer(&opts)
	if err != nil {
		b.t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		b.t.Fatal("the test broker did not start")
	}
	b.srv = srv
}

func (b *testBroker) stop() {
	if b.srv != nil {
		b.srv.Shutdown()
		b.srv.WaitForShutdown()
		b.srv = nil
	}
}

func (b *testBroker) addr() string { return fmt.Sprintf("%s:%d", b.opts.Host, b.opts.Port) }

func (b *testBroker) serviceURL() string {
	return "nats://" + messaging.ServiceUser + ":" + brokerPassword + "@" + b.addr()
}

// answered publishes a create as acme and waits for its result.
func answered(t *testing.T, b *testBroker, key string) {
	t.Helper()
	nc, err := nats.Connect("nats://"+b.addr(), nats.UserInfo("acme", apptest.KeyAcme), nats.CustomInboxPrefix(messaging.InboxPrefix("acme")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	results, err := nc.SubscribeSync(messaging.ResultSubject("acme", "create"))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	m := nats.NewMsg(messaging.CommandSubject("acme", "create"))
	m.Header.Set(messaging.HeaderKey, key)
	m.Data = []byte(`{"customer_id":"cus_` + key + `","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":100}]}`)
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatalf("publish %s: %v", key, err)
	}
	for {
		r, err := results.NextMsg(time.Minute)
		if err != nil {
			t.Fatalf("no result for the command %s: %v", key, err)
		}
		if r.Header.Get(messaging.HeaderKey) == key {
			if r.Header.Get(messaging.HeaderStatus) != "201" {
				t.Errorf("%s: %v %s", key, r.Header, r.Data)
			}
			return
		}
	}
}

// published waits for the created event of order id in ORDER_EVENTS.
func published(t *testing.T, b *testBroker, id string) {
	t.Helper()
	nc, err := nats.Connect(b.serviceURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	apptest.Eventually(t, time.Minute, "the created event of "+id+" published", func() (bool, string) {
		s, err := js.Stream(ctx, messaging.EventsStream)
		if err != nil {
			return false, err.Error()
		}
		info, err := s.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			var ev order.EventMessage
			if json.Unmarshal(m.Data, &ev) == nil && ev.Event == "created" && ev.OrderID == id {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events in %s, none for %s", info.State.Msgs, messaging.EventsStream, id)
	})
}

// waitDoor waits until /readyz answers status, and the alert's metric
// says the same: a 503 names the broker, and the door is down.
func waitDoor(t *testing.T, m *app.Main, status int) {
	t.Helper()
	up := map[int]float64{http.StatusOK: 1, http.StatusServiceUnavailable: 0}[status]
	start := time.Now()
	defer func() { t.Logf("/readyz %d after %s", status, time.Since(start).Round(time.Millisecond)) }()
	apptest.Eventually(t, time.Minute, fmt.Sprintf("/readyz %d", status), func() (bool, string) {
		r, err := http.Get(m.URL() + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		defer r.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		return r.StatusCode == status, fmt.Sprint(r.StatusCode, body)
	})
	if status != http.StatusOK {
		r, err := http.Get(m.URL() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var p map[string]any
		_ = json.NewDecoder(r.Body).Decode(&p)
		if detail, _ := p["detail"].(string); r.StatusCode != status || !strings.Contains(detail, "broker") || p["code"] != "service_unavailable" {
			t.Errorf("/readyz = %d %v, want a 503 problem naming the broker", r.StatusCode, p)
		}
	}
	if got := apptest.Metric(t, m.URL(), "orderservice_broker_door_up"); got != up {
		t.Errorf("orderservice_broker_door_up = %v with /readyz %d, want %v", got, status, up)
	}
}

// waitReopened waits until the door was opened again since it had been
// reopened times.
func waitReopened(t *testing.T, m *app.Main, reopened float64) {
	t.Helper()
	apptest.Eventually(t, time.Minute, "the broker door opened again", func() (bool, string) {
		got := apptest.Metric(t, m.URL(), "orderservice_broker_door_reopened_total")
		return got == reopened+1, fmt.Sprint("reopened ", got, " times")
	})
}
