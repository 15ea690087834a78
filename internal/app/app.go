package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/gorm"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/metrics"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/payment"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
	"github.com/orderservice/orderservice/internal/tracing"
)

// Run is the whole program: `orderservice` serves until ctx ends,
// `orderservice migrate` applies the migrations and exits, `orderservice
// cleanup` runs one cleanup pass, and `orderservice dlq list|replay` shows
// and replays dead-lettered commands.
func Run(ctx context.Context, args []string, environ map[string]string, stdout io.Writer) error {
	if len(args) > 0 { // these need no configuration
		switch args[0] {
		case "help", "-h", "-help", "--help":
			_, err := io.WriteString(stdout, usage)
			return err
		case "version", "-version", "--version":
			_, err := fmt.Fprintln(stdout, "orderservice", Version())
			return err
		}
	}
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
		stopTracing, err := tracing.Start(ctx, environ, "orderservice")
		if err != nil {
			return err
		}
		defer flushTraces(logger, stopTracing)
		m, err := Start(ctx, cfg, logger)
		if err != nil {
			return err
		}
		<-ctx.Done()
		logger.Info("shutting down")
		return m.Close()
	case "migrate":
		db, err := database.Open(ctx, cfg.Database.URL, database.Options{MaxConns: 1, StatementTimeout: time.Minute, LockTimeout: time.Minute})
		if err != nil {
			return err
		}
		defer database.Close(db)
		v, err := database.Migrate(cfg.Database.URL)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "database schema at version %d\n", v)
		if cfg.Payment.ChannelURL == "" { // the embedded channel's own database too
			cv, err := mockchannel.Migrate(ctx, cfg.Channel.DatabaseURL)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "payment channel database schema at version %d\n", cv)
		}
		return nil
	case "cleanup":
		return cleanupOnce(ctx, cfg, logger, stdout)
	case "dlq":
		return dlq(ctx, cfg, args[1:], stdout)
	}
	return fmt.Errorf("unknown command %q (want serve, migrate, cleanup, dlq, version or help)", cmd)
}

// flushTraces sends the spans still buffered, for at most a few seconds:
// a trace backend that is down does not hold the shutdown.
func flushTraces(logger *slog.Logger, shutdown func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		logger.Warn("traces not flushed", "err", err)
	}
}

// usage is `orderservice help`.
const usage = `Usage: orderservice [command]

Commands:
  serve        serve the order API (the default): HTTP, the NATS door, the sweeper
               and the cleanup; with no PAYMENT_CHANNEL_URL the mock payment channel
               runs in-process, with no NATS_URL an embedded NATS server
  migrate      apply the database migrations and exit
  cleanup      one pass of the retention job: delete expired records, archive money ones
  dlq list     list the dead-lettered commands
  dlq replay SEQ... | --all
               republish dead-lettered commands to their subjects
  version      print the build's version
  help         print this

Every setting is an environment variable; they are listed, with their
defaults, in docs/configuration.md. Traces are off unless the standard
OTEL_* variables turn them on (docs/tracing.md). GET /v1/idempotency-policy
on a running service shows the retention they imply.
`

// version is set at link time when the build names one:
// go build -ldflags "-X github.com/orderservice/orderservice/internal/app.version=v1.2.3".
var version string

// Version is the build's version: the one set at link time, else the
// module version when built from a tagged module, else the VCS revision it
// was built from (with "+dirty" for uncommitted changes), else "devel".
func Version() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "+dirty"
		}
	}
	if rev == "" {
		return "devel"
	}
	return rev[:min(12, len(rev))] + dirty
}

