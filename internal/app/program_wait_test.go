package app_test

// A duplicate may wait for the first result (issue 14), Prefer: wait=N,
// across instances and through a shutdown. The waits of one instance are
// HTTP's business: internal/httpapi's tests.

import (
	"bytes"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/tests/apptest"
)

// slowPayEnv makes pm_slow take 2s at the channel, well inside its timeout.
var slowPayEnv = map[string]string{"PAYMENT_SLOW_DELAY": "2s", "PAYMENT_CHANNEL_TIMEOUT": "4s", "IDEMPOTENCY_LEASE": "10s", "SWEEP_INTERVAL": "1h"}

// slowPayEnvWith is slowPayEnv with the settings of env added or replaced.
func slowPayEnvWith(env map[string]string) map[string]string {
	merged := maps.Clone(slowPayEnv)
	maps.Copy(merged, env)
	return merged
}

// startSlowPay creates an order on c and starts its slow pay under key in the
// background; it returns once the intent is PROCESSING at the channel, and
// a function that waits for the first answer and the time it arrived.
func startSlowPay(t *testing.T, m *app.Main, c *apptest.Client, key string) (id string, first func() (apptest.Response, time.Time)) {
	t.Helper()
	id = placeOrder(t, c)
	done := make(chan struct{})
	var r apptest.Response
	var at time.Time
	var err error
	go func() {
		defer close(done)
		r, err = c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, payWith("pm_slow"), nil)
		at = time.Now()
	}()
	apptest.Eventually(t, 5*time.Second, "the first pay at the channel", func() (bool, string) {
		return m.Channel.Stats().Requests == 1, "no channel request yet"
	})
	return id, func() (apptest.Response, time.Time) {
		<-done
		if err != nil {
			t.Fatalf("first pay: %v", err)
		}
		return r, at
	}
}

func preferWait(n int) http.Header { return http.Header{"Prefer": {"wait=" + strconv.Itoa(n)}} }

