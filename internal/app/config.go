// Package app wires the service together: configuration, database,
// payment channel, HTTP server and background workers, with a Main that
// starts and stops them all so end-to-end tests can boot the real thing.
package app

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/order"
	"github.com/orderservice/orderservice/internal/webhook"
)

// Config is every setting of the service, read once from the environment.
// Each field's comment is its line in docs/configuration.md, which a test
// generates from this struct (go test ./internal/app -run Reference -update
// rewrites it); a "Default:" line names a default the tag cannot hold.
type Config struct {
	// DatabaseURL is the PostgreSQL URL, one host or several
	// (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`,
	// see docs/scaling.md).
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://postgres:postgres@localhost:5432/orderservice?sslmode=disable"`
	// HTTPAddr is the listen address of the order API.
	HTTPAddr string `env:"HTTP_ADDR" envDefault:":8080"`
	// APIKeys are `tenant=key` pairs, comma separated (keys of at least 8
	// characters, distinct; a tenant is letters, digits, `-` and `_`).
	APIKeys map[string]string `env:"API_KEYS" envDefault:"acme=demo-key-acme,globex=demo-key-globex" envKeyValSeparator:"="`
	// PaymentChannelURL is the base URL of the payment channel; empty runs
	// the mock channel in-process.
	PaymentChannelURL string `env:"PAYMENT_CHANNEL_URL"`
	// ChannelAddr is where the in-process mock channel listens.
	ChannelAddr string `env:"CHANNEL_ADDR" envDefault:"127.0.0.1:8081"`
	// LogLevel is `debug`, `info`, `warn` or `error`.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// ChannelDatabaseURL is the in-process channel's own database (created
	// if missing, migrated at start).
	// Default: DATABASE_URL's server, database `paymentchannel`
	ChannelDatabaseURL string `env:"CHANNEL_DATABASE_URL"`
	// ChannelSlowDelay is how long the in-process channel takes for `pm_slow`.
	ChannelSlowDelay time.Duration `env:"PAYMENT_SLOW_DELAY" envDefault:"2s"`
	// ChannelAsyncDelay is how long the in-process channel takes to settle a
	// charge it took on as pending (`pm_async_ok`, `pm_async_declined`).
	ChannelAsyncDelay time.Duration `env:"PAYMENT_ASYNC_DELAY" envDefault:"2s"`
	// ChannelWebhookRetryWindow is how long the in-process channel retries
	// a webhook delivery, with backoff.
	ChannelWebhookRetryWindow time.Duration `env:"CHANNEL_WEBHOOK_RETRY_WINDOW" envDefault:"72h"`
	// WebhookSecrets verify the payment channel's webhooks (Standard
	// Webhooks: `whsec_` and base64, comma separated: two while one is
	// rotated); the in-process channel signs with the first.
	WebhookSecrets []string `env:"PAYMENT_WEBHOOK_SECRET" envDefault:"whsec_b3JkZXJzZXJ2aWNlLWRldi13ZWJob29rLXNlY3JldCE="`

	// DBMaxConns is the connection pool's size.
	DBMaxConns int `env:"DB_MAX_CONNS" envDefault:"20"`
	// DBStatementTimeout is the server-side statement timeout.
	DBStatementTimeout time.Duration `env:"DB_STATEMENT_TIMEOUT" envDefault:"5s"`
	// DBLockTimeout is how long a duplicate waits for the first request's
	// transaction before its 409; shorter than DB_STATEMENT_TIMEOUT.
	DBLockTimeout time.Duration `env:"DB_LOCK_TIMEOUT" envDefault:"3s"`
	// DBConnMaxLifetime bounds a pooled connection's life: after a failover
	// the pool is on the new primary within this long even where nothing
	// broke the old connections.
	DBConnMaxLifetime time.Duration `env:"DB_CONN_MAX_LIFETIME" envDefault:"2m"`
	// DBStartTimeout is how long the start waits for a writable primary (a
	// failover, a booting database) while /healthz answers 200 and /readyz
	// 503; then it gives up.
	DBStartTimeout time.Duration `env:"DB_START_TIMEOUT" envDefault:"60s"`

	// CORSAllowedOrigins are the exact origins (`https://shop.example`,
	// comma separated, no wildcard) whose pages may call /v1 from a browser;
	// empty turns CORS off.
	CORSAllowedOrigins []string `env:"CORS_ALLOWED_ORIGINS"`

	// HTTPMaxInFlight is how many /v1 requests are served at once (a pay or
	// refund gives its slot back while it waits for the channel, a duplicate
	// while it waits with Prefer: wait); 0 turns admission control off.
	HTTPMaxInFlight int `env:"HTTP_MAX_IN_FLIGHT" envDefault:"32"`
	// HTTPMaxQueue is the most that may wait for a slot (FIFO); fewer may
	// when slots come free too slowly for them all to get one within a
	// tenth of HTTP_QUEUE_TIMEOUT (never fewer than HTTP_MAX_IN_FLIGHT, nor
	// 8). Beyond the bound a request is refused at once.
	HTTPMaxQueue int `env:"HTTP_MAX_QUEUE" envDefault:"1024"`
	// HTTPQueueTimeout is the longest wait for a slot; when every waiter for
	// a fifth of it waited longer than a tenth of it (a standing queue), new
	// arrivals that find no free slot are refused at once, and those already
	// queued are still served (docs/concepts.md §9).
	HTTPQueueTimeout time.Duration `env:"HTTP_QUEUE_TIMEOUT" envDefault:"1s"`

	// Lease is how long an owner may work on an intent before it can be
	// taken over; it must exceed PAYMENT_CHANNEL_TIMEOUT by a second.
	Lease time.Duration `env:"IDEMPOTENCY_LEASE" envDefault:"30s"`
	// ChannelTimeout bounds one call to the payment channel.
	ChannelTimeout time.Duration `env:"PAYMENT_CHANNEL_TIMEOUT" envDefault:"10s"`
	// ChannelMaxInFlight bounds the pays and refunds at the payment channel
	// at once, per instance; one beyond it is refused before anything is
	// recorded.
	ChannelMaxInFlight int `env:"PAYMENT_CHANNEL_MAX_IN_FLIGHT" envDefault:"64"`
	// RetryAfter is the Retry-After after an unknown channel outcome (whole
	// seconds, at least 1); the sweeper resumes the intent after it.
	RetryAfter time.Duration `env:"PAYMENT_RETRY_AFTER" envDefault:"2s"`
	// ChannelKeyWindow is how long the payment channel remembers an
	// idempotency key; a retry of an intent older than this asks the channel
	// what it holds before sending the key again.
	ChannelKeyWindow time.Duration `env:"PAYMENT_CHANNEL_KEY_WINDOW" envDefault:"24h"`
	// PendingCheckEvery is how often the sweeper asks the channel about a
	// payment it took on as pending, when no webhook told its outcome.
	PendingCheckEvery time.Duration `env:"PAYMENT_PENDING_CHECK_EVERY" envDefault:"30s"`
	// SweepInterval is how often the sweeper looks for expired leases and
	// retryable intents.
	SweepInterval time.Duration `env:"SWEEP_INTERVAL" envDefault:"5s"`
	// SweepBatch is the most intents one sweep takes.
	SweepBatch int `env:"SWEEP_BATCH" envDefault:"100"`

	// ClientRetryWindow is how long clients may retry a request.
	ClientRetryWindow time.Duration `env:"REPLAY_WINDOW_CLIENT_RETRY" envDefault:"24h"`
	// MessageRedeliveryWindow is the max_age of ORDER_COMMANDS (and of the
	// results and events streams) when the service creates it; an existing
	// stream's max_age wins (docs/operations.md).
	MessageRedeliveryWindow time.Duration `env:"REPLAY_WINDOW_MESSAGE_REDELIVERY" envDefault:"168h"`
	// ManualCompensationWindow is how long operators may replay by hand;
	// also the DLQ's max_age when the service creates it.
	ManualCompensationWindow time.Duration `env:"REPLAY_WINDOW_MANUAL_COMPENSATION" envDefault:"720h"`
	// WebhookReplayWindow is how long the payment channel may deliver a
	// webhook again (the longest an acquirer is known to retry: 30 days);
	// the webhook inbox remembers a delivery that long plus the margin. A
	// window shorter than CHANNEL_WEBHOOK_RETRY_WINDOW is refused.
	WebhookReplayWindow time.Duration `env:"REPLAY_WINDOW_WEBHOOK" envDefault:"720h"`
	// RetentionMargin is added to the longest window; a negative margin (or
	// window) is refused.
	RetentionMargin time.Duration `env:"RETENTION_MARGIN" envDefault:"24h"`
	// MoneyRetentionFloor is the least retention of order.pay and
	// order.cancel records (archived when removed).
	MoneyRetentionFloor time.Duration `env:"MONEY_RETENTION_FLOOR" envDefault:"2160h"`
	// Retention overrides the derived retention; refused if shorter than the
	// longest window plus the margin.
	// Default: derived
	Retention time.Duration `env:"IDEMPOTENCY_RETENTION"`

	// CleanupInterval is the cleanup job's period.
	CleanupInterval time.Duration `env:"CLEANUP_INTERVAL" envDefault:"1h"`
	// CleanupBatch is how many records one cleanup transaction removes:
	// small batches keep each commit's WAL small.
	CleanupBatch int `env:"CLEANUP_BATCH" envDefault:"500"`
	// CleanupPause is the cleanup's pause between batches.
	CleanupPause time.Duration `env:"CLEANUP_PAUSE" envDefault:"5ms"`

	// ShutdownTimeout bounds the whole shutdown after SIGTERM, background
	// work included (below Docker's default 10s stop grace period).
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"8s"`

	// MaxWait caps Prefer: wait=N, how long a duplicate may wait for its
	// first attempt's outcome.
	MaxWait time.Duration `env:"MAX_WAIT" envDefault:"10s"`

	// NATSURL names the NATS server or cluster
	// (`nats://user:password@host:4222`, comma separated); empty runs an
	// embedded NATS server with JetStream.
	NATSURL string `env:"NATS_URL"`
	// NATSEmbeddedAddr is where the embedded NATS server listens (port 0:
	// any free port).
	NATSEmbeddedAddr string `env:"NATS_EMBEDDED_ADDR" envDefault:"127.0.0.1:4223"`
	// NATSStoreDir is where the embedded server keeps JetStream's streams;
	// it must survive restarts for a redelivery to survive one.
	// Default: $TMPDIR/orderservice-nats
	NATSStoreDir string `env:"NATS_STORE_DIR"`
	// NATSServicePassword is the embedded server's password for the
	// service's own user `orderservice`, which `orderservice dlq` uses too.
	NATSServicePassword string `env:"NATS_SERVICE_PASSWORD" envDefault:"orderservice-dev-secret"`
	// NATSStreamReplicas is how many copies of each stream the service
	// creates: 3 on a three-node JetStream cluster.
	NATSStreamReplicas int `env:"NATS_STREAM_REPLICAS" envDefault:"1"`
	// CommandMaxDeliver is how many deliveries a transiently failing
	// command gets before it is dead-lettered.
	CommandMaxDeliver int `env:"COMMAND_MAX_DELIVER" envDefault:"5"`
	// CommandAckWait is how long JetStream waits for an answer before it
	// redelivers (a running command reports progress).
	CommandAckWait time.Duration `env:"COMMAND_ACK_WAIT" envDefault:"30s"`
	// CommandBackoff is the first delay before a transient failure is
	// redelivered, doubled per delivery.
	CommandBackoff time.Duration `env:"COMMAND_BACKOFF" envDefault:"1s"`
	// CommandBackoffMax caps that delay.
	CommandBackoffMax time.Duration `env:"COMMAND_BACKOFF_MAX" envDefault:"30s"`
	// CommandWorkers is how many commands one instance runs (and fetches)
	// at once.
	CommandWorkers int `env:"COMMAND_WORKERS" envDefault:"16"`
	// OutboxInterval is the relay's pause when the outbox is empty.
	OutboxInterval time.Duration `env:"OUTBOX_INTERVAL" envDefault:"100ms"`
	// OutboxBatch is how many events the relay publishes per batch.
	OutboxBatch int `env:"OUTBOX_BATCH" envDefault:"200"`
}