// cleanupOnce is `orderservice cleanup`: one pass of the cleanup job by hand.
func cleanupOnce(ctx context.Context, cfg Config, logger *slog.Logger, stdout io.Writer) error {
	db, err := database.Open(ctx, cfg.Database.URL, database.Options{MaxConns: 2, StatementTimeout: time.Minute, LockTimeout: cfg.Database.LockTimeout})
	if err != nil {
		return err
	}
	defer database.Close(db)
	policy := cfg.Policy()
	c := &idempotency.Cleaner{DB: db, Store: &idempotency.Store{Lease: cfg.Recovery.Lease, Policy: policy},
		Inbox: &idempotency.Inbox{Retention: policy.InboxRetention()},
		Batch: cfg.Cleanup.Batch, Pause: cfg.Cleanup.Pause, Logger: logger}
	res, err := c.Pass(ctx)
	fmt.Fprintf(stdout, "cleanup: deleted %d expired idempotency records, %d of them archived first (money operations: %v); forgot %d webhook deliveries\n",
		res.Deleted, res.Archived, policy.MoneyOperations, res.Forgot)
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
	Channel     *mockchannel.Server
	ChannelAddr string
	// Embedded is the in-process NATS server, nil when NATS_URL names one.
	Embedded *messaging.Embedded
	// NATSURL is the NATS server the service uses: the embedded server's
	// address, or NATS_URL.
	NATSURL string
	// Door is the connection to the broker and what runs on it: the
	// command consumer and the outbox relay.
	Door *messaging.Door
	// Waiter wakes the duplicates that wait for a first attempt's outcome.
	Waiter *idempotency.Waiter

	// lifetime is what kill ends: the requests being served, the detached
	// work of a pay. kill is called when the shutdown deadline passes.
	lifetime context.Context
	kill     context.CancelFunc
	requests requests // those the servers are serving
	stops    shutdown // how to stop what start started
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

// start starts what the service is made of, in order. Each part adds how
// it stops to m.stops, the one way Close stops them, so a start that
// fails half way stops what it started.
func (m *Main) start(ctx context.Context) error {
	m.lifetime, m.kill = context.WithCancel(context.WithoutCancel(ctx))
	m.stops.at(endRequests, m.endRequests)
	gate, err := m.listenAPI() // first: /healthz answers while the rest starts
	if err != nil {
		return err
	}
	deadline := time.Now().Add(m.Config.Database.StartTimeout)
	version, err := m.openDatabase(ctx, deadline)
	if err != nil {
		return err
	}
	channelURL := m.Config.Payment.ChannelURL
	if channelURL == "" {
		if channelURL, err = m.startChannel(ctx, deadline); err != nil {
			return err
		}
	}
	broker, err := m.connectBroker(ctx)
	if err != nil {
		return err
	}
	records, inbox := m.startOrders(ctx, channelURL, broker)
	m.startWorkers(ctx, records, inbox, broker.policy)
	if err := m.openDoor(ctx, broker); err != nil {
		return err
	}
	m.openAPI(gate) // last: the gate hands every request to the API

	cfg, policy := m.Config, broker.policy
	m.Logger.Info("orderservice ready on "+m.publicURL(), "addr", m.Addr, "schema_version", version,
		"payment_channel", channelURL, "nats", redactURL(m.NATSURL), "lease", cfg.Recovery.Lease.String(), "retention", policy.Describe(cfg.Recovery.Lease),
		"message_redelivery_source", broker.sources["message_redelivery"], "outbox_retention", outboxRetention(policy).String())
	return nil
}

// listenAPI binds the order API's address and serves the starting gate on
// it. The API listens before the database is there: /healthz and /readyz
// answer (200, 503) while a failover or a booting database is awaited, and
// nothing touches a database that is not a writable primary.
func (m *Main) listenAPI() (*startingGate, error) {
	ln, err := listen("HTTP_ADDR", m.Config.HTTP.Addr, "")
	if err != nil {
		return nil, err
	}
	m.Addr = ln.Addr().String()
	gate := &startingGate{}
	m.serve(ln, gate, stopDoors)
	return gate, nil
}

// startChannel starts the embedded mock channel, once the service's
// database is there (its own is on the same server by default), and
// returns its URL. The channel's ledger is its own database, so a restart
// of the service forgets no charge, as a real acquirer would not. It
// delivers its webhooks to this service (the gate answers 503 until the
// service is ready, and the channel delivers again).
func (m *Main) startChannel(ctx context.Context, deadline time.Time) (string, error) {
	cfg := m.Config
	err := m.awaitDatabase(ctx, deadline, "CHANNEL_DATABASE_URL", cfg.Channel.DatabaseURL, func() (err error) {
		m.Channel, err = mockchannel.Open(ctx, cfg.Channel.DatabaseURL, cfg.Channel.Options(cfg.Payment,
			m.URL()+"/webhooks/payment-channel", m.Logger.With("component", "paymentchannel")))
		return err
	})
	if err != nil {
		return "", err
	}
	m.stops.at(closeChannel, func(context.Context) error { return m.Channel.Close() })
	ln, err := listen("CHANNEL_ADDR", cfg.Channel.Addr, " (or PAYMENT_CHANNEL_URL to a channel running elsewhere)")
	if err != nil {
		return "", err
	}
	m.ChannelAddr = ln.Addr().String()
	m.serve(ln, m.Channel.Handler(), stopChannel)
	return "http://" + m.ChannelAddr, nil
}

// connectedBroker is the connection to NATS as start made it, and the
// retention policy the streams it holds imply.
type connectedBroker struct {
	dial    func() (*nats.Conn, error)
	conn    *nats.Conn
	policy  idempotency.Policy
	sources map[string]string // each replay window's source, for the start line
}

// connectBroker starts the embedded NATS server (unless NATS_URL names
// one), connects to it, and reads the streams the commands replay from.
func (m *Main) connectBroker(ctx context.Context) (connectedBroker, error) {
	embedded, dial, natsURL, err := natsDialer(m.Config, true)
	if err != nil {
		return connectedBroker{}, err
	}
	m.Embedded, m.NATSURL = embedded, natsURL
	if embedded != nil {
		m.stops.at(release, func(context.Context) error { embedded.Close(); return nil })
	}
	nc, err := dial()
	if err != nil {
		return connectedBroker{}, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return connectedBroker{}, err
	}
	policy, sources, err := brokerPolicy(ctx, m.Config, js, m.Logger)
	if err != nil {
		nc.Close()
		return connectedBroker{}, err
	}
	return connectedBroker{dial: dial, conn: nc, policy: policy, sources: sources}, nil
}

// startOrders makes the order use cases, their metrics and the waiter that
// wakes the duplicates of an intent in flight, and returns the records and
// the inbox they keep.
func (m *Main) startOrders(ctx context.Context, channelURL string, b connectedBroker) (*idempotency.Store, *idempotency.Inbox) {
	cfg, db := m.Config, m.DB
	records := &idempotency.Store{Lease: cfg.Recovery.Lease, PhaseTimeout: cfg.Payment.ChannelTimeout, Policy: b.policy}
	inbox := &idempotency.Inbox{Retention: b.policy.InboxRetention()}
	m.Metrics = metrics.New(func(ctx context.Context) (idempotency.Gauges, error) { return records.Gauges(db.WithContext(ctx)) },
		m.Logger, order.Operations, order.MoneyOperations)
	if pool, err := db.DB(); err == nil {
		m.Metrics.WatchDB(pool)
	}
	m.Waiter = &idempotency.Waiter{URL: cfg.Database.URL, Poll: time.Second, Logger: m.Logger, Observe: m.Metrics.Waited}
	stopping, cancelWaits := context.WithCancel(context.WithoutCancel(ctx))
	m.stops.at(stopWaiting, func(context.Context) error { cancelWaits(); return nil })
	m.Orders = order.NewService(order.Deps{
		DB: db, Records: records, Inbox: inbox, Logger: m.Logger, Observe: m.Metrics, Done: m.lifetime.Done(),
		Waiter: m.Waiter, MaxWait: cfg.HTTP.MaxWait, Stopping: stopping.Done(),
		WindowSources: b.sources, OutboxRetention: outboxRetention(b.policy),
		Channel: payment.NewClient(channelURL, &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: cfg.Payment.ChannelMaxInFlight, IdleConnTimeout: 90 * time.Second}}),
		Money: cfg.Payment.Money(),
	})
	return records, inbox
}

