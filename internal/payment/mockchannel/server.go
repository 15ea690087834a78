// Package channel is the mock payment channel: an acquirer that honours
// idempotency keys, keeps its ledger (charges, refunds and the idempotency
// records they are) in a PostgreSQL database of its own so that a restart
// forgets nothing, and injects the faults a real network has (lost
// responses, 503s, latency), so that the order service can prove it never
// charges twice. Some charges it settles later, and it tells every outcome
// by signed webhooks, delivered at least once and in no guaranteed order.
package mockchannel

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/webhook"
	"github.com/orderservice/orderservice/migrations"
)

// Defaults of the Options left zero.
const (
	// DefaultSlowDelay is how long pm_slow waits.
	DefaultSlowDelay = 2 * time.Second
	// DefaultAsyncDelay is how long what the channel takes on waits to settle.
	DefaultAsyncDelay = 2 * time.Second
	// DefaultWebhookRetryWindow is how long a webhook is retried.
	DefaultWebhookRetryWindow = 72 * time.Hour
	// DefaultWebhookTimeout bounds one delivery attempt (Standard Webhooks
	// recommends 15 to 30 seconds).
	DefaultWebhookTimeout = 15 * time.Second
	// DefaultWebhookFirstRetry is the wait before a webhook's first retry.
	DefaultWebhookFirstRetry = 5 * time.Second
	// DefaultKeyWindow is how long the channel deduplicates an idempotency
	// key: a day, as real acquirers do.
	DefaultKeyWindow = 24 * time.Hour
)

// DefaultMaxConns is the pool size to the channel's database when
// Options.MaxConns is zero.
const DefaultMaxConns = 10

// directTimeout bounds the methods tests call without a context (Stats,
// Charges, Reset).
const directTimeout = 10 * time.Second

// Options configure a Server; the zero value is usable.
type Options struct {
	// SlowDelay is how long pm_slow charges and refunds take (default 2s).
	SlowDelay time.Duration
	// AsyncDelay is how long pm_async_ok, pm_async_declined and
	// pm_requires_action charges, and refunds of pm_refund_pending charges,
	// wait before they settle (default 2s).
	AsyncDelay time.Duration
	// WebhookURL receives an event for every outcome of a charge or refund;
	// empty: the events are recorded but not delivered.
	WebhookURL string
	// WebhookSecret signs the webhooks ("whsec_" and base64); required with
	// a WebhookURL.
	WebhookSecret string
	// WebhookRetryWindow is how long after its outcome an event is retried
	// before the channel gives up on it (default 72h).
	WebhookRetryWindow time.Duration
	// WebhookTimeout bounds one delivery attempt (default 15s).
	WebhookTimeout time.Duration
	// WebhookFirstRetry is the wait before a failed event's first retry,
	// doubled for each one after it up to 6h, with jitter (default 5s).
	WebhookFirstRetry time.Duration
	// Logger receives request and fault logs; nil discards them.
	Logger *slog.Logger
	// Rand drives the fault dice; set it for deterministic fault tests.
	Rand rand.Source
	// MaxConns bounds the pool to the channel's database (default 10).
	MaxConns int
	// KeyWindow is how long a key deduplicates (default 24h). Past it a
	// POST with the key is a new request: it makes a new charge or refund,
	// which the key then names. A lookup by the key is not bound by it:
	// it finds what was last made under the key, however old.
	KeyWindow time.Duration
}

// Server is the mock channel. Its ledger lives in PostgreSQL, it is safe for
// concurrent use, and several Servers on one database act as one channel.
type Server struct {
	echo      *echo.Echo
	db        *gorm.DB
	store     *store
	faults    *faultInjector
	slowDelay time.Duration
	log       *slog.Logger
	// webhooks delivers the outbox; nil without a WebhookURL.
	webhooks  *sender
	stopLoops context.CancelFunc
	loops     sync.WaitGroup
}

