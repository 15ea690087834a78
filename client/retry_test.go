package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	p := RetryPolicy{}.withDefaults()

	t.Run("the ceiling doubles from BaseDelay and stops at MaxDelay", func(t *testing.T) {
		want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
			800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second, 5 * time.Second}
		for i, w := range want {
			if got := p.ceiling(i + 1); got != w {
				t.Errorf("ceiling after attempt %d = %v, want %v", i+1, got, w)
			}
		}
		if got := p.ceiling(1000); got != DefaultMaxDelay {
			t.Errorf("ceiling after attempt 1000 = %v, want the cap %v (no overflow)", got, DefaultMaxDelay)
		}
	})

	t.Run("full jitter draws from zero to the ceiling", func(t *testing.T) {
		for attempt := 1; attempt <= 8; attempt++ {
			ceiling := p.ceiling(attempt)
			lo, hi := ceiling, time.Duration(0)
			for range 2000 {
				d := p.backoff(attempt, 0, fullJitter)
				if d < 0 || d > ceiling {
					t.Fatalf("attempt %d: wait %v outside [0, %v]", attempt, d, ceiling)
				}
				lo, hi = min(lo, d), max(hi, d)
			}
			// 2000 uniform draws land in the outer tenths with certainty
			// for all practical purposes: the spread is the whole range.
			if lo > ceiling/10 || hi < ceiling*9/10 {
				t.Errorf("attempt %d: waits spread over [%v, %v], want most of [0, %v]", attempt, lo, hi, ceiling)
			}
		}
	})

	t.Run("Retry-After is a floor", func(t *testing.T) {
		zero := func(time.Duration) time.Duration { return 0 }
		top := func(c time.Duration) time.Duration { return c }
		if got := p.backoff(1, 2*time.Second, zero); got != 2*time.Second {
			t.Errorf("jitter 0, Retry-After 2s: wait %v, want 2s", got)
		}
		if got := p.backoff(1, 30*time.Second, top); got != 30*time.Second {
			t.Errorf("Retry-After 30s above MaxDelay: wait %v, want 30s (the server's word wins over the cap)", got)
		}
		if got := p.backoff(5, time.Second, top); got != 1600*time.Millisecond {
			t.Errorf("jitter above Retry-After: wait %v, want the draw 1.6s", got)
		}
	})

	t.Run("zero fields take the defaults", func(t *testing.T) {
		got := RetryPolicy{MaxAttempts: 3}.withDefaults()
		want := RetryPolicy{MaxAttempts: 3, BaseDelay: DefaultBaseDelay, MaxDelay: DefaultMaxDelay}
		if got != want {
			t.Errorf("withDefaults = %+v, want %+v", got, want)
		}
	})
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"3", 3 * time.Second},
		{" 1 ", time.Second},
		{"0", 0},
		{"-4", 0},
		{"soon", 0},
		{now.Add(7 * time.Second).Format(http.TimeFormat), 7 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
	} {
		if got := parseRetryAfter(tc.in, now); got != tc.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestRetryableStatus(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
		want   bool
	}{
		{408, CodeRequestTimeout, true},
		{409, CodeInProgress, true},
		{429, "", true},
		{429, CodeQuotaExceeded, true},
		{502, "", true},
		{503, CodeServiceUnavailable, true},
		{504, "", true},
		{400, "invalid_request", false},
		{401, "unauthenticated", false},
		{402, CodePaymentDeclined, false},
		{404, CodeOrderNotFound, false},
		{409, CodeInvalidTransition, false},
		{413, "payload_too_large", false},
		{415, "unsupported_media_type", false},
		{422, CodeKeyReused, false},
		{500, "internal", false},
	} {
		if got := retryableStatus(tc.status, tc.code); got != tc.want {
			t.Errorf("retryableStatus(%d, %q) = %v, want %v", tc.status, tc.code, got, tc.want)
		}
	}
}

// fakeClock records the waits of the retry loop instead of sleeping.
type fakeClock struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (f *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.mu.Unlock()
	return ctx.Err()
}