// natsStoreDir is NATS_STORE_DIR or its default.
func (c Config) natsStoreDir() string {
	if c.NATSStoreDir != "" {
		return c.NATSStoreDir
	}
	return filepath.Join(os.TempDir(), "orderservice-nats")
}

// LoadConfig parses and validates the configuration in environ.
func LoadConfig(environ map[string]string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ}); err != nil {
		return cfg, errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if cfg.ChannelDatabaseURL == "" {
		cfg.ChannelDatabaseURL = withDatabase(cfg.DatabaseURL, DefaultChannelDatabase)
	}
	return cfg, cfg.validate()
}

// DefaultChannelDatabase is the embedded channel's database on DATABASE_URL's
// server when CHANNEL_DATABASE_URL is empty.
const DefaultChannelDatabase = "paymentchannel"

// withDatabase is dbURL naming database name instead, with the same user,
// hosts (all of them, for a multi-host URL) and parameters.
func withDatabase(dbURL, name string) string {
	scheme, rest, ok := strings.Cut(dbURL, "://")
	if !ok {
		return dbURL // not a URL: validate says so
	}
	authority, query := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority = rest[:i]
		if j := strings.IndexByte(rest[i:], '?'); j >= 0 {
			query = rest[i+j:]
		}
	}
	return scheme + "://" + authority + "/" + name + query
}

