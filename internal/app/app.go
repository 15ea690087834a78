package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/metrics"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/channel"
)

// Run is the whole program: `orderservice` serves until ctx ends,
// `orderservice migrate` applies the migrations and exits.
func Run(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	cfg, err := LoadConfig(environ)
	if err != nil {
		return err
	}
	level, _ := cfg.slogLevel()
	logger := slog.New(slog.NewJSONHandler(stdout, &slog.HandlerOptions{Level: level}))

	cmd := "serve"
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "serve":
		m, err := Start(ctx, cfg, logger)
		if err != nil {
			return err
		}
		<-ctx.Done()
		logger.Info("shutting down")
		return m.Close()
	case "migrate":
		db, err := database.Open(ctx, cfg.DatabaseURL, database.Options{MaxConns: 1, StatementTimeout: time.Minute, LockTimeout: time.Minute})
		if err != nil {
			return err
		}
		defer database.Close(db)
		v, err := database.Migrate(cfg.DatabaseURL)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "database schema at version %d\n", v)
		return nil
	case "cleanup":
		return cleanupOnce(ctx, cfg, logger, stdout)
	}
	return fmt.Errorf("unknown command %q (want serve, migrate or cleanup)", cmd)
}

// cleanupOnce is `orderservice cleanup`: one pass of the cleanup job by hand.
func cleanupOnce(ctx context.Context, cfg Config, logger *slog.Logger, stdout io.Writer) error {
	db, err := database.Open(ctx, cfg.DatabaseURL, database.Options{MaxConns: 2, StatementTimeout: time.Minute, LockTimeout: cfg.DBLockTimeout})
	if err != nil {
		return err
	}
	defer database.Close(db)
	policy := cfg.Policy()
	c := &idempotency.Cleaner{DB: db, Store: &idempotency.Store{Lease: cfg.Lease, Policy: policy},
		Batch: cfg.CleanupBatch, Pause: cfg.CleanupPause, Logger: logger}
	res, err := c.Pass(ctx)
	fmt.Fprintf(stdout, "cleanup: deleted %d expired idempotency records, %d of them archived first (money operations: %v)\n",
		res.Deleted, res.Archived, policy.MoneyOperations)
	return err
}

// Main is a running service. Tests start it on 127.0.0.1:0 and Close it.
type Main struct {
	Config  Config
	Logger  *slog.Logger
	DB      *gorm.DB
	Orders  *order.Service
	Metrics *metrics.Metrics
	// Addr is the address the order API listens on.
	Addr string
	// Channel is the embedded mock payment channel, nil when
	// PAYMENT_CHANNEL_URL names an external one.
	Channel     *channel.Server
	ChannelAddr string

	servers []*http.Server
	stop    context.CancelFunc // background loops take no new work
	kill    context.CancelFunc // work in flight stops: the shutdown deadline passed
	workers sync.WaitGroup
}