// busyConnections counts the sessions of m's database doing work or
// holding a transaction (a waiting duplicate must hold neither), this
// count's own included.
func busyConnections(t *testing.T, m *app.Main) int64 {
	t.Helper()
	return apptest.Count(t, m.DB, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND application_name = 'orderservice' AND state IN ('active', 'idle in transaction')`)
}

// waitsEnded reads how the waits on c's service ended from its /metrics.
func waitsEnded(t *testing.T, c *apptest.Client) map[idempotency.Wake]int {
	t.Helper()
	ended, err := metrics.WaitsEnded(bytes.NewReader(c.Do(t, http.MethodGet, "/metrics", "", nil).Body))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return ended
}

// Duplicates waiting on another instance than the first attempt's are told
// of its outcome: the commit that stores it notifies, and every wait ends
// "notified", none by looking for itself (the fallback while a LISTEN
// connection is down, every second) and none by running out. How long after
// the first's answer they were answered is logged, not bounded.
func TestDuplicatesWaitingOnAnotherInstanceAreToldOfTheFirstResult(t *testing.T) {
	isolateMoney(t)
	// The first pay is held 8s, not 2s: a hundred requests under -race on
	// a loaded machine took longer than 2s to reach their waits, and ones
	// that arrive after the first answer are replayed without waiting. The
	// duplicates may wait 20s, so the first's answer has room to reach them.
	held := slowPayEnvWith(map[string]string{"PAYMENT_SLOW_DELAY": "8s", "PAYMENT_CHANNEL_TIMEOUT": "10s", "IDEMPOTENCY_LEASE": "12s",
		"MAX_WAIT": "20s"})
	a, b := apptest.Start(t, dbURL, held), apptest.Start(t, dbURL, held)
	ca, cb := apptest.NewClient(a, apptest.KeyAcme), apptest.NewClient(b, apptest.KeyAcme)
	// Waits begun before b listens would also be woken once when it does.
	apptest.Eventually(t, 5*time.Second, "the second instance listening", func() (bool, string) {
		return b.Waiter.Listening(), "its LISTEN connection is not up yet"
	})
	key := newKey("R2-waited")
	id, first := startSlowPay(t, a, ca, key)

	const duplicates = 100
	type answer struct {
		r  apptest.Response
		at time.Time
	}
	answers := make([]answer, duplicates)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			r, err := cb.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, payWith("pm_slow"), preferWait(20))
			if err != nil {
				t.Errorf("duplicate %d: %v", i, err)
			}
			answers[i] = answer{r, time.Now()}
		})
	}
	// While they wait, they hold no connection and no transaction.
	apptest.Eventually(t, 7*time.Second, "every duplicate waiting", func() (bool, string) {
		n := apptest.GoroutinesIn("idempotency.(*Waiter).Await")
		return n == duplicates, strconv.Itoa(n) + " waiting"
	})
	rec, err := a.Orders.Records.Get(a.DB, idempotency.Scope{TenantID: "acme", Operation: order.OpPay, Key: key})
	if err != nil || !rec.Waiting {
		t.Errorf("the record is not flagged as waited for (%v)", err)
	}
	peak := busyConnections(t, a)
	wg.Wait()
	orig, firstAt := first()
	if orig.Status != http.StatusOK {
		t.Fatalf("first pay = %d %s", orig.Status, orig.Body)
	}

	var latest time.Duration
	for i, ans := range answers {
		if ans.r.Status != http.StatusOK || !bytes.Equal(ans.r.Body, orig.Body) || ans.r.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("duplicate %d = %d %s (replayed %q), want the first's 200 replayed", i, ans.r.Status, ans.r.Body, ans.r.Header.Get("Idempotent-Replayed"))
		}
		if got := ans.r.Header.Get("Preference-Applied"); got != "wait=20" {
			t.Errorf("duplicate %d: Preference-Applied = %q, want wait=20", i, got)
		}
		latest = max(latest, ans.at.Sub(firstAt))
	}
	t.Logf("%d duplicates on another instance answered at most %s after the first; busy connections while they waited: %d", duplicates, latest, peak)
	want := map[idempotency.Wake]int{idempotency.Notified: duplicates, idempotency.Relistened: 0, idempotency.Looked: 0,
		idempotency.NotInFlight: 0, idempotency.GaveUp: 0}
	if got := waitsEnded(t, cb); !maps.Equal(got, want) {
		t.Errorf("waits on the second instance ended %v, want %v", got, want)
	}
	if peak > 3 {
		t.Errorf("%d connections busy while %d duplicates waited, want at most a few", peak, duplicates)
	}
	if st := a.Channel.Stats(); st.Charges != 1 || st.Declined != 0 || st.Refunds != 0 || st.Requests != 1 || st.Lookups != 0 || st.DuplicatesAbsorbed != 0 {
		t.Errorf("the first instance's channel: %+v, want one charge from one request", st)
	}
	if st := b.Channel.Stats(); st != (mockchannel.Stats{}) {
		t.Errorf("the second instance's channel: %+v, want it never asked", st)
	}
}

func TestAShutdownEndsTheWaitWith409(t *testing.T) {
	isolateMoney(t)
	m := apptest.Start(t, dbURL, slowPayEnv)
	c := apptest.NewClient(m, apptest.KeyAcme)
	key := newKey("R2-shutdown")
	id, first := startSlowPay(t, m, c, key)
	dup := make(chan apptest.Response, 1)
	go func() {
		r, _ := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, payWith("pm_slow"), preferWait(10))
		dup <- r
	}()
	apptest.Eventually(t, 5*time.Second, "the duplicate waiting", func() (bool, string) {
		n := apptest.GoroutinesIn("idempotency.(*Waiter).Await")
		return n == 1, strconv.Itoa(n) + " waiting"
	})
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }() // the first pay still runs; the wait must not hold the shutdown
	r := <-dup
	apptest.WantAnswer(t, "a waiting duplicate when the service stops", r, http.StatusConflict, "request_in_progress")
	if r.Header.Get("Retry-After") == "" || r.Header.Get("Preference-Applied") != "" {
		t.Errorf("headers = %v, want Retry-After and no Preference-Applied", r.Header)
	}
	if orig, _ := first(); orig.Status != http.StatusOK {
		t.Errorf("the first pay, finished during the shutdown = %d %s", orig.Status, orig.Body)
	}
	if err := <-closed; err != nil {
		t.Errorf("close: %v", err)
	}
}