// startWorkers starts the background loops: the waiter, the sweeper that
// finishes intents whose owner stopped, and the cleanups of expired
// records and published events.
func (m *Main) startWorkers(ctx context.Context, records *idempotency.Store, inbox *idempotency.Inbox, policy idempotency.Policy) {
	cfg := m.Config
	cleaner := &idempotency.Cleaner{DB: m.DB, Store: records, Inbox: inbox, Batch: cfg.Cleanup.Batch, Pause: cfg.Cleanup.Pause,
		Logger: m.Logger, Observe: func(r idempotency.CleanupResult) { m.Metrics.Cleaned(r.Deleted, r.Archived) }}
	outboxCleaner := &messaging.OutboxCleaner{Outbox: &order.Outbox{DB: m.DB}, Retention: outboxRetention(policy),
		Batch: cfg.Cleanup.Batch, Logger: m.Logger}
	workCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	var workers sync.WaitGroup
	m.stops.at(stopWorkers, func(ctx context.Context) error {
		stop()
		if !waitFor(ctx, &workers) {
			m.Logger.Warn("background work did not stop by the shutdown deadline; its intents are left to leases and the sweeper")
		}
		return nil
	})
	for _, run := range []func(context.Context){
		m.Waiter.Run,
		func(ctx context.Context) {
			m.Orders.RunSweeper(ctx, cfg.Recovery.SweepInterval, cfg.Recovery.SweepBatch)
		},
		func(ctx context.Context) { cleaner.Run(ctx, cfg.Cleanup.Interval) },
		func(ctx context.Context) { outboxCleaner.Run(ctx, cfg.Cleanup.Interval) },
	} {
		workers.Go(func() { run(workCtx) })
	}
}

