package app_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
	"github.com/orderservice/orderservice/tests/testproc"
)

const createBody = `{"customer_id":"c","currency":"EUR","items":[{"sku":"S","quantity":1,"unit_price":100}]}`

// switchableRoute forwards TCP connections to target while it is up, and
// closes them at once while it is down: a database server the network
// cannot reach yet.
type switchableRoute struct {
	ln     net.Listener
	target string
	up     atomic.Bool
	wg     sync.WaitGroup
}

func newSwitchableRoute(t *testing.T, target string) *switchableRoute {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &switchableRoute{ln: ln, target: target}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(func() { ln.Close(); r.wg.Wait() })
	return r
}

func (r *switchableRoute) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.up.Load() {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		go func() { io.Copy(s, c); s.Close() }()
		go func() { io.Copy(c, s); c.Close() }()
	}
}

func status(t *testing.T, method, url string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(createBody))
	req.Header.Set("Authorization", "Bearer "+apptest.KeyAcme)
	req.Header.Set("Idempotency-Key", "starting-1")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode, res.Header
}

// TestStartWaitsForAWritableDatabase: a start before PostgreSQL answers (a
// failover, a booting server, `make run` before PostgreSQL was started)
// listens and waits for the service's database and the embedded channel's,
// and serves once they answer.
func TestStartWaitsForAWritableDatabase(t *testing.T) {
	u, _ := url.Parse(dbURL)
	route := newSwitchableRoute(t, u.Host)
	u.Host = route.ln.Addr().String()
	cu, _ := url.Parse(testdb.Fresh(t, "channel"))
	cu.Host = u.Host
	addr := testproc.FreeAddr(t)
	cfg := apptest.Config(t, u.String(), map[string]string{"HTTP_ADDR": addr, "DB_START_TIMEOUT": "60s",
		"CHANNEL_DATABASE_URL": cu.String()})

	type started struct {
		m   *app.Main
		err error
	}
	done := make(chan started, 1)
	go func() {
		m, err := app.Start(context.Background(), cfg, slog.New(slog.DiscardHandler))
		done <- started{m, err}
	}()
	base := "http://" + addr
	if err := waitStatus(base+"/healthz", http.StatusOK); err != nil {
		t.Fatal(err)
	}
	t.Run("while no database is reachable: alive, not ready, every call 503 with Retry-After", func(t *testing.T) {
		if s, _ := status(t, http.MethodGet, base+"/readyz"); s != http.StatusServiceUnavailable {
			t.Errorf("readyz = %d, want 503", s)
		}
		if s, h := status(t, http.MethodPost, base+"/v1/orders"); s != http.StatusServiceUnavailable || h.Get("Retry-After") != "1" {
			t.Errorf("create = %d, Retry-After %q; want 503 with Retry-After 1", s, h.Get("Retry-After"))
		}
	})
	route.up.Store(true)
	st := <-done
	if st.err != nil {
		t.Fatalf("start: %v", st.err)
	}
	t.Cleanup(func() { st.m.Close() })
	t.Run("once it is: ready, and the key sent while starting was never recorded", func(t *testing.T) {
		if s, _ := status(t, http.MethodGet, base+"/readyz"); s != http.StatusOK {
			t.Errorf("readyz = %d, want 200", s)
		}
		if s, h := status(t, http.MethodPost, base+"/v1/orders"); s != http.StatusCreated || h.Get("Idempotent-Replayed") != "" {
			t.Errorf("create = %d (replayed %q), want a first 201", s, h.Get("Idempotent-Replayed"))
		}
	})
}

func TestAReadOnlyDatabaseIsNotReady(t *testing.T) {
	m := apptest.Start(t, dbURL, nil)
	name := strings.TrimPrefix(mustParse(t, dbURL).Path, "/")
	setReadOnly := func(on bool) {
		t.Helper()
		stmt := "ALTER DATABASE " + name + " RESET default_transaction_read_only"
		if on {
			stmt = "ALTER DATABASE " + name + " SET default_transaction_read_only = on"
		}
		// The pool's sessions keep their settings: end them all, from outside
		// the pool, as a demotion does.
		ctx := context.Background()
		admin, err := pgx.Connect(ctx, testdb.ServerURL())
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close(ctx)
		for _, s := range []string{stmt, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" + name +
			"' AND application_name = 'orderservice'"} {
			if _, err := admin.Exec(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	setReadOnly(true)
	t.Cleanup(func() { setReadOnly(false) })

	if err := waitStatus(m.URL()+"/readyz", http.StatusServiceUnavailable); err != nil {
		t.Fatalf("readyz on a read-only database: %v", err)
	}
	c := apptest.NewClient(m, apptest.KeyAcme)
	// The first call may meet a terminated session (57P01), the next the
	// read-only one (25006): both are transient.
	for i := range 2 {
		r := c.Do(t, http.MethodPost, "/v1/orders", "read-only-1", createBody)
		if r.Status != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
			t.Fatalf("create %d on a read-only database = %d %s, want 503 with Retry-After", i+1, r.Status, r.Body)
		}
	}
	setReadOnly(false)
	if err := waitStatus(m.URL()+"/readyz", http.StatusOK); err != nil {
		t.Fatalf("readyz once writable again: %v", err)
	}
	if r := c.Do(t, http.MethodPost, "/v1/orders", "read-only-1", createBody); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("create once writable = %d (replayed %q), want a first 201: nothing was recorded before", r.Status, r.Header.Get("Idempotent-Replayed"))
	}
}

func mustParse(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// waitStatus polls url until it answers want (the service converges on its
// own; the bound only keeps a broken run from hanging).
func waitStatus(url string, want int) error {
	client := &http.Client{Timeout: 2 * time.Second}
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		res, err := client.Get(url)
		if err != nil {
			last = err.Error()
			continue
		}
		res.Body.Close()
		if res.StatusCode == want {
			return nil
		}
		last = res.Status
	}
	return &waitError{url, want, last}
}

type waitError struct {
	url  string
	want int
	last string
}

func (e *waitError) Error() string {
	return e.url + " never answered " + http.StatusText(e.want) + " (last: " + e.last + ")"
}
