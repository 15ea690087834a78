package order_test

// A duplicate may wait for the first result (issue 14): Prefer: wait=N.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/apptest"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
	"github.com/orderservice/orderservice/internal/order"
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
	id = createOrder(t, c, moneyKey("create"))
	done := make(chan struct{})
	var r apptest.Response
	var at time.Time
	var err error
	go func() {
		defer close(done)
		r, err = c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_slow"), nil)
		at = time.Now()
	}()
	moneyEventually(t, 5*time.Second, "the first pay at the channel", func() (bool, string) {
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

// busyConnections counts this database's sessions doing work or holding a
// transaction (a waiting duplicate must hold neither).
func busyConnections(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := moneyDB(t).Raw(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND application_name = 'orderservice' AND state IN ('active', 'idle in transaction')`).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// Duplicates waiting on another instance than the first attempt's are told
// of its outcome: the commit that stores it notifies, and every wait ends
// "notified", none by looking for itself (the fallback while a LISTEN
// connection is down, every second) and none by running out. How long after
// the first's answer they were answered is logged, not bounded.
func TestDuplicatesWaitingOnAnotherInstanceAreToldOfTheFirstResult(t *testing.T) {
	a, ca := startMoney(t, slowPayEnv)
	b, cb := start(t, slowPayEnv)
	// Waits begun before b listens would also be woken once when it does.
	moneyEventually(t, 5*time.Second, "the second instance listening", func() (bool, string) {
		return b.Waiter.Listening(), "its LISTEN connection is not up yet"
	})
	key := moneyKey("R2-waited")
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
			r, err := cb.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_slow"), preferWait(10))
			if err != nil {
				t.Errorf("duplicate %d: %v", i, err)
			}
			answers[i] = answer{r, time.Now()}
		})
	}
	// While they wait, they hold no connection and no transaction.
	moneyEventually(t, 5*time.Second, "every duplicate waiting", func() (bool, string) {
		n := goroutinesIn("idempotency.(*Waiter).Await")
		return n == duplicates, strconv.Itoa(n) + " waiting"
	})
	if !moneyRecord(t, a, order.OpPay, key).Waiting {
		t.Error("the record is not flagged as waited for")
	}
	peak := busyConnections(t)
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
		if got := ans.r.Header.Get("Preference-Applied"); got != "wait=10" {
			t.Errorf("duplicate %d: Preference-Applied = %q, want wait=10", i, got)
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
	moneyCheckStats(t, a.Channel.Stats(), moneyStats{charges: 1, declined: 0, refunds: 0, requests: 1, lookups: 0, duplicates: 0})
	moneyCheckStats(t, b.Channel.Stats(), moneyStats{charges: 0, declined: 0, refunds: 0, requests: 0, lookups: 0, duplicates: 0})
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

func TestWithoutPreferADuplicateIsToldWhenTheOutcomeIsLikely(t *testing.T) {
	m, c := startMoney(t, slowPayEnv)
	key := moneyKey("R2-409")
	id, first := startSlowPay(t, m, c, key)
	r := moneyPay(t, c, id, key, "pm_slow")
	apptest.WantAnswer(t, "an impatient duplicate", r, http.StatusConflict, "request_in_progress")
	after, err := strconv.Atoi(r.Header.Get("Retry-After"))
	// The channel call has at most 4s left (PAYMENT_CHANNEL_TIMEOUT), the
	// lease 10s: the hint is the call's deadline plus a second.
	if err != nil || after < 1 || after > 5 {
		t.Errorf("Retry-After = %q, want 1..5 (the channel timeout left + 1), not the 10s lease", r.Header.Get("Retry-After"))
	}
	if orig, _ := first(); orig.Status != http.StatusOK {
		t.Fatalf("first pay = %d %s", orig.Status, orig.Body)
	}
}

func TestAWaitShorterThanTheWorkEndsIn409(t *testing.T) {
	m, c := startMoney(t, slowPayEnv)
	key := moneyKey("R2-short")
	id, first := startSlowPay(t, m, c, key)
	r, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_slow"), preferWait(1))
	if err != nil {
		t.Fatal(err)
	}
	apptest.WantAnswer(t, "a duplicate that waits 1s for 2s of work", r, http.StatusConflict, "request_in_progress")
	if r.Header.Get("Retry-After") == "" || r.Header.Get("Preference-Applied") != "" {
		t.Errorf("headers = %v, want Retry-After and no Preference-Applied", r.Header)
	}
	first()
}

func TestWaitingClientsThatHangUpLeaveNothingBehind(t *testing.T) {
	m, c := startMoney(t, slowPayEnv)
	key := moneyKey("R2-hangup")
	id, first := startSlowPay(t, m, c, key)
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.URL()+"/v1/orders/"+id+"/pay",
				strings.NewReader(`{"payment_method":"pm_slow"}`))
			req.Header.Set("Authorization", "Bearer "+apptest.KeyAcme)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("Prefer", "wait=10")
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
				t.Errorf("a client that hung up after 300ms got %d", res.StatusCode)
			}
		})
	}
	wg.Wait()
	// The first pay is still at the channel; nothing of the 50 may remain.
	moneyEventually(t, 2*time.Second, "no waiter left", func() (bool, string) {
		n := goroutinesIn("idempotency.(*Waiter).Await")
		return n == 0, strconv.Itoa(n) + " goroutines still in Await"
	})
	if n := busyConnections(t); n > 2 {
		t.Errorf("%d connections busy after the waiters hung up", n)
	}
	t.Logf("goroutines: %d before the 50 waiters, %d after they hung up", before, runtime.NumGoroutine())
	if orig, _ := first(); orig.Status != http.StatusOK {
		t.Fatalf("first pay = %d %s", orig.Status, orig.Body)
	}
	if rec := moneyRecord(t, m, order.OpPay, key); rec.State != idempotency.Succeeded {
		t.Errorf("record = %s", rec.State)
	}
}

// goroutinesIn counts the goroutines whose stack passes through fn.
func goroutinesIn(fn string) int {
	buf := make([]byte, 8<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	return strings.Count(stacks, fn)
}

func TestWaitingDuplicatesDoNotTakeTheAdmissionSlotsOfOtherRequests(t *testing.T) {
	m, c := startMoney(t, slowPayEnvWith(map[string]string{"HTTP_MAX_IN_FLIGHT": "4", "HTTP_MAX_QUEUE": "4", "HTTP_QUEUE_TIMEOUT": "200ms",
		"PAYMENT_SLOW_DELAY": "3s"}))
	key := moneyKey("R2-admitted")
	id, first := startSlowPay(t, m, c, key)
	// Five times the admission limit, in waves the size of the limit: each
	// duplicate takes a slot, finds the intent in flight and gives the slot
	// back as it starts to wait, so every wave finds the slots free. Were
	// the slots held while waiting, the second wave would queue past its
	// 200ms and be refused with 503.
	const duplicates, wave = 20, 4
	var wg sync.WaitGroup
	answers := make([]apptest.Response, duplicates)
	for i := range answers {
		wg.Go(func() {
			answers[i], _ = c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_slow"), preferWait(10))
		})
		if i%wave == wave-1 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	// With twenty waiting, a new intent is still admitted at once.
	if r := c.Do(t, http.MethodPost, "/v1/orders", moneyKey("create-admitted"), createBody("cus_admitted")); r.Status != http.StatusCreated {
		t.Errorf("a create while %d duplicates wait = %d %s, want 201", duplicates, r.Status, r.Body)
	}
	wg.Wait()
	orig, _ := first()
	for i, a := range answers {
		if a.Status != http.StatusOK || !bytes.Equal(a.Body, orig.Body) || a.Header.Get("Preference-Applied") != "wait=10" {
			t.Errorf("duplicate %d = %d %s (Preference-Applied %q), want the first's 200 after waiting", i, a.Status, a.Body, a.Header.Get("Preference-Applied"))
		}
	}
}

// slowPays sends n pm_slow pays, each on an order of its own and under a
// key of its own, each in the background; sent(i), when given, runs once
// pay i is on its way, before the next is sent. It returns a function that
// waits for the answers.
func slowPays(t *testing.T, c *apptest.Client, n int, sent func(i int)) (answers func() []apptest.Response) {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = createOrder(t, c, moneyKey("create"))
	}
	rs := make([]apptest.Response, n)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // a test that stops early still outlives its pays
	for i, id := range ids {
		wg.Go(func() {
			var err error
			if rs[i], err = c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", moneyKey("pay"), moneyPayBody("pm_slow"), nil); err != nil {
				t.Errorf("pay %d: %v", i, err)
			}
		})
		if sent != nil {
			sent(i)
		}
	}
	return func() []apptest.Response { wg.Wait(); return rs }
}

// eachAtTheChannel is slowPays' sent for pays sent one after another: it
// returns once pay i is at m's channel.
func eachAtTheChannel(t *testing.T, m *app.Main) func(i int) {
	before := m.Channel.Stats().Requests
	return func(i int) {
		t.Helper()
		moneyEventually(t, 5*time.Second, fmt.Sprintf("pay %d at the channel", i), func() (bool, string) {
			got := m.Channel.Stats().Requests - before
			return got == int64(i+1), fmt.Sprintf("%d at the channel", got)
		})
	}
}

func TestAPayGivesItsAdmissionSlotBackWhileTheChannelWorks(t *testing.T) {
	// Two slots and no queue: a request that finds both taken is refused at
	// once. Four pays stand at the slow channel together, and a create is
	// still admitted; were the slots held through the channel call, the
	// third pay would be refused with 503.
	m, c := startMoney(t, slowPayEnvWith(map[string]string{"HTTP_MAX_IN_FLIGHT": "2", "HTTP_MAX_QUEUE": "0"}))
	answers := slowPays(t, c, 4, eachAtTheChannel(t, m))
	if r := c.Do(t, http.MethodPost, "/v1/orders", moneyKey("create-admitted"), createBody("cus_admitted")); r.Status != http.StatusCreated {
		t.Errorf("a create while 4 pays are at the channel = %d %s, want 201", r.Status, r.Body)
	}
	for i, r := range answers() {
		if r.Status != http.StatusOK || r.JSON(t)["status"] != "PAID" {
			t.Errorf("pay %d = %d %s, want 200 PAID", i, r.Status, r.Body)
		}
	}
	if got := m.Channel.Stats().Charges; got != 4 {
		t.Errorf("the channel made %d charges, want 4", got)
	}
}

func TestAPayTheChannelHasNoRoomForIsRefusedBeforeAnythingIsRecorded(t *testing.T) {
	m, c := startMoney(t, slowPayEnvWith(map[string]string{"PAYMENT_CHANNEL_MAX_IN_FLIGHT": "2"}))
	first := slowPays(t, c, 2, eachAtTheChannel(t, m))

	// Two intents hold the channel's two places: the third is refused in
	// phase 1, which rolls back its claim, its payment and its transition.
	id, key := createOrder(t, c, moneyKey("create")), moneyKey("pay-refused")
	r, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_ok"), nil)
	if err != nil {
		t.Fatal(err)
	}
	moneyWantAnswer(t, "a pay while the channel's places are taken", r, http.StatusServiceUnavailable, "service_unavailable")
	if r.Header.Get("Retry-After") == "" {
		t.Error("the refusal has no Retry-After")
	}
	if _, err := m.Orders.Records.Get(m.DB, idempotency.Scope{TenantID: moneyTenant, Operation: order.OpPay, Key: key}); !errors.Is(err, gorm.ErrRecordNotFound) {
		t.Errorf("the refused pay's record: %v, want none", err)
	}
	if n := apptest.Count(t, m.DB, "SELECT count(*) FROM payments WHERE order_id = ?", id); n != 0 {
		t.Errorf("the refused pay left %d payments", n)
	}
	if o := c.Do(t, http.MethodGet, "/v1/orders/"+id, "", nil); o.JSON(t)["status"] != "CREATED" {
		t.Errorf("the refused pay's order is %v, want CREATED", o.JSON(t)["status"])
	}

	for i, r := range first() {
		if r.Status != http.StatusOK || r.JSON(t)["status"] != "PAID" {
			t.Errorf("pay %d = %d %s, want 200 PAID", i, r.Status, r.Body)
		}
	}
	// Their places are free again: the same key is a fresh first attempt.
	r = c.Do(t, http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_ok"))
	if r.Status != http.StatusOK || r.JSON(t)["status"] != "PAID" {
		t.Errorf("the refused pay sent again = %d %s, want 200 PAID", r.Status, r.Body)
	}
	moneyWantFresh(t, r)
	if st := m.Channel.Stats(); st.Charges != 3 || st.Requests != 3 {
		t.Errorf("the channel made %d charges from %d requests, want 3 from 3", st.Charges, st.Requests)
	}
}

func TestAShutdownEndsTheWaitWith409(t *testing.T) {
	m, c := startMoney(t, slowPayEnv)
	key := moneyKey("R2-shutdown")
	id, first := startSlowPay(t, m, c, key)
	dup := make(chan apptest.Response, 1)
	go func() {
		r, _ := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, moneyPayBody("pm_slow"), preferWait(10))
		dup <- r
	}()
	moneyEventually(t, 5*time.Second, "the duplicate waiting", func() (bool, string) {
		n := goroutinesIn("idempotency.(*Waiter).Await")
		return n == 1, strconv.Itoa(n) + " waiting"
	})
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }() // the first pay still runs; the wait must not hold the shutdown
	r := <-dup
	moneyWantAnswer(t, "a waiting duplicate when the service stops", r, http.StatusConflict, "request_in_progress")
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