func (c Config) validate() error {
	// pgx's parser, not url.Parse: it knows libpq's multi-host form
	// (postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write).
	if !strings.HasPrefix(c.DatabaseURL, "postgres://") && !strings.HasPrefix(c.DatabaseURL, "postgresql://") {
		return fmt.Errorf("DATABASE_URL must be a postgres:// URL")
	}
	if err := database.CheckURL(c.DatabaseURL); err != nil {
		return fmt.Errorf("DATABASE_URL is not a valid postgres:// URL (one or more host:port, comma separated): %s", oneLine(err))
	}
	if err := database.CheckURL(c.ChannelDatabaseURL); err != nil || !strings.HasPrefix(c.ChannelDatabaseURL, "postgres") {
		return fmt.Errorf("CHANNEL_DATABASE_URL must be a postgres:// URL")
	}
	if len(c.APIKeys) == 0 {
		return fmt.Errorf("API_KEYS must name at least one tenant=key pair")
	}
	seen := map[string]string{}
	for tenant, key := range c.APIKeys {
		if tenant == "" || len(key) < 8 {
			return fmt.Errorf("API_KEYS: tenant %q needs a name and a key of at least 8 characters", tenant)
		}
		if other, dup := seen[key]; dup {
			return fmt.Errorf("API_KEYS: tenants %q and %q share a key", other, tenant)
		}
		seen[key] = tenant
	}
	if c.PaymentChannelURL != "" {
		if u, err := url.Parse(c.PaymentChannelURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("PAYMENT_CHANNEL_URL must be an http(s) URL")
		}
	}
	if _, err := c.slogLevel(); err != nil {
		return err
	}
	for name, d := range map[string]time.Duration{
		"DB_STATEMENT_TIMEOUT": c.DBStatementTimeout, "DB_LOCK_TIMEOUT": c.DBLockTimeout,
		"DB_CONN_MAX_LIFETIME": c.DBConnMaxLifetime, "DB_START_TIMEOUT": c.DBStartTimeout,
		"IDEMPOTENCY_LEASE": c.Lease, "PAYMENT_CHANNEL_TIMEOUT": c.ChannelTimeout, "PAYMENT_RETRY_AFTER": c.RetryAfter,
		"PAYMENT_CHANNEL_KEY_WINDOW": c.ChannelKeyWindow, "PAYMENT_PENDING_CHECK_EVERY": c.PendingCheckEvery,
		"PAYMENT_ASYNC_DELAY": c.ChannelAsyncDelay, "CHANNEL_WEBHOOK_RETRY_WINDOW": c.ChannelWebhookRetryWindow,
		"SWEEP_INTERVAL": c.SweepInterval, "SHUTDOWN_TIMEOUT": c.ShutdownTimeout, "CLEANUP_INTERVAL": c.CleanupInterval,
		"COMMAND_ACK_WAIT": c.CommandAckWait, "COMMAND_BACKOFF": c.CommandBackoff, "COMMAND_BACKOFF_MAX": c.CommandBackoffMax,
		"OUTBOX_INTERVAL": c.OutboxInterval,
	} {
		if d <= 0 {
			return fmt.Errorf("%s must be a positive duration", name)
		}
	}
	if c.DBMaxConns < 1 || c.ChannelMaxInFlight < 1 || c.SweepBatch < 1 || c.CleanupBatch < 1 {
		return fmt.Errorf("DB_MAX_CONNS, PAYMENT_CHANNEL_MAX_IN_FLIGHT, SWEEP_BATCH and CLEANUP_BATCH must be at least 1")
	}
	if c.MaxWait < 0 || c.MaxWait >= c.ShutdownTimeout+time.Minute {
		return fmt.Errorf("MAX_WAIT must be between 0 and a minute beyond SHUTDOWN_TIMEOUT, not %s", c.MaxWait)
	}
	if c.CommandMaxDeliver < 1 || c.CommandWorkers < 1 || c.OutboxBatch < 1 {
		return fmt.Errorf("COMMAND_MAX_DELIVER, COMMAND_WORKERS and OUTBOX_BATCH must be at least 1")
	}
	if c.CommandBackoffMax < c.CommandBackoff {
		return fmt.Errorf("COMMAND_BACKOFF_MAX (%s) must not be shorter than COMMAND_BACKOFF (%s)", c.CommandBackoffMax, c.CommandBackoff)
	}
	if c.CommandAckWait < time.Second {
		return fmt.Errorf("COMMAND_ACK_WAIT must be at least 1s")
	}
	for _, server := range strings.Split(c.NATSURL, ",") {
		if u, err := url.Parse(server); c.NATSURL != "" && (err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "") {
			return fmt.Errorf("NATS_URL must be nats:// or tls:// URLs, comma-separated (or empty for the embedded server)")
		}
	}
	if err := c.streamWindows().Check(); err != nil {
		return err
	}
	for tenant := range c.APIKeys {
		if !messaging.IsToken(tenant) {
			return fmt.Errorf("API_KEYS: tenant %q must be letters, digits, '-' and '_' only: it is a NATS subject token and user name", tenant)
		}
	}
	for _, o := range c.CORSAllowedOrigins {
		if err := httpapi.CheckOrigin(o); err != nil {
			return fmt.Errorf("CORS_ALLOWED_ORIGINS: %w", err)
		}
	}
	if c.CleanupPause < 0 {
		return fmt.Errorf("CLEANUP_PAUSE must not be negative")
	}
	if c.HTTPMaxInFlight < 0 || c.HTTPMaxQueue < 0 || c.HTTPQueueTimeout <= 0 {
		return fmt.Errorf("HTTP_MAX_IN_FLIGHT and HTTP_MAX_QUEUE must not be negative, HTTP_QUEUE_TIMEOUT must be positive")
	}
	// A duplicate waiting on the first request's lock must give up (409)
	// before its statement is cancelled (which would read as an outage, 503).
	if c.DBLockTimeout >= c.DBStatementTimeout {
		return fmt.Errorf("DB_LOCK_TIMEOUT (%s) must be shorter than DB_STATEMENT_TIMEOUT (%s)", c.DBLockTimeout, c.DBStatementTimeout)
	}
	// An owner must be able to finish a channel call within its lease, or
	// a takeover would race a call that is still running.
	if c.Lease < c.ChannelTimeout+time.Second {
		return fmt.Errorf("IDEMPOTENCY_LEASE (%s) must exceed PAYMENT_CHANNEL_TIMEOUT (%s) by at least 1s", c.Lease, c.ChannelTimeout)
	}
	// The inbox must remember a delivery for as long as the channel may
	// send it again, or a late redelivery would be applied as a first one.
	if c.WebhookReplayWindow < c.ChannelWebhookRetryWindow {
		return fmt.Errorf("REPLAY_WINDOW_WEBHOOK (%s) is unsafe: the payment channel retries a webhook for CHANNEL_WEBHOOK_RETRY_WINDOW (%s), so its deliveries must be remembered at least that long",
			c.WebhookReplayWindow, c.ChannelWebhookRetryWindow)
	}
	if len(c.WebhookSecrets) == 0 {
		return fmt.Errorf("PAYMENT_WEBHOOK_SECRET must name at least one secret")
	}
	for _, secret := range c.WebhookSecrets {
		if _, err := webhook.ParseSecret(secret); err != nil {
			return fmt.Errorf("PAYMENT_WEBHOOK_SECRET: %w", err)
		}
	}
	return c.Policy().Check()
}