// Start opens the database (creating it if missing), applies migrations,
// binds the listeners (so a bind error shows now, not later) and starts
// serving and sweeping.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (*Main, error) {
	m := &Main{Config: cfg, Logger: logger}
	if err := m.start(ctx); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Main) start(ctx context.Context) error {
	cfg := m.Config
	db, err := database.Open(ctx, cfg.DatabaseURL, database.Options{
		MaxConns: cfg.DBMaxConns, StatementTimeout: cfg.DBStatementTimeout, LockTimeout: cfg.DBLockTimeout})
	if err != nil {
		return err
	}
	m.DB = db
	version, err := database.Migrate(cfg.DatabaseURL)
	if err != nil {
		return err
	}

	channelURL := cfg.PaymentChannelURL
	if channelURL == "" {
		m.Channel = channel.New(channel.Options{SlowDelay: cfg.ChannelSlowDelay, Logger: m.Logger.With("component", "paymentchannel")})
		ln, err := net.Listen("tcp", cfg.ChannelAddr)
		if err != nil {
			return fmt.Errorf("listen for the embedded payment channel on %s: %w", cfg.ChannelAddr, err)
		}
		m.ChannelAddr = ln.Addr().String()
		m.serve(ln, m.Channel.Handler())
		channelURL = "http://" + m.ChannelAddr
	}

	policy := cfg.Policy()
	records := &idempotency.Store{Lease: cfg.Lease, Policy: policy}
	m.Metrics = metrics.New(func(ctx context.Context) (idempotency.Gauges, error) { return records.Gauges(db.WithContext(ctx)) },
		m.Logger, order.Operations, order.MoneyOperations)
	lifetime, kill := context.WithCancel(context.WithoutCancel(ctx))
	m.kill = kill
	m.Orders = &order.Service{
		DB: db, Records: records, Logger: m.Logger, Observe: m.Metrics, Lifetime: lifetime,
		Channel: payment.NewClient(channelURL, &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}),
		Money: order.MoneyConfig{ChannelTimeout: cfg.ChannelTimeout, RetryAfter: cfg.RetryAfter},
	}
	api := &httpapi.Server{Orders: m.Orders, Records: records, DB: db, Logger: m.Logger,
		Tenants: httpapi.NewTenants(cfg.APIKeys), Policy: policy, Metrics: m.Metrics,
		Admission: httpapi.NewAdmission(cfg.HTTPMaxInFlight, cfg.HTTPMaxQueue, cfg.HTTPQueueTimeout)}
	if api.Admission != nil {
		api.Admission.OnShed, api.Admission.Logger = m.Metrics.Shed, m.Logger
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	m.Addr = ln.Addr().String()
	m.serve(ln, api.HTTPHandler())

	workCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	m.stop = stop
	cleaner := &idempotency.Cleaner{DB: db, Store: records, Batch: cfg.CleanupBatch, Pause: cfg.CleanupPause,
		Logger: m.Logger, Observe: func(r idempotency.CleanupResult) { m.Metrics.Cleaned(r.Deleted, r.Archived) }}
	m.workers.Add(2)
	go func() {
		defer m.workers.Done()
		m.Orders.RunSweeper(workCtx, cfg.SweepInterval, cfg.SweepBatch)
	}()
	go func() {
		defer m.workers.Done()
		cleaner.Run(workCtx, cfg.CleanupInterval)
	}()

	m.Logger.Info("orderservice started", "addr", m.Addr, "schema_version", version,
		"payment_channel", channelURL, "lease", cfg.Lease.String(), "retention", policy.Describe(cfg.Lease))
	return nil
}

func (m *Main) serve(ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(m.Logger.Handler(), slog.LevelWarn)}
	m.servers = append(m.servers, srv)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.Logger.Error("server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
}

// URL is the base URL of the order API.
func (m *Main) URL() string { return "http://" + strings.Replace(m.Addr, "[::]", "127.0.0.1", 1) }

// Close stops accepting requests, lets in-flight ones finish, stops the
// background workers and closes the pool, all within SHUTDOWN_TIMEOUT. When
// the deadline passes, work still in flight (a channel call, a settlement,
// a sweep) is cancelled: its intent stays unfinished and a lease and the
// sweeper of a running instance take it over. The order API stops first,
// the embedded channel last, so a payment in flight can still reach it.
func (m *Main) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), m.Config.ShutdownTimeout)
	defer cancel()
	if m.kill != nil {
		stop := context.AfterFunc(ctx, m.kill)
		defer stop()
	}
	var errs []error
	for i := len(m.servers) - 1; i >= 0; i-- {
		if err := m.servers[i].Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("shutdown within SHUTDOWN_TIMEOUT %s: %w", m.Config.ShutdownTimeout, err))
			_ = m.servers[i].Close()
		}
		if i == len(m.servers)-1 && m.stop != nil { // the API is drained: stop the sweeper next
			m.stop()
			m.waitWorkers(ctx)
		}
	}
	if m.kill != nil {
		m.kill()
	}
	if m.DB != nil {
		errs = append(errs, database.Close(m.DB))
	}
	return errors.Join(errs...)
}

// waitWorkers waits for the background workers to return, or for ctx's
// deadline plus a moment for cancelled work to notice it.
func (m *Main) waitWorkers(ctx context.Context) {
	done := make(chan struct{})
	go func() { m.workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		select {
		case <-done:
		case <-time.After(250 * time.Millisecond):
			m.Logger.Warn("background work did not stop by the shutdown deadline; its intents are left to leases and the sweeper")
		}
	}
}