func TestRetryLoop(t *testing.T) {
	// answers replies with the given statuses in turn, recording the keys.
	answers := func(t *testing.T, retryAfter string, statuses ...int) (*httptest.Server, *[]string) {
		var mu sync.Mutex
		var keys []string
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			n := len(keys)
			keys = append(keys, r.Header.Get("Idempotency-Key"))
			mu.Unlock()
			status := statuses[min(n, len(statuses)-1)]
			if status >= 300 {
				if retryAfter != "" {
					w.Header().Set("Retry-After", retryAfter)
				}
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(status)
				code := map[int]string{409: CodeInProgress, 503: CodeServiceUnavailable, 422: CodeKeyReused}[status]
				fmt.Fprintf(w, `{"type":"urn:orderservice:problem:%s","title":"t","status":%d,"detail":"d","code":%q}`, code, status, code)
				return
			}
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(status)
			fmt.Fprint(w, `{"id":"o1","status":"PAID"}`)
		}))
		t.Cleanup(srv.Close)
		return srv, &keys
	}
	newClient := func(url string, clock *fakeClock, p RetryPolicy) *Client {
		c := New(url, "k", WithRetry(p))
		c.sleep = clock.sleep
		c.jitter = func(ceiling time.Duration) time.Duration { return ceiling }
		return c
	}

	t.Run("waits at least Retry-After and resends the same key", func(t *testing.T) {
		srv, keys := answers(t, "2", 409, 503, 200)
		clock := &fakeClock{}
		res, err := newClient(srv.URL, clock, RetryPolicy{}).Pay(context.Background(), "o1", PayRequest{PaymentMethod: "pm_ok"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Attempts != 3 || !res.Replayed || res.Status != 200 || res.Value.Status != StatusPaid {
			t.Errorf("result %+v, want 3 attempts ending in a replayed 200", res)
		}
		if want := []time.Duration{2 * time.Second, 2 * time.Second}; fmt.Sprint(clock.waits) != fmt.Sprint(want) {
			t.Errorf("waits %v, want %v (Retry-After above the backoff)", clock.waits, want)
		}
		for i, k := range *keys {
			if k != res.Key || k == "" {
				t.Errorf("attempt %d carried key %q, want the call's key %q", i+1, k, res.Key)
			}
		}
	})

	t.Run("backs off exponentially without Retry-After and stops at MaxAttempts", func(t *testing.T) {
		srv, keys := answers(t, "", 503)
		clock := &fakeClock{}
		p := RetryPolicy{MaxAttempts: 5, BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}
		res, err := newClient(srv.URL, clock, p).CreateOrder(context.Background(), CreateOrderRequest{}, WithKey("R1"))
		var pe *ProblemError
		if !errors.As(err, &pe) || pe.Status != 503 || pe.Attempts != 5 || pe.Key != "R1" {
			t.Fatalf("error %v (%+v), want the last 503 after 5 attempts under R1", err, pe)
		}
		if res.Attempts != 5 || len(*keys) != 5 {
			t.Errorf("attempts %d, server saw %d, want 5 and 5", res.Attempts, len(*keys))
		}
		want := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 40 * time.Millisecond, 50 * time.Millisecond}
		if fmt.Sprint(clock.waits) != fmt.Sprint(want) {
			t.Errorf("waits %v, want the capped ceilings %v", clock.waits, want)
		}
	})

	t.Run("a final answer is not retried", func(t *testing.T) {
		srv, keys := answers(t, "", 422)
		clock := &fakeClock{}
		res, err := newClient(srv.URL, clock, RetryPolicy{}).CreateOrder(context.Background(), CreateOrderRequest{})
		if !IsKeyReused(err) || res.Attempts != 1 || len(*keys) != 1 || len(clock.waits) != 0 {
			t.Errorf("err %v, %d attempts, %d requests, waits %v: want one 422 and no wait", err, res.Attempts, len(*keys), clock.waits)
		}
	})

	t.Run("reads carry no key", func(t *testing.T) {
		srv, keys := answers(t, "", 200)
		res, err := newClient(srv.URL, &fakeClock{}, RetryPolicy{}).GetOrder(context.Background(), "o1")
		if err != nil || res.Key != "" || (*keys)[0] != "" {
			t.Errorf("err %v, result key %q, sent key %q: want a GET without Idempotency-Key", err, res.Key, (*keys)[0])
		}
	})
}

// Without Retry-After, a RateLimit field's t for a policy with nothing
// left says when to come back; a policy with something left, or an item
// that does not parse, says nothing.
func TestRateLimitWait(t *testing.T) {
	for fields, want := range map[string]time.Duration{
		`"requests";r=0;t=3`:                            3 * time.Second,
		`"requests";r=0;t=3, "concurrent";r=0`:          3 * time.Second,
		`"requests";r=5;t=1, "concurrent";r=0`:          0,
		`"requests";r=0;t=2, "daily";r=0;t=60`:          time.Minute,
		`"requests";r=9;t=9`:                            0,
		`requests;r=0;t=3`:                              0, // a token, not a string: malformed
		`"requests";r=zero;t=3`:                         0,
		"":                                              0,
		`"requests";r=0;t=999999999999, "x";r=0;t=nope`: 24 * time.Hour,
	} {
		if got := rateLimitWait([]string{fields}); got != want {
			t.Errorf("RateLimit: %s: wait %v, want %v", fields, got, want)
		}
	}
}

// A 429 without Retry-After is waited out by its RateLimit's t, and a 408
// is retried, both under the call's one key.
func TestQuotaAndBodyTimeoutsAreRetriedUnderTheSameKey(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	answers := []func(w http.ResponseWriter){
		func(w http.ResponseWriter) {
			w.Header().Set("RateLimit", `"requests";r=0;t=4`)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"t","status":429,"detail":"d","code":"quota_exceeded","violated-policies":["requests"]}`)
		},
		func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusRequestTimeout)
			fmt.Fprint(w, `{"type":"urn:orderservice:problem:request_timeout","title":"t","status":408,"detail":"d","code":"request_timeout"}`)
		},
		func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, `{"id":"o1","status":"CREATED"}`)
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n := len(keys)
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		answers[min(n, len(answers)-1)](w)
	}))
	t.Cleanup(srv.Close)
	clock := &fakeClock{}
	c := New(srv.URL, "k", WithRetry(RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}))
	c.sleep, c.jitter = clock.sleep, func(ceiling time.Duration) time.Duration { return ceiling }
	res, err := c.CreateOrder(context.Background(), CreateOrderRequest{})
	if err != nil || res.Attempts != 3 || res.Status != http.StatusCreated {
		t.Fatalf("result %+v, err %v: want a 201 on the third attempt", res, err)
	}
	if want := []time.Duration{4 * time.Second, 20 * time.Millisecond}; fmt.Sprint(clock.waits) != fmt.Sprint(want) {
		t.Errorf("waits %v, want %v (the 429's RateLimit t, then the backoff)", clock.waits, want)
	}
	for i, k := range keys {
		if k != res.Key {
			t.Errorf("attempt %d carried key %q, want the call's key %q", i+1, k, res.Key)
		}
	}
}
