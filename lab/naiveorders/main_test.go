package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/tests/testdb"
)

// syncBuffer is what run prints, read while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestServesTheMistakesItIsGiven runs the command as `go run` would, on a
// database of its own that it creates, and makes its mistake over HTTP, as
// a learner with curl would: a key cached for 10 minutes, a retry after 11.
func TestServesTheMistakesItIsGiven(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-mistake", "expiring-cache",
			"-database", testdb.Fresh(t, "naiveorders_cmd")}, &out, io.Discard)
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	addr := regexp.MustCompile(`on (http://[0-9.:]+),`)
	var base string
	for deadline := time.Now().Add(30 * time.Second); base == ""; time.Sleep(20 * time.Millisecond) {
		if m := addr.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("the command never said where it serves: %q", out.String())
		}
	}
	if !strings.Contains(out.String(), "DELIBERATELY WRONG") || !strings.Contains(out.String(), "naive_expiring_cache") {
		t.Errorf("the banner does not say what it is: %q", out.String())
	}

	post := func(path, key, body string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	order := `{"customer_id":"cus_cmd","currency":"EUR","items":[{"sku":"SKU-1","quantity":1,"unit_price":100}]}`
	statuses := []int{post("/v1/orders", "R1", order), post("/v1/orders", "R1", order), post("/admin/advance?by=11m", "", ""),
		post("/v1/orders", "R1", order)}
	if want := []int{201, 201, 200, 201}; !slices.Equal(statuses, want) {
		t.Errorf("create, retry, 11 minutes, retry: %v, want %v", statuses, want)
	}
	res, err := http.Get(base + "/v1/orders?customer_id=cus_cmd")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if n := strings.Count(string(body), `"id"`); n != 2 {
		t.Errorf("one intent made %d orders, want 2 (the retry at once replayed, the one after the TTL ran again): %s", n, body)
	}
}

func TestRefusesAMistakeItDoesNotKnow(t *testing.T) {
	err := run(context.Background(), []string{"-mistake", "check-then-update"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "check-then-insert") {
		t.Errorf("an unknown mistake: %v, want an error naming the mistakes there are", err)
	}
}
