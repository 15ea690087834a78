package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/orderservice/orderservice/internal/answer"
	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/problem"
)

// StartError is why the service could not start, as main prints it: the
// setting to change, its value, what went wrong and what to check.
type StartError struct {
	Setting string
	Value   string
	Err     error
	Check   string
}

func (e *StartError) Error() string {
	return fmt.Sprintf("%s=%s: %v; %s", e.Setting, e.Value, e.Err, e.Check)
}

func (e *StartError) Unwrap() error { return e.Err }

// listen binds addr, the value of setting, before anything is served, so
// that an address in use stops the start with its setting named. elsewhere
// says how to do without the listener, if there is a way.
func listen(setting, addr, elsewhere string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &StartError{Setting: setting, Value: addr, Err: err, Check: freeAddress(setting, elsewhere)}
	}
	return ln, nil
}

// freeAddress says what to check when the address in setting cannot be
// listened on.
func freeAddress(setting, elsewhere string) string {
	return "check that no other process listens there (a service already started?), or set " + setting + " to a free address" + elsewhere
}

// openDatabase opens the pool and applies the migrations (awaitDatabase);
// the pool is closed last.
func (m *Main) openDatabase(ctx context.Context, deadline time.Time) (uint, error) {
	var version uint
	err := m.awaitDatabase(ctx, deadline, "DATABASE_URL", m.Config.Database.URL, func() (err error) {
		version, err = m.tryOpenDatabase(ctx)
		return err
	})
	if err != nil {
		return 0, err
	}
	m.stops.at(release, func(context.Context) error { return database.Close(m.DB) })
	return version, nil
}

// awaitDatabase runs open, the opening of the database at url (the value
// of setting), until it succeeds, trying again until deadline
// (DB_START_TIMEOUT from the start) while no read-write database answers
// (PostgreSQL not started yet, a failover under way, only a replica
// reachable). Any other error (a role that does not exist, a failed
// migration) stops the start at once.
func (m *Main) awaitDatabase(ctx context.Context, deadline time.Time, setting, url string, open func() error) error {
	var lastLog time.Time
	for {
		err := open()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !database.IsUnavailable(err):
			return &StartError{Setting: setting, Value: redactURL(url), Err: err,
				Check: "check the user, the password and the database it names (a missing database is created), or set " + setting}
		case time.Now().After(deadline):
			return &StartError{Setting: setting, Value: redactURL(url), Err: err,
				Check: fmt.Sprintf("no read-write PostgreSQL answered there within DB_START_TIMEOUT (%s): check that PostgreSQL "+
					"is running and accepts connections at that address, or set %s", m.Config.Database.StartTimeout, setting)}
		}
		if time.Since(lastLog) >= 10*time.Second {
			m.Logger.Warn("waiting for a read-write database: /healthz answers 200, /readyz and the API 503", "setting", setting,
				"err", err, "gives_up_in", time.Until(deadline).Round(time.Second).String())
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
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
