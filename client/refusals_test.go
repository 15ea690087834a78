package client_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/orderservice/orderservice/client"
	"github.com/orderservice/orderservice/tests/apptest"
)

// keysSeen records, per attempt, the key and the status of each answer
// that passes through it.
type keysSeen struct {
	next http.RoundTripper
	mu   sync.Mutex
	keys []string
	code []int
	// answered, when set, is told of each status.
	answered func(int)
}

func (k *keysSeen) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := k.next.RoundTrip(r)
	if err != nil {
		return res, err
	}
	k.mu.Lock()
	k.keys, k.code = append(k.keys, r.Header.Get("Idempotency-Key")), append(k.code, res.StatusCode)
	k.mu.Unlock()
	if k.answered != nil {
		k.answered(res.StatusCode)
	}
	return res, nil
}

func (k *keysSeen) seen() ([]string, []int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.keys...), append([]int(nil), k.code...)
}

// A tenant over its quota gets 429 with Retry-After: the client waits as
// told and sends the same request under the same key, never a new one,
// and the intent is done once. globex may create one order every 2s.
func TestAQuotaIsWaitedOutUnderTheSameKey(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"HTTP_TENANT_LIMITS": "globex;requests=1;window=2s"})
	seen := &keysSeen{next: http.DefaultTransport}
	c := client.New(m.URL(), apptest.KeyGlobex, client.WithHTTPClient(&http.Client{Transport: seen}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	customer := newCustomer(t)
	if _, err := c.CreateOrder(ctx, purchase(customer)); err != nil {
		t.Fatalf("the first create: %v", err)
	}
	start := time.Now()
	res, err := c.CreateOrder(ctx, purchase(customer))
	if err != nil {
		t.Fatalf("the second create, over the quota at first: %v", err)
	}
	keys, codes := seen.seen()
	if len(codes) != 3 || codes[1] != http.StatusTooManyRequests || codes[2] != http.StatusCreated || res.Attempts != 2 {
		t.Fatalf("answers %v, %d attempts: want 201, then 429 and 201 for the second call", codes, res.Attempts)
	}
	if keys[1] != res.Key || keys[2] != res.Key {
		t.Errorf("the second call's attempts carried %q and %q, want its one key %q", keys[1], keys[2], res.Key)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("the retry came %v after the 429, before its Retry-After (at least 1s)", waited)
	}
	if n := countOrders(t, m, customer); n != 2 {
		t.Errorf("%d orders for the two intents, want 2", n)
	}
}

// The service over its capacity answers 503 with Retry-After: the client
// waits as told and resends under the same key until it is served. One
// slot, no queue; a create of acme holds the slot inside its transaction
// until the client's create, acme's too (beyond its share, so not queued),
// has been refused once.
func TestTheServiceOverItsCapacityIsWaitedOutUnderTheSameKey(t *testing.T) {
	m := apptest.Start(t, dbURL, map[string]string{"HTTP_MAX_IN_FLIGHT": "1", "HTTP_MAX_QUEUE": "0"})
	inside, release := make(chan struct{}), make(chan struct{})
	var hold sync.Once
	m.Orders.Hooks.AfterOrderInsert = func() error {
		hold.Do(func() { close(inside); <-release })
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	holder := make(chan error, 1)
	go func() {
		_, err := client.New(m.URL(), apptest.KeyAcme).CreateOrder(ctx, purchase(newCustomer(t)))
		holder <- err
	}()
	<-inside
	var refused sync.Once
	seen := &keysSeen{next: http.DefaultTransport, answered: func(code int) {
		if code == http.StatusServiceUnavailable {
			refused.Do(func() { close(release) })
		}
	}}
	customer := newCustomer(t)
	res, err := client.New(m.URL(), apptest.KeyAcme, client.WithHTTPClient(&http.Client{Transport: seen})).CreateOrder(ctx, purchase(customer))
	if err != nil {
		t.Fatalf("the create refused at capacity: %v", err)
	}
	if err := <-holder; err != nil {
		t.Fatalf("the create that held the slot: %v", err)
	}
	keys, codes := seen.seen()
	if len(codes) < 2 || codes[0] != http.StatusServiceUnavailable || codes[len(codes)-1] != http.StatusCreated || res.Attempts != len(codes) {
		t.Fatalf("answers %v, %d attempts: want a 503 first and a 201 last", codes, res.Attempts)
	}
	for i, k := range keys {
		if k != res.Key {
			t.Errorf("attempt %d carried key %q, want the call's one key %q", i+1, k, res.Key)
		}
	}
	if n := countOrders(t, m, customer); n != 1 {
		t.Errorf("%d orders for the one intent, want 1", n)
	}
}
