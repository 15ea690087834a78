package app

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/problem"
)

// openDatabase opens the pool and applies the migrations, waiting up to
// DB_START_TIMEOUT while no read-write database answers (a failover under
// way, only a replica reachable, a server still booting). Any other error
// (bad credentials, a failed migration) stops the start at once.
func (m *Main) openDatabase(ctx context.Context) (uint, error) {
	cfg := m.Config
	deadline := time.Now().Add(cfg.Database.StartTimeout)
	var lastLog time.Time
	for {
		version, err := m.tryOpenDatabase(ctx)
		if err == nil {
			return version, nil
		}
		if !database.IsUnavailable(err) || ctx.Err() != nil || time.Now().After(deadline) {
			return 0, err
		}
		if time.Since(lastLog) >= 10*time.Second {
			m.Logger.Warn("waiting for a read-write database", "err", err, "gives_up_in", time.Until(deadline).Round(time.Second).String())
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (m *Main) tryOpenDatabase(ctx context.Context) (uint, error) {
	cfg := m.Config
	db, err := database.Open(ctx, cfg.Database.URL, cfg.Database.Options())
	if err != nil {
		return 0, err
	}
	// A URL without target_session_attrs=read-write may land on a replica:
	// migrate only once a writable primary answers.
	checkCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := database.CheckWritable(checkCtx, db); err != nil {
		database.Close(db)
		return 0, err
	}
	version, err := database.Migrate(cfg.Database.URL)
	if err != nil {
		database.Close(db)
		return 0, err
	}
	m.DB = db
	return version, nil
}

// startingGate serves the API listener: until the database is ready it
// answers /healthz 200 (the process is alive) and everything else 503 with
// Retry-After, /readyz included; then it hands every request to the API.
type startingGate struct{ api atomic.Pointer[http.Handler] }

func (g *startingGate) open(h http.Handler) { g.api.Store(&h) }

func (g *startingGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := g.api.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/healthz" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"starting"}`))
		return
	}
	unavailable(w, "The service is starting: no read-write database is reachable yet.")
}

// unavailable answers 503 service_unavailable with Retry-After: 1, for a
// request the service takes no part in while it starts or stops.
func unavailable(w http.ResponseWriter, detail string) {
	p := &problem.Error{Code: problem.ServiceUnavailable, RetryAfter: time.Second, Detail: detail}
	resp := answer.RenderError(p)
	w.Header().Set("Content-Type", resp.ContentType)
	w.Header().Set("Retry-After", strconv.Itoa(int(p.RetryAfter/time.Second)))
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}
