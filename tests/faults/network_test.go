//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/tests/testdb"
	"github.com/orderservice/orderservice/tests/testproc"
)

// chaosStage is one set of toxics in force at once, with the channel's
// own faults (its admin API) alongside.
type chaosStage struct {
	name                  string
	db, channel, clientIn []toxic
	channelFaults         map[string]any
}

// chaosStages degrade, in turn, the service's connections to PostgreSQL,
// its connections to the channel, and the clients' connections to it:
// latency, connections reset mid-stream, black holes that close later,
// answers cut short or lost after the work was done.
var chaosStages = []chaosStage{
	{name: "latency everywhere",
		db:       []toxic{{"latency", "downstream", 1, map[string]any{"latency": 30, "jitter": 30}}, {"latency", "upstream", 1, map[string]any{"latency": 10, "jitter": 10}}},
		channel:  []toxic{{"latency", "downstream", 1, map[string]any{"latency": 300, "jitter": 200}}},
		clientIn: []toxic{{"latency", "downstream", 1, map[string]any{"latency": 50, "jitter": 50}}}},
	{name: "database connections reset, client answers lost",
		db:       []toxic{{"reset_peer", "downstream", 0.3, map[string]any{"timeout": 0}}},
		clientIn: []toxic{{"reset_peer", "downstream", 0.15, map[string]any{"timeout": 0}}}},
	{name: "channel answers lost or cut short after the charge, or refused before it",
		channel:       []toxic{{"reset_peer", "downstream", 0.5, map[string]any{"timeout": 0}}, {"limit_data", "downstream", 0.3, map[string]any{"bytes": 64}}},
		channelFaults: map[string]any{"lost_response_rate": 0.3, "unavailable_rate": 0.2}},
	{name: "database and client requests into black holes",
		db:       []toxic{{"timeout", "upstream", 0.3, map[string]any{"timeout": 700}}},
		clientIn: []toxic{{"timeout", "upstream", 0.1, map[string]any{"timeout": 1500}}}},
	{name: "channel answers later than the service waits",
		channel: []toxic{{"timeout", "downstream", 0.5, map[string]any{"timeout": 2500}}},
		db:      []toxic{{"latency", "downstream", 1, map[string]any{"latency": 100, "jitter": 100}}}},
	{name: "answers cut short and sliced",
		db: []toxic{{"limit_data", "downstream", 0.4, map[string]any{"bytes": 4096}},
			{"slicer", "upstream", 1, map[string]any{"average_size": 32, "size_variation": 16, "delay": 20}}},
		channel:  []toxic{{"slicer", "downstream", 1, map[string]any{"average_size": 16, "size_variation": 8, "delay": 10}}},
		clientIn: []toxic{{"limit_data", "downstream", 0.2, map[string]any{"bytes": 200}}}},
}

// intentOutcome is what a client finally got for one create-and-pay.
type intentOutcome struct {
	orderID     string
	method      string
	createErr   error
	createCalls int
	payStatus   client.Status
	payErr      error
	payCalls    int
	replayed    int
}