// streamWindows are the settings of the streams the service creates.
func (c Config) streamWindows() messaging.StreamWindows {
	return messaging.StreamWindows{Redelivery: c.MessageRedeliveryWindow, Compensation: c.ManualCompensationWindow,
		Replicas: c.NATSStreamReplicas}
}

// Policy is the retention policy the replay windows imply.
func (c Config) Policy() idempotency.Policy {
	return idempotency.Policy{
		Windows: []idempotency.Window{
			{Name: "client_retry", Duration: c.ClientRetryWindow},
			{Name: "message_redelivery", Duration: c.MessageRedeliveryWindow},
			{Name: "manual_compensation", Duration: c.ManualCompensationWindow},
		},
		Chained:         []string{"client_retry", "message_redelivery"},
		Margin:          c.RetentionMargin,
		MoneyFloor:      c.MoneyRetentionFloor,
		Retention:       c.Retention,
		MoneyOperations: order.MoneyOperations,
		Operations:      order.Operations,
		Webhook:         c.WebhookReplayWindow,
	}
}

func (c Config) slogLevel() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return l, fmt.Errorf("LOG_LEVEL must be debug, info, warn or error, not %q", c.LogLevel)
	}
	return l, nil
}

// oneLine keeps an error's message on one line, as a refused start prints it.
func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }
