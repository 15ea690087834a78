// Package app wires the service together: configuration, database,
// payment channel, HTTP server and background workers, with a Main that
// starts and stops them all so end-to-end tests can boot the real thing.
package app

import (
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
)

// Config is every setting of the service, read once from the environment
// and grouped by concern: a group is a struct of its own, whose envPrefix
// (where all of its variables share one) is put before each of its names.
// Each field's comment is its line in docs/configuration.md, which a test
// generates from these structs (go test ./internal/app -run Reference
// -update rewrites it), a group's comment the text of its section; a
// "Default:" line names a default the tag cannot hold.
type Config struct {
	// LogLevel is `debug`, `info`, `warn` or `error`.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// APIKeys are `tenant=key` pairs, comma separated (keys of at least 8
	// characters, distinct; a tenant is letters, digits, `-` and `_`).
	APIKeys map[string]string `env:"API_KEYS" envDefault:"acme=demo-key-acme,globex=demo-key-globex" envKeyValSeparator:"="`
	// ShutdownTimeout bounds the whole shutdown after SIGTERM, background
	// work included (below Docker's default 10s stop grace period).
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"8s"`

	// HTTP is the order API's door: where it listens, how many requests
	// it serves at once, which browsers may call it.
	HTTP HTTPConfig
	// Database is the service's PostgreSQL database and its pool.
	Database DatabaseConfig
	// Payment is how the service calls the payment channel and checks its
	// webhooks.
	Payment PaymentConfig `envPrefix:"PAYMENT_"`
	// Channel is the mock payment channel the service runs in-process when
	// PAYMENT_CHANNEL_URL is empty. It signs with PAYMENT_WEBHOOK_SECRET and
	// remembers a key for PAYMENT_CHANNEL_KEY_WINDOW, the service's own
	// settings (CHANNEL_KEY_WINDOW is the standalone channel's).
	Channel ChannelConfig
	// Recovery is how an intent whose owner stopped working on it is
	// taken over.
	Recovery RecoveryConfig
	// Retention is how long idempotency records are kept: the replay
	// windows they must outlive, the margin on top and the money floor, or
	// an override.
	Retention RetentionConfig
	// Cleanup is the job that removes expired records.
	Cleanup CleanupConfig `envPrefix:"CLEANUP_"`
	// NATS is the message broker: an external server or cluster, or an
	// embedded one.
	NATS NATSConfig `envPrefix:"NATS_"`
	// Commands is how the commands that arrive through NATS are consumed.
	Commands CommandsConfig `envPrefix:"COMMAND_"`
	// Outbox is the relay that publishes the outbox's events to NATS.
	Outbox OutboxConfig `envPrefix:"OUTBOX_"`
}

// HTTPConfig is the order API's door.
type HTTPConfig struct {
	// Addr is the listen address of the order API.
	Addr string `env:"HTTP_ADDR" envDefault:":8080"`
	// CORSAllowedOrigins are the exact origins (`https://shop.example`,
	// comma separated, no wildcard) whose pages may call /v1 from a browser;
	// empty turns CORS off.
	CORSAllowedOrigins []string `env:"CORS_ALLOWED_ORIGINS"`
	// MaxInFlight is how many /v1 requests are served at once, the slots
	// going to tenants in turn by weight (a pay or refund gives its slot
	// back while it waits for the channel, a duplicate while it waits with
	// Prefer: wait); 0 turns admission control off.
	MaxInFlight int `env:"HTTP_MAX_IN_FLIGHT" envDefault:"32"`
	// MaxQueue is the most that may wait for a slot beyond their
	// tenants' fair shares (within its share a tenant always waits its
	// turn; each tenant's queue is FIFO); fewer may when a tenant's slots
	// come free too slowly for its waiters to get one within a tenth of
	// HTTP_QUEUE_TIMEOUT (never fewer than the slots it holds, nor 8).
	// Beyond the bound a request is refused at once.
	MaxQueue int `env:"HTTP_MAX_QUEUE" envDefault:"1024"`
	// QueueTimeout is the longest wait for a slot; when every waiter of a
	// tenant for a fifth of it waited longer than a tenth of it (a standing
	// queue), that tenant's queue holds no more than the slots it holds,
	// its arrivals past that are refused at once, and those already queued
	// are still served (docs/concepts.md §9).
	QueueTimeout time.Duration `env:"HTTP_QUEUE_TIMEOUT" envDefault:"1s"`
	// MaxWait caps Prefer: wait=N, how long a duplicate may wait for its
	// first attempt's outcome.
	MaxWait time.Duration `env:"MAX_WAIT" envDefault:"10s"`
	// ReadHeaderTimeout bounds how long a request's headers may take to
	// arrive; a connection past it is closed.
	ReadHeaderTimeout time.Duration `env:"HTTP_READ_HEADER_TIMEOUT" envDefault:"5s"`
	// BodyTimeout bounds how long a request's body may take to arrive
	// after its headers; it is read before the request takes a slot, and a
	// body past it is answered 408 request_timeout, its connection closed.
	BodyTimeout time.Duration `env:"HTTP_BODY_TIMEOUT" envDefault:"10s"`
	// WriteTimeout bounds a request from its headers to the end of its
	// answer: longer than HTTP_BODY_TIMEOUT, HTTP_QUEUE_TIMEOUT,
	// DB_STATEMENT_TIMEOUT and the longer of MAX_WAIT and
	// PAYMENT_CHANNEL_TIMEOUT together.
	WriteTimeout time.Duration `env:"HTTP_WRITE_TIMEOUT" envDefault:"2m"`
	// IdleTimeout is how long a kept-alive connection may wait for its
	// next request.
	IdleTimeout time.Duration `env:"HTTP_IDLE_TIMEOUT" envDefault:"2m"`
	// TenantRequests is how many requests to /v1 a tenant may send per
	// HTTP_TENANT_WINDOW (a token bucket: that many at once, refilled
	// evenly), more than one instance serves: by default only the
	// service's capacity refuses (503); over it, 429 quota_exceeded.
	TenantRequests int `env:"HTTP_TENANT_REQUESTS" envDefault:"10000"`
	// TenantWindow is HTTP_TENANT_REQUESTS' window, in whole seconds.
	TenantWindow time.Duration `env:"HTTP_TENANT_WINDOW" envDefault:"1s"`
	// TenantConcurrent is the most requests to /v1 a tenant may have in
	// flight at once, queued ones, pays at the channel and duplicates
	// waiting included; 0 sets none (what a tenant holds of the service is
	// its share of HTTP_MAX_IN_FLIGHT either way).
	TenantConcurrent int `env:"HTTP_TENANT_CONCURRENT" envDefault:"0"`
	// TenantLimits are tenants' own weights in the admission's turns
	// (default 1) and quotas:
	// `acme;weight=2;requests=100;window=60s;concurrent=16`, comma
	// separated, each parameter optional (docs/scaling.md).
	TenantLimits TenantLimits `env:"HTTP_TENANT_LIMITS"`
}

