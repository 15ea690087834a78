package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/migrations"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

func TestEmbeddedChannelDatabase(t *testing.T) {
	base := map[string]string{"API_KEYS": "acme=demo-key-acme"}
	for name, tc := range map[string]struct{ env, want string }{
		"defaults to paymentchannel on DATABASE_URL's server": {
			"postgres://u:p@db.example:5433/orders?sslmode=disable",
			"postgres://u:p@db.example:5433/paymentchannel?sslmode=disable"},
		"keeps every host of a multi-host DATABASE_URL": {
			"postgres://u@h1:5432,h2:5432/orders?target_session_attrs=read-write",
			"postgres://u@h1:5432,h2:5432/paymentchannel?target_session_attrs=read-write"},
		"adds the database to a URL without one": {"postgres://u@h1", "postgres://u@h1/paymentchannel"},
	} {
		t.Run(name, func(t *testing.T) {
			env := map[string]string{"DATABASE_URL": tc.env}
			for k, v := range base {
				env[k] = v
			}
			cfg, err := app.LoadConfig(env)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Channel.DatabaseURL != tc.want {
				t.Errorf("CHANNEL_DATABASE_URL = %q, want %q", cfg.Channel.DatabaseURL, tc.want)
			}
		})
	}
	t.Run("takes CHANNEL_DATABASE_URL when it is set", func(t *testing.T) {
		cfg, err := app.LoadConfig(map[string]string{"CHANNEL_DATABASE_URL": "postgres://x@y/ledger"})
		if err != nil || cfg.Channel.DatabaseURL != "postgres://x@y/ledger" {
			t.Errorf("config = %q, %v", cfg.Channel.DatabaseURL, err)
		}
	})
	t.Run("refuses a CHANNEL_DATABASE_URL of another kind in one line", func(t *testing.T) {
		err := app.Run(context.Background(), nil, map[string]string{"CHANNEL_DATABASE_URL": "mysql://x"}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "CHANNEL_DATABASE_URL") || strings.Contains(err.Error(), "\n") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestRestartKeepsTheEmbeddedChannelsLedger(t *testing.T) {
	cfg := apptest.Config(t, dbURL, map[string]string{"CHANNEL_DATABASE_URL": testdb.Fresh(t, "app_channel")})
	logger := slog.New(slog.DiscardHandler)
	first, err := app.Start(context.Background(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	c := apptest.NewClient(first, apptest.KeyAcme)
	// Keys of this run: the service's database is the package's, kept
	// between runs (-count), while the channel's is new each time.
	run := uuid.NewString()[:8]
	id := c.Do(t, http.MethodPost, "/v1/orders", "restart-create-"+run,
		`{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":3,"unit_price":700}]}`).JSON(t)["id"].(string)
	paid := c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", "restart-pay-"+run, `{"payment_method":"pm_ok"}`)
	if paid.Status != http.StatusOK {
		t.Fatalf("pay = %d %s", paid.Status, paid.Body)
	}
	second, before := restartWithOneCharge(t, first, cfg, logger)

	t.Run("a charge made before the restart is found after it", func(t *testing.T) {
		if after := second.Channel.Charges(); len(after) != 1 || after[0] != before[0] {
			t.Errorf("charges after the restart = %+v, want %+v", after, before)
		}
		var found payment.Charge
		getJSON(t, "http://"+second.ChannelAddr+"/v1/charges?idempotency_key="+before[0].IdempotencyKey, &found)
		if found != before[0].Charge {
			t.Errorf("lookup after the restart = %+v, want %+v", found, before[0].Charge)
		}
	})

	t.Run("the pay retried after the restart is replayed and charges nothing", func(t *testing.T) {
		again := apptest.NewClient(second, apptest.KeyAcme).Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", "restart-pay-"+run, `{"payment_method":"pm_ok"}`)
		if again.Status != http.StatusOK || again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(paid.Body) {
			t.Errorf("retried pay = %d %s, want the first answer replayed", again.Status, again.Body)
		}
	})

	t.Run("the channel key sent again after the restart is absorbed, not charged", func(t *testing.T) {
		ch := before[0].Charge
		client := payment.NewClient("http://"+second.ChannelAddr, http.DefaultClient)
		res, err := client.Charge(context.Background(), ch.IdempotencyKey, payment.ChargeRequest{
			Amount: ch.Amount, Currency: ch.Currency, Reference: ch.Reference, PaymentMethod: ch.PaymentMethod})
		if err != nil || !res.Replayed || res.Value != ch {
			t.Errorf("charge again = %+v, %v; want %+v replayed", res, err, ch)
		}
		if s := second.Channel.Stats(); s != (mockchannel.Stats{Charges: 1, DuplicatesAbsorbed: 1, Requests: 2, Lookups: 1, AmountCharged: 2100}) {
			t.Errorf("channel stats = %+v, want the one charge from before the restart and one duplicate absorbed", s)
		}
	})
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s", url, res.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(fmt.Errorf("decode %s: %w", b, err))
	}
}

func TestRestartFinishesAPaymentTheChannelMadeBeforeIt(t *testing.T) {
	// The service stops right after the channel charged, before it recorded
	// the outcome. The restarted service's sweeper asks the channel by the
	// propagated key: a channel that forgot would answer "not found", and the
	// intent would charge a second time.
	cfg := apptest.Config(t, dbURL, map[string]string{"CHANNEL_DATABASE_URL": testdb.Fresh(t, "app_channel"),
		"API_KEYS": "restart=restart-key-1"})
	logger := slog.New(slog.DiscardHandler)
	first, err := app.Start(context.Background(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = first.Close() })
	c := apptest.NewClient(first, "restart-key-1")
	id := c.Do(t, http.MethodPost, "/v1/orders", "died-create",
		`{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":900}]}`).JSON(t)["id"].(string)
	first.Orders.Hooks.AfterChannelCall = func() error { return fmt.Errorf("the process dies here") }
	if r := c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", "died-pay", `{"payment_method":"pm_ok"}`); r.Status != http.StatusInternalServerError {
		t.Fatalf("pay that dies after the channel call = %d %s, want 500", r.Status, r.Body)
	}
	second, before := restartWithOneCharge(t, first, cfg, logger)
	c = apptest.NewClient(second, "restart-key-1")
	var status string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if status = c.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil).JSON(t)["status"].(string); status == "PAID" {
			break
		}
	}
	if status != "PAID" {
		t.Fatalf("order after the restart = %s, want PAID by the sweeper", status)
	}
	// One charge, one POST (the first instance's), and at least one
	// lookup: the sweeper's. On a loaded machine a sweeper's round can
	// outlast its 3s lease and the next round looks the key up again;
	// lookups change nothing, so how many there were is no harm.
	if s := second.Channel.Stats(); s.Charges != 1 || s.AmountCharged != 900 || s.Requests != 1 || s.Lookups < 1 {
		t.Errorf("channel stats = %+v, want the one charge made before the restart, found by a lookup and never sent again", s)
	}
	if after := second.Channel.Charges(); len(after) != 1 || after[0].ID != before[0].ID {
		t.Errorf("charges after the restart = %+v, want only %s, made before it", after, before[0].ID)
	}
}

func TestMigrateCreatesTheEmbeddedChannelsDatabase(t *testing.T) {
	chURL := testdb.Fresh(t, "app_channel_migrate")
	var out strings.Builder
	err := app.Run(context.Background(), []string{"migrate"}, map[string]string{"DATABASE_URL": dbURL, "CHANNEL_DATABASE_URL": chURL}, &out)
	if err != nil {
		t.Fatalf("migrate: %v\n%s", err, out.String())
	}
	ups, err := fs.Glob(migrations.ChannelFS, "channel/*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("payment channel database schema at version %d", len(ups)); !strings.Contains(out.String(), want) {
		t.Errorf("migrate printed %q, want %q: the channel's latest migration", out.String(), want)
	}
	ch, err := mockchannel.Open(context.Background(), chURL, mockchannel.Options{})
	if err != nil {
		t.Fatalf("open the migrated channel database: %v", err)
	}
	defer ch.Close()
	ts := httptest.NewServer(ch.Handler())
	defer ts.Close()
	var st mockchannel.Stats
	getJSON(t, ts.URL+"/admin/stats", &st) // fails unless the ledger's tables are there
	if st != (mockchannel.Stats{}) {
		t.Errorf("stats of the new channel database = %+v, want zero", st)
	}
}

// restartWithOneCharge checks that first's channel holds exactly one
// charge, stops first and starts the service again on the same databases.
func restartWithOneCharge(t *testing.T, first *app.Main, cfg app.Config, logger *slog.Logger) (*app.Main, []mockchannel.ChargeRecord) {
	t.Helper()
	before := first.Channel.Charges()
	if len(before) != 1 {
		t.Fatalf("channel charges before the restart = %+v, want 1", before)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	second, err := app.Start(context.Background(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Close() })
	return second, before
}

// The embedded channel remembers a key exactly as long as the service
// trusts it to (PAYMENT_CHANNEL_KEY_WINDOW): a longer trust than the
// channel's memory would let a resumed pay charge twice.
func TestTheEmbeddedChannelKeepsAKeyAsLongAsTheServiceTrustsIt(t *testing.T) {
	const window = 3 * time.Second
	m := apptest.Start(t, dbURL, map[string]string{"PAYMENT_CHANNEL_KEY_WINDOW": window.String()})
	pc := payment.NewClient("http://"+m.ChannelAddr, nil)
	ctx := context.Background()
	key := "window-" + uuid.NewString()[:8]
	req := payment.ChargeRequest{Amount: 100, Currency: "EUR", Reference: key, PaymentMethod: "pm_ok"}
	first, err := pc.Charge(ctx, key, req)
	if err != nil {
		t.Fatal(err)
	}
	made := time.Now() // the charge was made before this
	if again, err := pc.Charge(ctx, key, req); err != nil || !again.Replayed || again.Value.ID != first.Value.ID {
		t.Fatalf("within the window: %+v, %v; want the first charge replayed", again, err)
	}
	time.Sleep(time.Until(made.Add(window + 200*time.Millisecond)))
	past, err := pc.Charge(ctx, key, req)
	if err != nil || past.Replayed || past.Value.ID == first.Value.ID {
		t.Errorf("past PAYMENT_CHANNEL_KEY_WINDOW: %+v, %v; want a new charge, as the channel forgot the key", past, err)
	}
}
