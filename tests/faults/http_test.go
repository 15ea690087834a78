//go:build faults

package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/orderservice/orderservice/client"
)

// adminHTTP reads the channel's admin API and the database-free endpoints.
var adminHTTP = &http.Client{Timeout: 10 * time.Second}

// rawHTTP returns a client for one-shot requests that the test counts
// itself, with room for hundreds of concurrent connections.
func rawHTTP(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxIdleConns: 1024}}
}

// answer is one HTTP answer read whole, or the transport error instead.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
	took   time.Duration
}

func (a answer) String() string {
	if a.err != nil {
		return fmt.Sprintf("transport error after %s: %v", a.took.Round(time.Millisecond), a.err)
	}
	return fmt.Sprintf("%d %s", a.status, bytes.TrimSpace(a.body))
}

// code is the problem code of an error answer, "" for a success.
func (a answer) code() string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(a.body, &p)
	return p.Code
}

// label names the answer for a tally: "201", "409 request_in_progress",
// "transport error". An answer that asks for a retry (503, 409
// request_in_progress) without saying when is labelled so.
func (a answer) label() string {
	if a.err != nil {
		return "transport error"
	}
	c := a.code()
	if c == "" {
		return fmt.Sprint(a.status)
	}
	label := fmt.Sprintf("%d %s", a.status, c)
	if (a.status == http.StatusServiceUnavailable || c == client.CodeInProgress) && a.header.Get("Retry-After") == "" {
		label += " without Retry-After"
	}
	return label
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// send makes one request as the test tenant (when key is not empty, or
// for a /v1 path) and reads the whole answer.
func send(hc *http.Client, method, url, apiKey, idemKey string, body any) answer {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return answer{err: err}
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		return answer{err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	start := time.Now()
	res, err := hc.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, header: res.Header, body: b, err: err, took: time.Since(start)}
}

// createBody is the create request of intent n: its own customer and a
// total (1000+n) that tells the orders apart in money sums.
func createBody(prefix string, n int) client.CreateOrderRequest {
	return client.CreateOrderRequest{
		CustomerID: fmt.Sprintf("%s-customer-%d", prefix, n),
		Currency:   "EUR",
		Items:      []client.ItemRequest{{SKU: "SKU-FAULTS", Quantity: 1, UnitPrice: int64(1000 + n)}},
	}
}

// orderView is the part of an order answer the suite checks.
type orderView struct {
	ID          string `json:"id"`
	Status      string `json:"status"`
	TotalAmount int64  `json:"total_amount"`
}

func decodeOrder(t *testing.T, a answer) orderView {
	t.Helper()
	var o orderView
	if err := json.Unmarshal(a.body, &o); err != nil || o.ID == "" {
		t.Fatalf("answer is not an order: %s", a)
	}
	return o
}

// newClient is the retrying client of the client package, pointed at one
// instance. Each call keeps one key across its attempts. When seen is not
// nil, every answer of every attempt is counted there.
func newClient(baseURL string, attemptTimeout time.Duration, seen *answerTally) *client.Client {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64
	var rt http.RoundTripper = transport
	if seen != nil {
		rt = &countingTransport{base: transport, seen: seen}
	}
	return client.New(baseURL, apiKey,
		client.WithHTTPClient(&http.Client{Transport: rt}),
		client.WithRetry(client.RetryPolicy{MaxAttempts: 10, BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second}),
		client.WithAttemptTimeout(attemptTimeout))
}

// answerTally counts answers by label, safe for concurrent use.
type answerTally struct {
	mu     sync.Mutex
	counts tally
}

func (a *answerTally) add(label string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.counts == nil {
		a.counts = tally{}
	}
	a.counts[label]++
}

func (a *answerTally) snapshot() tally {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := tally{}
	for k, v := range a.counts {
		out[k] = v
	}
	return out
}

// countingTransport labels every attempt's answer, as the client saw it.
type countingTransport struct {
	base http.RoundTripper
	seen *answerTally
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := c.base.RoundTrip(req)
	if err != nil {
		c.seen.add("transport error")
		return nil, err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		c.seen.add("transport error")
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(b))
	c.seen.add(answer{status: res.StatusCode, header: res.Header, body: b}.label())
	return res, nil
}

// untilDefinitive repeats call (which resends one intent under its one key)
// until it returns a definitive answer, success or final failure, or
// within runs out. It returns the last error and how many calls it made.
func untilDefinitive(ctx context.Context, within time.Duration, call func(context.Context) error) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for calls := 1; ; calls++ {
		err := call(ctx)
		if err == nil || definitive(err) || ctx.Err() != nil {
			return calls, err
		}
		select {
		case <-ctx.Done():
			return calls, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// definitive reports whether err is a final answer of the service (402,
// 404, 409 invalid_transition, 422 …) rather than one that leaves the
// intent open (transport error, 503, 409 request_in_progress).
//
// A 500 is resent too, although the client package gives up on it: the
// same key makes that safe, the scenarios count every 500 as a failure of
// their own, and the exactly-once counts stay meaningful past one.
func definitive(err error) bool {
	var pe *client.ProblemError
	if !errors.As(err, &pe) {
		return false
	}
	switch {
	case pe.Status >= http.StatusInternalServerError, pe.Status == http.StatusTooManyRequests:
		return false
	case pe.Status == http.StatusConflict && pe.Code == client.CodeInProgress:
		return false
	}
	return true
}

// openDB opens a small pool on the scenario's database for the checks.
func openDB(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// count runs a SELECT count(*) query.
func count(t *testing.T, db *pgxpool.Pool, query string, args ...any) int {
	t.Helper()
	var n int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.QueryRow(ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// recordStates counts the tenant's idempotency records of op by state.
func recordStates(t *testing.T, db *pgxpool.Pool, op string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := db.Query(ctx, `SELECT state, count(*) FROM idempotency_records WHERE operation = $1 GROUP BY state`, op)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			t.Fatal(err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// unfinishedRecords counts records in PROCESSING or FAILED_RETRYABLE.
func unfinishedRecords(t *testing.T, db *pgxpool.Pool) int {
	t.Helper()
	return count(t, db, `SELECT count(*) FROM idempotency_records WHERE state IN ('PROCESSING', 'FAILED_RETRYABLE')`)
}