// Admission is the API's admission control, nil when HTTP_MAX_IN_FLIGHT
// turns it off.
func (c Config) Admission() *httpapi.Admission {
	return httpapi.NewAdmission(c.HTTP.MaxInFlight, c.HTTP.MaxQueue, c.HTTP.QueueTimeout, c.Weights())
}

// DatabaseConfig is the service's database.
type DatabaseConfig struct {
	// URL is the PostgreSQL URL, one host or several
	// (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`,
	// see docs/scaling.md).
	URL string `env:"DATABASE_URL" envDefault:"postgres://postgres:postgres@localhost:5432/orderservice?sslmode=disable"`
	// MaxConns is the connection pool's size.
	MaxConns int `env:"DB_MAX_CONNS" envDefault:"20"`
	// StatementTimeout is the server-side statement timeout.
	StatementTimeout time.Duration `env:"DB_STATEMENT_TIMEOUT" envDefault:"5s"`
	// LockTimeout is how long a duplicate waits for the first request's
	// transaction before its 409; shorter than DB_STATEMENT_TIMEOUT.
	LockTimeout time.Duration `env:"DB_LOCK_TIMEOUT" envDefault:"3s"`
	// ConnMaxLifetime bounds a pooled connection's life: after a failover
	// the pool is on the new primary within this long even where nothing
	// broke the old connections.
	ConnMaxLifetime time.Duration `env:"DB_CONN_MAX_LIFETIME" envDefault:"2m"`
	// StartTimeout is how long the start waits for a writable primary (a
	// failover, a booting database, PostgreSQL not started yet; the
	// embedded channel's database too) while /healthz answers 200 and
	// /readyz 503; then it gives up, naming the URL's setting.
	StartTimeout time.Duration `env:"DB_START_TIMEOUT" envDefault:"60s"`
}

// Options are the pool's options.
func (c DatabaseConfig) Options() database.Options {
	return database.Options{MaxConns: c.MaxConns, StatementTimeout: c.StatementTimeout,
		LockTimeout: c.LockTimeout, ConnMaxLifetime: c.ConnMaxLifetime}
}

