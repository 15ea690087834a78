package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
)

// waitResult is the waiting-duplicates scenario: one slow pay, and
// Duplicates copies of it sent with Prefer: wait=10 while it runs.
type waitResult struct {
	Duplicates int
	SlowDelay  time.Duration
	// FirstTook is the first pay's own time, its channel call included.
	FirstTook time.Duration
	// AfterFirst are the duplicates' answer times measured from the
	// moment the first pay's answer arrived (negative: before it).
	P50, P99, Last time.Duration
	// Replayed counts 200 answers marked Idempotent-Replayed.
	Replayed int
	Other    map[string]int // every other answer, by status
	// BusyPeak is the most sessions of the service doing work or holding a
	// transaction, sampled while every duplicate was waiting.
	BusyPeak int64
	// AllWaiting is false when the first pay finished before every copy
	// was waiting (BusyPeak was then not sampled).
	AllWaiting bool
	Pool       int
	Charges    int64
	// Ended is how the service says the waits ended (its
	// orderservice_idempotency_waits_total, counted from its restart).
	Ended map[idempotency.Wake]int
}

// waitScenario pays one order with pm_slow and sends Duplicates copies of
// the pay under the same key with Prefer: wait=10 once it holds the record,
// on connections of their own.
func (b *bench) waitScenario(ctx context.Context, res *results) error {
	o := b.opts
	// Admission control off for this one: a thousand copies arriving in the
	// same instant are, by design, partly refused at the admission limit
	// (scenario 8 measures that); what is measured here is the wait.
	if err := b.restart(ctx, o.Pool, map[string]string{"HTTP_MAX_IN_FLIGHT": "0"}); err != nil {
		return err
	}
	if err := b.reset(ctx); err != nil {
		return err
	}
	ids, err := b.prepareOrders(ctx, 1)
	if err != nil {
		return err
	}
	url, key, body := b.svc.URL()+"/v1/orders/"+ids[0]+"/pay", "bench-wait-"+ids[0], []byte(`{"payment_method":"pm_slow"}`)
	before := b.svc.Channel.Stats()
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: o.WaitDuplicates + 8}}
	defer hc.CloseIdleConnections()
	post := func(prefer bool) (int, http.Header, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+benchAPIKey)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		if prefer {
			req.Header.Set("Prefer", "wait=10")
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header, err
	}

	firstDone := make(chan time.Time, 1)
	start := time.Now()
	var firstStatus int
	go func() {
		firstStatus, _, _ = post(false)
		firstDone <- time.Now()
	}()
	if err := b.waitFor(ctx, 10*time.Second, func(n int64) bool { return n > 0 },
		`SELECT count(*) FROM idempotency_records WHERE idempotency_key = $1 AND state = 'PROCESSING'`, key); err != nil {
		return err
	}
	answers := make([]time.Time, o.WaitDuplicates)
	statuses := make([]string, o.WaitDuplicates)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			status, h, err := post(true)
			answers[i] = time.Now()
			switch {
			case err != nil:
				statuses[i] = "error"
			case status == http.StatusOK && h.Get("Idempotent-Replayed") == "true":
				statuses[i] = "replayed"
			default:
				statuses[i] = fmt.Sprint(status)
			}
		})
	}
	// Once every copy waits (the service runs in this process, so its
	// goroutines are countable), sample the busy sessions until the first
	// pay is done.
	var busy int64
	var firstAt time.Time
	for firstAt.IsZero() && waiting() < o.WaitDuplicates {
		select {
		case firstAt = <-firstDone:
		case <-time.After(5 * time.Millisecond):
		}
	}
	res.Wait.AllWaiting = firstAt.IsZero()
	for firstAt.IsZero() {
		n, err := b.count(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'orderservice' AND state IN ('active', 'idle in transaction')`)
		if err != nil {
			return err
		}
		busy = max(busy, n)
		select {
		case firstAt = <-firstDone:
		case <-time.After(20 * time.Millisecond):
		}
	}
	wg.Wait()
	after := b.svc.Channel.Stats()
	ended, err := waitsEnded(ctx, hc, b.svc.URL())
	if err != nil {
		return err
	}

	allWaiting := res.Wait.AllWaiting
	w := waitResult{AllWaiting: allWaiting, Duplicates: o.WaitDuplicates, SlowDelay: b.svc.Config.Channel.SlowDelay, FirstTook: firstAt.Sub(start),
		BusyPeak: busy, Pool: b.svc.Config.Database.MaxConns, Charges: after.Charges - before.Charges, Other: map[string]int{}, Ended: ended}
	lags := make([]time.Duration, len(answers))
	for i, at := range answers {
		lags[i] = at.Sub(firstAt)
		if statuses[i] == "replayed" {
			w.Replayed++
		} else {
			w.Other[statuses[i]]++
		}
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	w.P50, w.P99, w.Last = quantile(lags, 0.5), quantile(lags, 0.99), lags[len(lags)-1]
	res.Wait = w
	if firstStatus != http.StatusOK {
		res.fail("wait: the first pay answered %d", firstStatus)
	}
	if w.Replayed != w.Duplicates {
		res.fail("wait: %d of %d duplicates got the first result replayed (others: %v)", w.Replayed, w.Duplicates, w.Other)
	}
	if !w.AllWaiting {
		res.fail("wait: the first pay finished before all %d copies were waiting; raise PAYMENT_SLOW_DELAY", w.Duplicates)
	}
	if w.Charges != 1 {
		res.fail("wait: the channel made %d charges for one intent, want 1", w.Charges)
	}
	b.progress("  %d duplicates waiting: last answer %s after the first's, p50 %s; busy sessions at most %d (pool %d); %d charge; waits ended %s",
		w.Duplicates, ms(w.Last), ms(w.P50), w.BusyPeak, w.Pool, w.Charges, w.Endings())
	return nil
}

// waitFor polls query, a count, until done says it is the count awaited,
// for at most within.
func (b *bench) waitFor(ctx context.Context, within time.Duration, done func(n int64) bool, query string, args ...any) error {
	deadline := time.Now().Add(within)
	for {
		n, err := b.count(ctx, query, args...)
		if err != nil || done(n) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %s, and %s still counts %d", within, strings.Join(strings.Fields(query), " "), n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Endings lists the ways the waits ended that some did.
func (w waitResult) Endings() string {
	var ways []string
	for _, how := range idempotency.Wakes {
		if n := w.Ended[how]; n > 0 {
			ways = append(ways, fmt.Sprintf("%s %d", how, n))
		}
	}
	if len(ways) == 0 {
		return "none"
	}
	return strings.Join(ways, ", ")
}

// waitsEnded reads how the service at url says its waits ended.
func waitsEnded(ctx context.Context, hc *http.Client, url string) (map[idempotency.Wake]int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return metrics.WaitsEnded(resp.Body)
}

// waiting counts the goroutines of this process that wait for a first
// result (idempotency.Waiter.Await): the service under test runs here.
func waiting() int {
	buf := make([]byte, 64<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "idempotency.(*Waiter).Await(")
}