// Open connects to the channel's database at dbURL, creating the database
// if it is missing, applies the channel's migrations and returns a channel
// serving the ledger found there, settling its pending charges and
// delivering its webhooks. Close stops that and releases the pool. Faults
// start cleared: they are chaos settings of one process, not ledger.
func Open(ctx context.Context, dbURL string, opts Options) (*Server, error) {
	if err := checkWebhookOptions(opts); err != nil {
		return nil, err
	}
	db, err := database.Open(ctx, dbURL, database.Options{MaxConns: cmp.Or(opts.MaxConns, DefaultMaxConns),
		StatementTimeout: 5 * time.Second, LockTimeout: 5 * time.Second, ApplicationName: "paymentchannel"})
	if err != nil {
		return nil, fmt.Errorf("payment channel database: %w", err)
	}
	if _, err := migrate(dbURL); err != nil {
		_ = database.Close(db)
		return nil, err
	}
	faults := newFaultInjector(opts.Rand)
	st := &store{db: db, asyncDelay: positiveOr(opts.AsyncDelay, DefaultAsyncDelay), holdBack: faults.webhookHoldBack,
		keyWindow: positiveOr(opts.KeyWindow, DefaultKeyWindow), toSettle: newSignal(), eventRecorded: newSignal()}
	s := &Server{
		echo:      echo.New(),
		db:        db,
		store:     st,
		faults:    faults,
		slowDelay: positiveOr(opts.SlowDelay, DefaultSlowDelay),
		log:       opts.Logger,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.echo.HideBanner, s.echo.HidePort = true, true
	s.echo.HTTPErrorHandler = s.handleError
	s.echo.Use(s.logRequests)
	s.routes()

	// The loops outlive Open's context: Close ends them.
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stopLoops = stop
	s.loops.Go(func() { s.runLoop(loopCtx, "settling what was taken on", s.store.toSettle, s.settlePass) })
	if opts.WebhookURL != "" {
		s.webhooks = newSender(opts, st, faults, s.log)
		s.loops.Go(func() { s.runLoop(loopCtx, "delivering webhooks", s.store.eventRecorded, s.webhooks.pass) })
	}
	return s, nil
}

func positiveOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func checkWebhookOptions(opts Options) error {
	if opts.WebhookURL == "" {
		return nil
	}
	if u, err := url.Parse(opts.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("payment channel webhooks: the URL %q is not an http:// or https:// URL", opts.WebhookURL)
	}
	if _, err := webhook.ParseSecret(opts.WebhookSecret); err != nil {
		return fmt.Errorf("payment channel webhooks: the secret: %w", err)
	}
	return nil
}

// Migrate creates the channel's database at dbURL if it is missing and
// applies the channel's migrations, for `orderservice migrate`; Open does
// the same at start.
func Migrate(ctx context.Context, dbURL string) (version uint, err error) {
	db, err := database.Open(ctx, dbURL, database.Options{MaxConns: 1, StatementTimeout: time.Minute,
		LockTimeout: time.Minute, ApplicationName: "paymentchannel"})
	if err != nil {
		return 0, fmt.Errorf("payment channel database: %w", err)
	}
	defer database.Close(db)
	return migrate(dbURL)
}

// migrate applies the channel's own migration set. Its version is kept in a
// table of its own, so the set may even share a database with the order
// service's without either disturbing the other.
func migrate(dbURL string) (uint, error) {
	v, err := database.MigrateSet(dbURL, database.MigrationSet{
		FS: migrations.ChannelFS, Dir: "channel", Table: "channel_schema_migrations"})
	if err != nil {
		return 0, fmt.Errorf("payment channel database: %w", err)
	}
	return v, nil
}

// Close stops settling and delivering, the attempts in flight cut short
// (their events are due again later), and closes the pool to the channel's
// database; stop serving first.
func (s *Server) Close() error {
	s.stopLoops()
	s.loops.Wait()
	if s.webhooks != nil {
		s.webhooks.client.CloseIdleConnections()
	}
	return database.Close(s.db)
}

// routes is the one place every endpoint of the channel is declared.
func (s *Server) routes() {
	s.echo.GET("/healthz", s.healthz)

	v1 := s.echo.Group("/v1")
	v1.POST("/charges", serveIdempotent(s, s.chargeOp()))
	v1.GET("/charges", serveLookup(s, s.store.lookupCharge, errChargeNotFound))
	v1.POST("/refunds", serveIdempotent(s, s.refundOp()))
	v1.GET("/refunds", serveLookup(s, s.store.lookupRefund, errRefundNotFound))

	admin := s.echo.Group("/admin")
	admin.GET("/stats", s.adminStats)
	admin.GET("/charges", s.adminCharges)
	admin.GET("/faults", s.adminGetFaults)
	admin.POST("/faults", s.adminSetFaults)
	admin.POST("/reset", s.adminReset)
	admin.GET("/webhooks", s.adminWebhooks)
	admin.POST("/webhooks/:id/resend", s.adminResendWebhook)
}

// Handler returns the HTTP handler serving the channel's API, with a
// server span per charge or refund request (joined to the caller's trace
// when it sends one); health and admin calls are not traced.
func (s *Server) Handler() http.Handler {
	return otelhttp.NewHandler(s.echo, "paymentchannel",
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return "paymentchannel " + r.Method + " " + r.URL.Path }),
		otelhttp.WithFilter(func(r *http.Request) bool { return strings.HasPrefix(r.URL.Path, "/v1/") }))
}