// PaymentConfig is the payment channel as the service calls it; every
// variable begins with PAYMENT_.
type PaymentConfig struct {
	// ChannelURL is the base URL of the payment channel; empty runs
	// the mock channel in-process.
	ChannelURL string `env:"CHANNEL_URL"`
	// ChannelTimeout bounds one call to the payment channel.
	ChannelTimeout time.Duration `env:"CHANNEL_TIMEOUT" envDefault:"10s"`
	// ChannelMaxInFlight bounds the pays and refunds at the payment channel
	// at once, per instance; one beyond it is refused before anything is
	// recorded.
	ChannelMaxInFlight int `env:"CHANNEL_MAX_IN_FLIGHT" envDefault:"64"`
	// RetryAfter is the Retry-After after an unknown channel outcome (whole
	// seconds, at least 1); the sweeper resumes the intent after it. After
	// an answer in a status that proves no outcome (a refund still pending)
	// it doubles with each attempt of the intent, up to 5m.
	RetryAfter time.Duration `env:"RETRY_AFTER" envDefault:"2s"`
	// ChannelKeyWindow is how long the payment channel remembers an
	// idempotency key; a call whose deadline falls past this, counted from
	// the intent's first attempt, asks the channel what it holds before
	// sending the key again. The in-process channel
	// remembers keys this long; a standalone one must remember them at
	// least as long (its CHANNEL_KEY_WINDOW).
	ChannelKeyWindow time.Duration `env:"CHANNEL_KEY_WINDOW" envDefault:"24h"`
	// PendingCheckEvery is how often the sweeper asks the channel about a
	// payment it took on as pending, when no webhook told its outcome.
	PendingCheckEvery time.Duration `env:"PENDING_CHECK_EVERY" envDefault:"30s"`
	// WebhookSecrets verify the payment channel's webhooks (Standard
	// Webhooks: `whsec_` and base64, comma separated: two while one is
	// rotated); the in-process channel signs with the first.
	WebhookSecrets []string `env:"WEBHOOK_SECRET" envDefault:"whsec_b3JkZXJzZXJ2aWNlLWRldi13ZWJob29rLXNlY3JldCE="`
}

// Money is how the order service moves money through the channel.
func (c PaymentConfig) Money() order.MoneyConfig {
	return order.MoneyConfig{ChannelTimeout: c.ChannelTimeout, RetryAfter: c.RetryAfter, ChannelKeyWindow: c.ChannelKeyWindow,
		MaxChannelCalls: c.ChannelMaxInFlight, PendingCheckEvery: c.PendingCheckEvery}
}

// ChannelConfig is the in-process mock payment channel.
type ChannelConfig struct {
	// Addr is where the in-process mock channel listens.
	Addr string `env:"CHANNEL_ADDR" envDefault:"127.0.0.1:8081"`
	// DatabaseURL is the in-process channel's own database (created
	// if missing, migrated at start).
	// Default: DATABASE_URL's server, database `paymentchannel`
	DatabaseURL string `env:"CHANNEL_DATABASE_URL"`
	// SlowDelay is how long the in-process channel takes for `pm_slow`.
	SlowDelay time.Duration `env:"PAYMENT_SLOW_DELAY" envDefault:"2s"`
	// AsyncDelay is how long the in-process channel takes to settle a
	// charge or refund it took on (`pm_async_ok`, `pm_async_declined`,
	// `pm_requires_action`, `pm_refund_pending`).
	AsyncDelay time.Duration `env:"PAYMENT_ASYNC_DELAY" envDefault:"2s"`
	// WebhookRetryWindow is how long the in-process channel retries
	// a webhook delivery, with backoff.
	WebhookRetryWindow time.Duration `env:"CHANNEL_WEBHOOK_RETRY_WINDOW" envDefault:"72h"`
}

// Options are the in-process channel's options: it signs its webhooks to
// webhookURL with the service's first webhook secret, and remembers a key
// exactly as long as the service trusts it to (PAYMENT_CHANNEL_KEY_WINDOW).
func (c ChannelConfig) Options(p PaymentConfig, webhookURL string, logger *slog.Logger) mockchannel.Options {
	return mockchannel.Options{SlowDelay: c.SlowDelay, AsyncDelay: c.AsyncDelay, WebhookRetryWindow: c.WebhookRetryWindow,
		WebhookURL: webhookURL, WebhookSecret: p.WebhookSecrets[0], KeyWindow: p.ChannelKeyWindow, Logger: logger}
}