// openDoor opens the broker door on the connection connectBroker made:
// the command consumer and the outbox relay, and a new connection when the
// broker closes one for good.
func (m *Main) openDoor(ctx context.Context, b connectedBroker) error {
	cfg := m.Config
	outbox := &order.Outbox{DB: m.DB}
	m.Metrics.WatchOutbox(outbox.Lag)
	relay := &messaging.Relay{Outbox: outbox, Batch: cfg.Outbox.Batch, Interval: cfg.Outbox.Interval,
		Observe: m.Metrics, Logger: m.Logger}
	consumer := &messaging.Consumer{Orders: m.Orders, Tenants: cfg.APIKeys,
		MaxDeliver: cfg.Commands.MaxDeliver, AckWait: cfg.Commands.AckWait, Workers: cfg.Commands.Workers,
		Backoff: messaging.Backoff{Base: cfg.Commands.Backoff, Max: cfg.Commands.BackoffMax}, WaitersPerTenant: cfg.Commands.WaitersPerTenant,
		Horizon: messaging.Horizon(b.policy), Observe: m.Metrics, Logger: m.Logger,
		MaxAge: b.policy.Window("message_redelivery")} // ORDER_COMMANDS's max_age (brokerPolicy)
	m.Door = &messaging.Door{Dial: b.dial, Consumer: consumer, Relay: relay, Logger: m.Logger,
		Prepare: func(ctx context.Context, js jetstream.JetStream) error {
			_, _, err := brokerPolicy(ctx, cfg, js, m.Logger)
			return err
		},
		Retry: messaging.Backoff{Base: 500 * time.Millisecond, Max: 10 * time.Second}, Reopened: m.Metrics.BrokerDoorReopened}
	m.stops.at(stopDoors, m.Door.StopCommands)
	m.stops.at(release, m.Door.Close)
	if err := m.Door.Open(ctx, b.conn); err != nil {
		return err
	}
	m.Metrics.WatchBroker(m.Door.Ready)
	m.Metrics.WatchDLQ(func(ctx context.Context) (uint64, error) { return (&messaging.DLQ{JS: m.Door.JS()}).Depth(ctx) })
	return nil
}