// Stats returns the counters so far, read from the ledger. It is for tests,
// which assert exact counts: a database error is logged and yields the zero
// Stats, which no such assertion accepts.
func (s *Server) Stats() Stats {
	ctx, cancel := context.WithTimeout(context.Background(), directTimeout)
	defer cancel()
	st, err := s.store.stats(ctx)
	if err != nil {
		s.log.Error("reading stats", "err", err)
	}
	return st
}

// Charges lists the charges made, oldest first, with the POSTs per key. Like
// Stats it is for tests: a database error is logged and yields no charges.
func (s *Server) Charges() []ChargeRecord {
	ctx, cancel := context.WithTimeout(context.Background(), directTimeout)
	defer cancel()
	recs, err := s.store.chargeRecords(ctx)
	if err != nil {
		s.log.Error("listing charges", "err", err)
	}
	return recs
}

// Reset forgets every charge, refund, webhook event, counter and fault; a
// database error is logged.
func (s *Server) Reset() {
	ctx, cancel := context.WithTimeout(context.Background(), directTimeout)
	defer cancel()
	if err := s.reset(ctx); err != nil {
		s.log.Error("reset", "err", err)
	}
}

func (s *Server) reset(ctx context.Context) error {
	_ = s.faults.set(Faults{}) // zero faults are always valid
	return s.store.reset(ctx)
}

// Faults returns the faults in force.
func (s *Server) Faults() Faults { return s.faults.get() }

// SetFaults replaces the faults in force; out-of-range settings are refused.
func (s *Server) SetFaults(f Faults) error { return s.faults.set(f) }

// beforeRequest applies the latency and 503 faults to a /v1 request.
func (s *Server) beforeRequest(ctx context.Context) error {
	err := s.faults.beforeRequest(ctx)
	if errors.Is(err, errUnavailable) {
		if cerr := s.store.count(context.WithoutCancel(ctx), counterUnavailable); cerr != nil {
			return cerr
		}
	}
	return err
}

func (s *Server) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		status := c.Response().Status
		if err != nil {
			status = problemFor(err).Status
		}
		s.log.Debug("request",
			"method", c.Request().Method,
			"path", c.Request().URL.Path,
			"idempotency_key", c.Request().Header.Get("Idempotency-Key"),
			"status", status,
			"duration", time.Since(start))
		return err
	}
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) adminStats(c echo.Context) error {
	st, err := s.store.stats(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

func (s *Server) adminCharges(c echo.Context) error {
	recs, err := s.store.chargeRecords(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string][]ChargeRecord{"charges": recs})
}

func (s *Server) adminGetFaults(c echo.Context) error {
	return c.JSON(http.StatusOK, s.Faults())
}

func (s *Server) adminSetFaults(c echo.Context) error {
	var f Faults
	if err := decodeBody(c, &f); err != nil {
		return err
	}
	if err := s.SetFaults(f); err != nil {
		return err
	}
	s.log.Info("faults set", "lost_response_rate", f.LostResponseRate, "unavailable_rate", f.UnavailableRate,
		"latency_ms", f.LatencyMS, "latency_jitter_ms", f.LatencyJitterMS,
		"webhook_duplicate_rate", f.WebhookDuplicateRate, "webhook_drop_rate", f.WebhookDropRate,
		"webhook_delay_ms", f.WebhookDelayMS, "webhook_reorder_ms", f.WebhookReorderMS)
	return c.JSON(http.StatusOK, s.Faults())
}

func (s *Server) adminReset(c echo.Context) error {
	if err := s.reset(c.Request().Context()); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
