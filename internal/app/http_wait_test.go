package app_test

// A duplicate may wait for the first result (issue 14): Prefer: wait=N.
// Waits across two instances, and what a shutdown does to a wait, are
// whole-program tests (internal/app).

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/tests/apptest"
)

// payInFlight starts a pay on its own order whose owner stops right after
// phase 1, PROCESSING, until release is called (at the latest when the
// test ends); first waits for its answer.
func payInFlight(t *testing.T, m *app.Main, c *apptest.Client) (id, key string, release func(), first func() apptest.Response) {
	t.Helper()
	id, key = placeAnOrder(t, c), "R2-in-flight-"+uuid.NewString()[:8]
	inFlight, released := make(chan struct{}), make(chan struct{})
	var once sync.Once
	m.Orders.Hooks.AfterPhase1 = func() error {
		once.Do(func() { close(inFlight); <-released })
		return nil
	}
	release = sync.OnceFunc(func() { close(released) })
	t.Cleanup(release)
	answer := make(chan apptest.Response, 1)
	go func() {
		r, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, map[string]any{"payment_method": "pm_ok"}, nil)
		if err != nil {
			r = apptest.Response{Status: -1, Body: []byte(err.Error())}
		}
		answer <- r
	}()
	<-inFlight
	return id, key, release, func() apptest.Response { return <-answer }
}

// Without Prefer: wait a duplicate of an intent in flight is answered at
// once, 409 request_in_progress with Retry-After (when to come back is the
// use case's: internal/order's TestADuplicateIsToldWhenTheOutcomeIsLikely);
// with a wait shorter than the work, the same answer comes when the wait
// ends, and says no preference was applied.
func TestAWaitShorterThanTheWorkEndsIn409(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "short=short-key-1", "SWEEP_INTERVAL": "1h"})
	c := apptest.NewClient(m, "short-key-1")
	id, key, release, first := payInFlight(t, m, c)
	for _, prefer := range []http.Header{nil, preferWait(1)} {
		r, err := c.Send(http.MethodPost, "/v1/orders/"+id+"/pay", key, map[string]any{"payment_method": "pm_ok"}, prefer)
		if err != nil {
			t.Fatal(err)
		}
		apptest.WantAnswer(t, fmt.Sprintf("a duplicate (Prefer %q) of work that takes longer", prefer.Get("Prefer")), r, http.StatusConflict, "request_in_progress")
		if r.Header.Get("Retry-After") == "" || r.Header.Get("Preference-Applied") != "" {
			t.Errorf("headers = %v, want Retry-After and no Preference-Applied", r.Header)
		}
	}
	release()
	if orig := first(); orig.Status != http.StatusOK {
		t.Errorf("first pay = %d %s", orig.Status, orig.Body)
	}
}

func TestWaitingClientsThatHangUpLeaveNothingBehind(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"API_KEYS": "hangup=hangup-key-1", "SWEEP_INTERVAL": "1h"})
	c := apptest.NewClient(m, "hangup-key-1")
	id, key, release, first := payInFlight(t, m, c)
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.URL()+"/v1/orders/"+id+"/pay",
				strings.NewReader(`{"payment_method":"pm_ok"}`))
			req.Header.Set("Authorization", "Bearer hangup-key-1")
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
	// The first pay is still in flight; nothing of the 50 may remain.
	apptest.Eventually(t, 2*time.Second, "no waiter left", func() (bool, string) {
		n := apptest.GoroutinesIn("idempotency.(*Waiter).Await")
		return n == 0, strconv.Itoa(n) + " goroutines still in Await"
	})
	// A waiter cut off mid-query leaves its connection to pgx's cancel
	// request, which PostgreSQL acts on a moment later: busy connections
	// must drain, not be gone the instant the clients are.
	apptest.Eventually(t, 2*time.Second, "at most 2 connections busy (this query's own included)", func() (bool, string) {
		var busy []string
		if err := m.DB.Raw(`SELECT state || ': ' || left(query, 60) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'orderservice' AND state IN ('active', 'idle in transaction')`).Scan(&busy).Error; err != nil {
			return false, err.Error()
		}
		return len(busy) <= 2, strings.Join(busy, " | ")
	})
	t.Logf("goroutines: %d before the 50 waiters, %d after they hung up", before, runtime.NumGoroutine())
	release()
	if orig := first(); orig.Status != http.StatusOK {
		t.Fatalf("first pay = %d %s", orig.Status, orig.Body)
	}
	if st := apptest.RecordState(t, m.DB, idempotency.Scope{TenantID: "hangup", Operation: order.OpPay, Key: key}); st != idempotency.Succeeded {
		t.Errorf("record = %s", st)
	}
}