func TestNetworkFaultsNeverDuplicateOrdersOrCharges(t *testing.T) {
	intents, cycles := 60, 2
	if testing.Short() {
		intents, cycles = 24, 1
	}
	const stageLength = 1500 * time.Millisecond
	chaos := time.Duration(cycles*len(chaosStages)) * stageLength

	dbURL := freshDB(t)
	db := openDB(t, dbURL)
	ch := startChannel(t, time.Second)
	srv := newProxyServer()
	dbProxy := newFaultProxy(t, srv, "postgres", hostPort(t, testdb.ServerURL()))
	chProxy := newFaultProxy(t, srv, "channel", strings.TrimPrefix(ch.url, "http://"))
	var clientProxies []*faultProxy
	for i := range 2 {
		addr := testproc.FreeAddr(t)
		startService(t, fmt.Sprintf("orderservice-%d", i+1), serviceEnv(withHost(t, dbURL, dbProxy.Addr), addr, "http://"+chProxy.Addr))
		clientProxies = append(clientProxies, newFaultProxy(t, srv, fmt.Sprintf("clients-%d", i+1), addr))
	}
	seen := &answerTally{}
	clients := make([]*client.Client, len(clientProxies))
	for i, p := range clientProxies {
		clients[i] = newClient("http://"+p.Addr, 5*time.Second, seen)
	}

	// Intents start one after another across the chaos, so that every
	// stage meets creates and pays in every phase.
	outcomes := make([]intentOutcome, intents)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range intents {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * chaos / time.Duration(intents))
			outcomes[i] = runIntent(clients[i%2], clients[(i+1)%2], i)
		})
	}

	clearAll := func() {
		for _, p := range append([]*faultProxy{dbProxy, chProxy}, clientProxies...) {
			p.clear()
		}
	}
	for c := range cycles {
		for _, st := range chaosStages {
			t.Logf("cycle %d: %s", c+1, st.name)
			dbProxy.add(t, st.db...)
			chProxy.add(t, st.channel...)
			for _, p := range clientProxies {
				p.add(t, st.clientIn...)
			}
			if st.channelFaults != nil {
				ch.setFaults(t, st.channelFaults)
			}
			time.Sleep(stageLength)
			clearAll()
			ch.setFaults(t, nil)
		}
	}
	var cleared time.Time
	if err := db.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&cleared); err != nil {
		t.Fatal(err)
	}
	t.Logf("toxics removed after %s", time.Since(began).Round(time.Millisecond))

	t.Run("no record stays unfinished longer than lease + sweep interval after the faults end", func(t *testing.T) {
		bound := lease + sweepInterval + time.Second
		deadline := time.Now().Add(bound)
		for {
			stuck := count(t, db, `SELECT count(*) FROM idempotency_records
				WHERE state IN ('PROCESSING', 'FAILED_RETRYABLE') AND updated_at <= $1`, cleared)
			if stuck == 0 {
				t.Logf("every record unfinished when the faults ended had moved on within %s", time.Since(cleared).Round(time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%d records unfinished since before the faults ended are still untouched %s later (lease %s + sweep %s)",
					stuck, bound, lease, sweepInterval)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	wg.Wait()
	t.Logf("all %d intents answered %s after the start", intents, time.Since(began).Round(time.Millisecond))

	okPays, declinedPays := 0, 0 // the pay intents of each kind
	for i := range intents {
		if payMethod(i) == "pm_ok" {
			okPays++
		} else {
			declinedPays++
		}
	}
	calls, replays := 0, 0
	for i, o := range outcomes {
		calls += o.createCalls + o.payCalls
		replays += o.replayed
		if o.createErr != nil {
			t.Errorf("intent %d: create ended with %v", i, o.createErr)
			continue
		}
		switch {
		case o.method == "pm_ok" && o.payErr == nil && o.payStatus == client.StatusPaid:
		case o.method == "pm_declined" && client.IsDeclined(o.payErr):
		default:
			t.Errorf("intent %d (%s, order %s): pay ended with %s %v", i, o.method, o.orderID, o.payStatus, o.payErr)
		}
	}
	stats := ch.stats(t)
	answers := seen.snapshot()
	t.Logf("%d intents: %d paid, %d declined; %d client calls, %d answered by replay; channel %+v",
		intents, okPays, declinedPays, calls, replays, stats)
	t.Logf("every attempt's answer: %s", answers)

	t.Run("transient failures answer 503 or 409 request_in_progress with Retry-After, never 500", func(t *testing.T) {
		for label, n := range answers {
			if strings.HasPrefix(label, "5") && label != "503 service_unavailable" || strings.HasSuffix(label, "without Retry-After") {
				t.Errorf("%d answers %q during the faults; a dropped database or channel connection is transient: 503 with Retry-After", n, label)
			}
		}
	})

	t.Run("every intent ends SUCCEEDED or FAILED_FINAL", func(t *testing.T) {
		if n := unfinishedRecords(t, db); n != 0 {
			t.Errorf("unfinished records = %d, want 0", n)
		}
		if got := recordStates(t, db, "order.create"); got["SUCCEEDED"] != intents || len(got) != 1 {
			t.Errorf("order.create records = %v, want {SUCCEEDED: %d}", got, intents)
		}
		if got := recordStates(t, db, "order.pay"); got["SUCCEEDED"] != okPays || got["FAILED_FINAL"] != declinedPays || len(got) > 2 {
			t.Errorf("order.pay records = %v, want {SUCCEEDED: %d, FAILED_FINAL: %d}", got, okPays, declinedPays)
		}
	})
	t.Run("orders == create intents", func(t *testing.T) {
		if n := count(t, db, `SELECT count(*) FROM orders`); n != intents {
			t.Errorf("orders = %d, want %d", n, intents)
		}
		if n := count(t, db, `SELECT count(DISTINCT customer_id) FROM orders`); n != intents {
			t.Errorf("customers with an order = %d, want %d (one order each)", n, intents)
		}
		for i, o := range outcomes {
			if o.orderID == "" {
				continue
			}
			if n := count(t, db, `SELECT count(*) FROM orders WHERE id = $1 AND customer_id = $2`, o.orderID, createBody("chaos", i).CustomerID); n != 1 {
				t.Errorf("intent %d: the order its client got (%s) is not its customer's order", i, o.orderID)
			}
		}
		if n := count(t, db, `SELECT count(*) FROM orders WHERE status = 'PAID'`); n != okPays {
			t.Errorf("PAID orders = %d, want %d", n, okPays)
		}
		if n := count(t, db, `SELECT count(*) FROM orders WHERE status = 'PAYMENT_FAILED'`); n != declinedPays {
			t.Errorf("PAYMENT_FAILED orders = %d, want %d", n, declinedPays)
		}
	})
	t.Run("charges == pay intents, one per order", func(t *testing.T) {
		if stats.Charges != int64(okPays) || stats.Declined != int64(declinedPays) {
			t.Errorf("channel charges = %d succeeded + %d declined, want %d + %d", stats.Charges, stats.Declined, okPays, declinedPays)
		}
		byOrder := ch.chargesByOrder(t)
		for i, o := range outcomes {
			if o.orderID != "" && len(byOrder[o.orderID]) != 1 {
				t.Errorf("intent %d: order %s has %d charges at the channel, want 1: %+v", i, o.orderID, len(byOrder[o.orderID]), byOrder[o.orderID])
			}
		}
		if len(byOrder) != okPays+declinedPays {
			t.Errorf("orders charged at the channel = %d, want %d", len(byOrder), okPays+declinedPays)
		}
	})
}

// runIntent creates order n through one instance and pays it through the
// other, each with one key kept across every retry, until the service
// gives a definitive answer.
func runIntent(creator, payer *client.Client, n int) intentOutcome {
	const within = 90 * time.Second
	ctx := context.Background()
	out := intentOutcome{method: payMethod(n)}
	createKey := client.NewKey()
	out.createCalls, out.createErr = untilDefinitive(ctx, within, func(ctx context.Context) error {
		res, err := creator.CreateOrder(ctx, createBody("chaos", n), client.WithKey(createKey))
		if err == nil {
			out.orderID = res.Value.ID
			if res.Replayed {
				out.replayed++
			}
		}
		return err
	})
	if out.createErr != nil {
		return out
	}
	payKey := client.NewKey()
	out.payCalls, out.payErr = untilDefinitive(ctx, within, func(ctx context.Context) error {
		res, err := payer.Pay(ctx, out.orderID, client.PayRequest{PaymentMethod: out.method}, client.WithKey(payKey))
		if err == nil {
			out.payStatus = res.Value.Status
			if res.Replayed {
				out.replayed++
			}
		}
		return err
	})
	return out
}

// payMethod is how intent n pays: every sixth is declined, so that
// FAILED_FINAL outcomes are replayed through the faults too.
func payMethod(n int) string {
	if n%6 == 5 {
		return "pm_declined"
	}
	return "pm_ok"
}

// hostPort is the host:port of a postgres URL.
func hostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("database server URL %q has no host", raw)
	}
	if u.Port() == "" {
		return u.Host + ":5432"
	}
	return u.Host
}

// withHost is the URL raw with its host:port replaced by addr.
func withHost(t *testing.T, raw, addr string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

func TestDroppedDatabaseConnectionsAnswer503NotInternalError(t *testing.T) {
	const warm, cut = 30, 20
	dbURL := freshDB(t)
	db := openDB(t, dbURL)
	ch := startChannel(t, time.Second)
	dbProxy := newFaultProxy(t, newProxyServer(), "postgres", hostPort(t, testdb.ServerURL()))
	svc := startService(t, "orderservice", serviceEnv(withHost(t, dbURL, dbProxy.Addr), testproc.FreeAddr(t), ch.url))
	hc := rawHTTP(10 * time.Second)
	create := func(n int, key string) answer {
		return send(hc, http.MethodPost, svc.url+"/v1/orders", apiKey, key, createBody("cut", n))
	}

	// Concurrent creates leave the pool full of idle connections ...
	warmed := storm(warm, []string{svc.url}, func(i int, _ string) answer { return create(i, client.NewKey()) })
	for _, a := range warmed {
		if a.status != http.StatusCreated {
			t.Fatalf("create before the cut: %s", a)
		}
	}
	// ... which the network then drops: each dies as the next answer to it flows.
	dbProxy.add(t, toxic{"reset_peer", "downstream", 1, map[string]any{"timeout": 0}})
	keys := make([]string, cut)
	answers := tally{}
	for i := range keys {
		keys[i] = client.NewKey()
		answers[create(warm+i, keys[i]).label()]++
	}
	dbProxy.clear()
	t.Logf("%d creates while every database connection was cut: %s", cut, answers)

	t.Run("every create answers 503 with Retry-After", func(t *testing.T) {
		if answers["503 service_unavailable"] != cut {
			t.Errorf("answers = %s; want %d × 503 service_unavailable: a dropped connection is transient, not an internal error", answers, cut)
		}
	})
	t.Run("resent with the same keys, each makes exactly one order", func(t *testing.T) {
		resent := tally{}
		for i, key := range keys {
			resent[create(warm+i, key).label()]++
		}
		if resent["201"] != cut {
			t.Errorf("resends = %s, want %d × 201", resent, cut)
		}
		if n := count(t, db, `SELECT count(*) FROM orders`); n != warm+cut {
			t.Errorf("orders = %d, want %d", n, warm+cut)
		}
	})
}
