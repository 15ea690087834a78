//go:build ha

package hatest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/testproc"
)

// isWrite reports whether sql would change something, or take the
// migrations' lock: what must never be tried on a replica.
func isWrite(sql string) bool {
	s := strings.ToLower(strings.TrimSpace(sql))
	for _, w := range []string{"insert", "update", "delete", "create", "alter", "drop", "truncate", "lock", "grant", "comment"} {
		if strings.HasPrefix(s, w) {
			return true
		}
	}
	return strings.Contains(s, "pg_advisory") || strings.Contains(s, "for update")
}

// startAsync starts an instance whose start may wait; the result arrives on
// the channel.
type started struct {
	m   *app.Main
	err error
}

func startAsync(t *testing.T, ctx context.Context, dbURL string) (base string, done chan started) {
	addr := testproc.FreeAddr(t)
	cfg := instanceConfig(t, dbURL, map[string]string{"HTTP_ADDR": addr})
	done = make(chan started, 1)
	go func() {
		m, err := app.Start(ctx, cfg, testLogger(t))
		done <- started{m, err}
	}()
	base = "http://" + addr
	for deadline := time.Now().Add(30 * time.Second); ready(base) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the instance never listened")
		}
	}
	return base, done
}

func post(t *testing.T, base, key string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/orders", strings.NewReader(
		`{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":100}]}`))
	req.Header.Set("Authorization", "Bearer "+tenants["replica"])
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode, res.Header
}

// notReadyFor checks that base answers readyz 503 and creates 503 with
// Retry-After, over and over for d.
func notReadyFor(t *testing.T, base string, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if s := ready(base); s != http.StatusServiceUnavailable {
			t.Fatalf("readyz = %d with only the replica reachable, want 503", s)
		}
		if s, h := post(t, base, "replica-only-1"); s != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
			t.Fatalf("create = %d (Retry-After %q) with only the replica reachable, want 503 with Retry-After", s, h.Get("Retry-After"))
		}
	}
}

// noWrites checks what reached the replica and sums it up: each distinct
// statement with its count.
func noWrites(t *testing.T, p *pgProxy) string {
	t.Helper()
	count := map[string]int{}
	var order []string
	for _, sql := range p.seen() {
		if isWrite(sql) {
			t.Errorf("a write reached the replica: %q", sql)
		}
		if count[sql] == 0 {
			order = append(order, sql)
		}
		count[sql]++
	}
	parts := make([]string, len(order))
	for i, sql := range order {
		parts[i] = fmt.Sprintf("%q×%d", sql, count[sql])
	}
	return strings.Join(parts, ", ")
}

// Scenario 4: the service started while only the replica is reachable.
func TestStartWithOnlyTheReplicaReachable(t *testing.T) {
	healthy(t)
	leader, err := ha.cluster.leader()
	if err != nil {
		t.Fatal(err)
	}
	replica := ha.cluster.other(leader)
	toPrimary, toReplica := ha.proxies[leader.name], ha.proxies[replica.name]
	toPrimary.setDown(true)
	defer toPrimary.setDown(false)
	toReplica.seen()

	t.Run("with target_session_attrs=read-write", func(t *testing.T) {
		base, done := startAsync(t, context.Background(), ha.serviceURL)
		notReadyFor(t, base, 3*time.Second)
		n := noWrites(t, toReplica)
		toPrimary.setDown(false)
		st := <-done
		if st.err != nil {
			t.Fatalf("start once the primary is reachable: %v", st.err)
		}
		defer st.m.Close()
		if s := ready(base); s != http.StatusOK {
			t.Errorf("readyz = %d once the primary is reachable", s)
		}
		if s, h := post(t, base, "replica-only-1"); s != http.StatusCreated || h.Get("Idempotent-Replayed") != "" {
			t.Errorf("create = %d (replayed %q): want a first 201, nothing recorded while waiting", s, h.Get("Idempotent-Replayed"))
		}
		figure(t, "scenario 4 (start with only the replica reachable): readyz and creates 503 with Retry-After for 3s; what reached the replica: %s (no write)", n)
	})

	t.Run("with a URL that names only the replica", func(t *testing.T) {
		u, _ := url.Parse(ha.serviceURL)
		u.Host = toReplica.addr()
		q := u.Query()
		q.Del("target_session_attrs") // a misconfiguration, or an address that moved to a replica
		u.RawQuery = q.Encode()
		ctx, cancel := context.WithCancel(context.Background())
		base, done := startAsync(t, ctx, u.String())
		notReadyFor(t, base, 3*time.Second)
		n := noWrites(t, toReplica)
		cancel()
		if st := <-done; st.err == nil {
			st.m.Close()
			t.Fatal("the service started on a replica")
		}
		figure(t, "scenario 4 (a URL naming only the replica): readyz and creates 503 with Retry-After for 3s; what reached the replica: %s (no write); the start gave up when cancelled", n)
	})
}