// RecoveryConfig is the lease on an intent and the sweeper that takes
// over the intents whose lease expired.
type RecoveryConfig struct {
	// Lease is how long an owner may work on an intent before it can be
	// taken over; it must exceed PAYMENT_CHANNEL_TIMEOUT by a second.
	Lease time.Duration `env:"IDEMPOTENCY_LEASE" envDefault:"30s"`
	// SweepInterval is how often the sweeper looks for expired leases and
	// retryable intents.
	SweepInterval time.Duration `env:"SWEEP_INTERVAL" envDefault:"5s"`
	// SweepBatch is the most intents one sweep takes.
	SweepBatch int `env:"SWEEP_BATCH" envDefault:"100"`
}

// RetentionConfig is what the retention policy (Config.Policy) derives
// from.
type RetentionConfig struct {
	// Windows are the replay windows.
	Windows ReplayWindows `envPrefix:"REPLAY_WINDOW_"`
	// Margin is added to the longest window; a negative margin (or
	// window) is refused.
	Margin time.Duration `env:"RETENTION_MARGIN" envDefault:"24h"`
	// MoneyFloor is the least retention of order.pay and
	// order.cancel records (archived when removed).
	MoneyFloor time.Duration `env:"MONEY_RETENTION_FLOOR" envDefault:"2160h"`
	// Override overrides the derived retention; refused if shorter than the
	// longest window plus the margin.
	// Default: derived
	Override time.Duration `env:"IDEMPOTENCY_RETENTION"`
}

// ReplayWindows are how long each source may replay a request; every
// variable begins with REPLAY_WINDOW_.
type ReplayWindows struct {
	// ClientRetry is how long clients may retry a request.
	ClientRetry time.Duration `env:"CLIENT_RETRY" envDefault:"24h"`
	// MessageRedelivery is the max_age of ORDER_COMMANDS (and of the
	// results and events streams) when the service creates it; an existing
	// stream's max_age wins (docs/operations.md).
	MessageRedelivery time.Duration `env:"MESSAGE_REDELIVERY" envDefault:"168h"`
	// ManualCompensation is how long operators may replay by hand;
	// also the DLQ's max_age when the service creates it.
	ManualCompensation time.Duration `env:"MANUAL_COMPENSATION" envDefault:"720h"`
	// Webhook is how long the payment channel may deliver a
	// webhook again (the longest an acquirer is known to retry: 30 days);
	// the webhook inbox remembers a delivery that long plus the margin. A
	// window shorter than CHANNEL_WEBHOOK_RETRY_WINDOW is refused.
	Webhook time.Duration `env:"WEBHOOK" envDefault:"720h"`
}

// CleanupConfig is the cleanup job; every variable begins with CLEANUP_.
type CleanupConfig struct {
	// Interval is the cleanup job's period.
	Interval time.Duration `env:"INTERVAL" envDefault:"1h"`
	// Batch is how many records one cleanup transaction removes:
	// small batches keep each commit's WAL small.
	Batch int `env:"BATCH" envDefault:"500"`
	// Pause is the cleanup's pause between batches.
	Pause time.Duration `env:"PAUSE" envDefault:"5ms"`
}

// NATSConfig is the broker; every variable begins with NATS_.
type NATSConfig struct {
	// URL names the NATS server or cluster
	// (`nats://user:password@host:4222`, comma separated); empty runs an
	// embedded NATS server with JetStream.
	URL string `env:"URL"`
	// EmbeddedAddr is where the embedded NATS server listens (port 0:
	// any free port).
	EmbeddedAddr string `env:"EMBEDDED_ADDR" envDefault:"127.0.0.1:4223"`
	// StoreDir is where the embedded server keeps JetStream's streams;
	// it must survive restarts for a redelivery to survive one.
	// Default: $TMPDIR/orderservice-nats
	StoreDir string `env:"STORE_DIR"`
	// ServicePassword is the embedded server's password for the
	// service's own user `orderservice`, which `orderservice dlq` uses too.
	ServicePassword string `env:"SERVICE_PASSWORD" envDefault:"orderservice-dev-secret"`
	// StreamReplicas is how many copies of each stream the service
	// creates: 3 on a three-node JetStream cluster.
	StreamReplicas int `env:"STREAM_REPLICAS" envDefault:"1"`
	// MaxCommandsPerSubject is each tenant's share of ORDER_COMMANDS when
	// the service creates it: the most commands the stream keeps on one
	// subject (a tenant's one operation) within its max_age, answered ones
	// included. The broker refuses that tenant's publish beyond it
	// (`maximum messages per subject exceeded`), nobody else's; 0: no
	// bound. An existing stream keeps its own (docs/operations.md).
	MaxCommandsPerSubject int64 `env:"MAX_COMMANDS_PER_SUBJECT" envDefault:"1000000"`
}