// openAPI hands the starting gate the order API: from now on it serves
// every request, and /readyz answers for the database and the broker door.
func (m *Main) openAPI(gate *startingGate) {
	cfg := m.Config
	api := &httpapi.Server{Orders: m.Orders, Ready: ready(m.DB, m.Door.Ready), Logger: m.Logger,
		Tenants: httpapi.NewTenants(cfg.APIKeys), Metrics: m.Metrics,
		Admission: cfg.Admission(), Quotas: httpapi.NewQuotas(cfg.Limits()), BodyTimeout: cfg.HTTP.BodyTimeout,
		CORSOrigins: cfg.HTTP.CORSAllowedOrigins, WebhookSecrets: cfg.Payment.WebhookSecrets}
	if api.Admission != nil {
		api.Admission.OnRefuse = func(tenant string, why httpapi.Refusal) {
			m.Metrics.Refused(tenant, string(why), http.StatusServiceUnavailable)
		}
		api.Admission.Logger = m.Logger
	}
	m.Metrics.WatchTenants(cfg.tenantNames(), refusalReasons())
	gate.open(api.HTTPHandler())
}

// serve serves h on ln, each request's context a child of the lifetime;
// the server shuts down at stage s.
func (m *Main) serve(ln net.Listener, h http.Handler, s stage) {
	cfg := m.Config.HTTP
	srv := &http.Server{Handler: m.requests.track(h), ReadHeaderTimeout: cfg.ReadHeaderTimeout, WriteTimeout: cfg.WriteTimeout,
		IdleTimeout: cfg.IdleTimeout,
		ErrorLog:    slog.NewLogLogger(m.Logger.Handler(), slog.LevelWarn),
		BaseContext: func(net.Listener) context.Context { return m.lifetime }}
	m.stops.at(s, func(ctx context.Context) error {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
			return fmt.Errorf("shutdown within SHUTDOWN_TIMEOUT %s: %w", m.Config.ShutdownTimeout, err)
		}
		return nil
	})
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.Logger.Error("server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
}

// endRequests cancels the work still in flight and lets the handlers still
// running return: a server closed at the deadline leaves its handlers
// running, and they must return before what they use (the channel's
// ledger, the pool) is closed.
func (m *Main) endRequests(ctx context.Context) error {
	m.kill()
	if !waitFor(ctx, m.requests.close()) {
		m.Logger.Warn("requests still being served after the shutdown deadline")
	}
	return nil
}

// URL is the base URL of the order API.
func (m *Main) URL() string { return "http://" + strings.Replace(m.Addr, "[::]", "127.0.0.1", 1) }

// publicURL is the base URL a person on this machine opens: localhost when
// the API listens on every interface.
func (m *Main) publicURL() string {
	host, port, err := net.SplitHostPort(m.Addr)
	if err != nil || !net.ParseIP(host).IsUnspecified() {
		return m.URL()
	}
	return "http://localhost:" + port
}

// Close stops accepting requests and commands, lets in-flight ones finish,
// stops the background workers and closes the NATS connection, the embedded
// NATS server and the pool, all within SHUTDOWN_TIMEOUT, in the stages of
// a shutdown (shutdown.go). When the deadline passes, work still in flight
// (a request, a channel call, a reply being stored, a sweep) is cancelled:
// its intent stays unfinished and a lease and the sweeper of a running
// instance take it over. Nothing is closed under a request still being
// served. The order API and the command consumer stop first, the embedded
// channel last, so a payment in flight can still reach it.
func (m *Main) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), m.Config.ShutdownTimeout)
	defer cancel()
	if m.kill != nil {
		stop := context.AfterFunc(ctx, m.kill)
		defer stop()
	}
	return m.stops.run(ctx)
}