// Embedded are the embedded server's options, with a NATS user per tenant.
func (c NATSConfig) Embedded(tenants map[string]string) messaging.EmbeddedOptions {
	storeDir := c.StoreDir
	if storeDir == "" {
		storeDir = filepath.Join(os.TempDir(), "orderservice-nats")
	}
	return messaging.EmbeddedOptions{Addr: c.EmbeddedAddr, StoreDir: storeDir, Tenants: tenants, ServicePassword: c.ServicePassword}
}

// CommandsConfig is the command consumer; every variable begins with
// COMMAND_.
type CommandsConfig struct {
	// MaxDeliver is how many deliveries a transiently failing
	// command gets before it is dead-lettered.
	MaxDeliver int `env:"MAX_DELIVER" envDefault:"5"`
	// AckWait is how long JetStream waits for an answer before it
	// redelivers (a running command reports progress).
	AckWait time.Duration `env:"ACK_WAIT" envDefault:"30s"`
	// Backoff is the first delay before a transient failure is
	// redelivered, doubled per delivery.
	Backoff time.Duration `env:"BACKOFF" envDefault:"1s"`
	// BackoffMax caps that delay.
	BackoffMax time.Duration `env:"BACKOFF_MAX" envDefault:"30s"`
	// Workers is how many commands one instance runs (and fetches)
	// at once.
	Workers int `env:"WORKERS" envDefault:"16"`
	// WaitersPerTenant is how many of one tenant's commands may wait, on
	// one instance, for their intent in flight; past it, or for an
	// intent that already has one waiting, a command is handed back for
	// a later delivery, spending none.
	WaitersPerTenant int `env:"WAITERS_PER_TENANT" envDefault:"16"`
}

// OutboxConfig is the outbox relay; every variable begins with OUTBOX_.
type OutboxConfig struct {
	// Interval is the relay's pause when the outbox is empty.
	Interval time.Duration `env:"INTERVAL" envDefault:"100ms"`
	// Batch is how many events the relay publishes per batch.
	Batch int `env:"BATCH" envDefault:"200"`
}

// LoadConfig parses and validates the configuration in environ.
func LoadConfig(environ map[string]string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ}); err != nil {
		return cfg, parseError(environ, err)
	}
	if cfg.Channel.DatabaseURL == "" {
		cfg.Channel.DatabaseURL = withDatabase(cfg.Database.URL, DefaultChannelDatabase)
	}
	return cfg, cfg.validate()
}

// parseError names the variables env could not parse, in one line. env's
// own errors name the struct field, which in a group does not say which
// variable (Cleanup.Batch and Outbox.Batch are both "Batch"): each
// variable set is parsed again on its own to find the ones at fault.
func parseError(environ map[string]string, err error) error {
	params, _ := env.GetFieldParams(&Config{})
	var msgs []string
	for _, p := range params {
		value, set := environ[p.Key]
		if !set {
			continue
		}
		var one Config
		var pe env.ParseError
		if e := env.ParseWithOptions(&one, env.Options{Environment: map[string]string{p.Key: value}}); errors.As(e, &pe) {
			msgs = append(msgs, fmt.Sprintf("%s: %v", p.Key, pe.Err))
		}
	}
	if len(msgs) == 0 { // not a value env could not parse
		return errors.New(oneLine(err))
	}
	return errors.New(strings.ReplaceAll(strings.Join(msgs, "; "), "\n", " "))
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

// streamWindows are the settings of the streams the service creates.
func (c Config) streamWindows() messaging.StreamWindows {
	return messaging.StreamWindows{Redelivery: c.Retention.Windows.MessageRedelivery, Compensation: c.Retention.Windows.ManualCompensation,
		Replicas: c.NATS.StreamReplicas, AckWait: c.Commands.AckWait, CommandsPerSubject: c.NATS.MaxCommandsPerSubject}
}

// Policy is the retention policy the replay windows imply.
func (c Config) Policy() idempotency.Policy {
	return idempotency.Policy{
		Windows: []idempotency.Window{
			{Name: "client_retry", Duration: c.Retention.Windows.ClientRetry},
			{Name: "message_redelivery", Duration: c.Retention.Windows.MessageRedelivery},
			{Name: "manual_compensation", Duration: c.Retention.Windows.ManualCompensation},
		},
		Chained:         []string{"client_retry", "message_redelivery"},
		Margin:          c.Retention.Margin,
		MoneyFloor:      c.Retention.MoneyFloor,
		Retention:       c.Retention.Override,
		MoneyOperations: order.MoneyOperations,
		Operations:      order.Operations,
		Webhook:         c.Retention.Windows.Webhook,
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
