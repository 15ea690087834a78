// Package app wires the service together: configuration, database,
// payment channel, HTTP server and background workers, with a Main that
// starts and stops them all so end-to-end tests can boot the real thing.
package app

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/order"
)

// Config is every setting of the service, read once from the environment.
// The README's configuration table lists the same variables.
type Config struct {
	DatabaseURL       string            `env:"DATABASE_URL" envDefault:"postgres://postgres:postgres@localhost:5432/orderservice?sslmode=disable"`
	HTTPAddr          string            `env:"HTTP_ADDR" envDefault:":8080"`
	APIKeys           map[string]string `env:"API_KEYS" envDefault:"acme=demo-key-acme,globex=demo-key-globex" envKeyValSeparator:"="`
	PaymentChannelURL string            `env:"PAYMENT_CHANNEL_URL"`
	ChannelAddr       string            `env:"CHANNEL_ADDR" envDefault:"127.0.0.1:8081"`
	LogLevel          string            `env:"LOG_LEVEL" envDefault:"info"`

	DBMaxConns         int           `env:"DB_MAX_CONNS" envDefault:"20"`
	DBStatementTimeout time.Duration `env:"DB_STATEMENT_TIMEOUT" envDefault:"5s"`
	DBLockTimeout      time.Duration `env:"DB_LOCK_TIMEOUT" envDefault:"3s"`

	// Admission control (load shedding) on /v1; HTTPMaxInFlight 0 turns it off.
	HTTPMaxInFlight  int           `env:"HTTP_MAX_IN_FLIGHT" envDefault:"64"`
	HTTPMaxQueue     int           `env:"HTTP_MAX_QUEUE" envDefault:"1024"`
	HTTPQueueTimeout time.Duration `env:"HTTP_QUEUE_TIMEOUT" envDefault:"100ms"`

	Lease          time.Duration `env:"IDEMPOTENCY_LEASE" envDefault:"30s"`
	ChannelTimeout time.Duration `env:"PAYMENT_CHANNEL_TIMEOUT" envDefault:"10s"`
	RetryAfter     time.Duration `env:"PAYMENT_RETRY_AFTER" envDefault:"2s"`
	SweepInterval  time.Duration `env:"SWEEP_INTERVAL" envDefault:"5s"`
	SweepBatch     int           `env:"SWEEP_BATCH" envDefault:"100"`
	// ChannelSlowDelay is how long the embedded mock channel takes for pm_slow.
	ChannelSlowDelay time.Duration `env:"PAYMENT_SLOW_DELAY" envDefault:"2s"`

	ClientRetryWindow        time.Duration `env:"REPLAY_WINDOW_CLIENT_RETRY" envDefault:"24h"`
	MessageRedeliveryWindow  time.Duration `env:"REPLAY_WINDOW_MESSAGE_REDELIVERY" envDefault:"168h"`
	ManualCompensationWindow time.Duration `env:"REPLAY_WINDOW_MANUAL_COMPENSATION" envDefault:"720h"`
	RetentionMargin          time.Duration `env:"RETENTION_MARGIN" envDefault:"24h"`
	MoneyRetentionFloor      time.Duration `env:"MONEY_RETENTION_FLOOR" envDefault:"2160h"`
	Retention                time.Duration `env:"IDEMPOTENCY_RETENTION"`

	CleanupInterval time.Duration `env:"CLEANUP_INTERVAL" envDefault:"1h"`
	CleanupBatch    int           `env:"CLEANUP_BATCH" envDefault:"2000"`
	CleanupPause    time.Duration `env:"CLEANUP_PAUSE" envDefault:"20ms"`

	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"8s"`
}

// LoadConfig parses and validates the configuration in environ.
func LoadConfig(environ map[string]string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ}); err != nil {
		return cfg, errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	return cfg, cfg.validate()
}

func (c Config) validate() error {
	if _, err := url.Parse(c.DatabaseURL); err != nil || !strings.HasPrefix(c.DatabaseURL, "postgres") {
		return fmt.Errorf("DATABASE_URL must be a postgres:// URL")
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
		"IDEMPOTENCY_LEASE": c.Lease, "PAYMENT_CHANNEL_TIMEOUT": c.ChannelTimeout, "PAYMENT_RETRY_AFTER": c.RetryAfter,
		"SWEEP_INTERVAL": c.SweepInterval, "SHUTDOWN_TIMEOUT": c.ShutdownTimeout, "CLEANUP_INTERVAL": c.CleanupInterval,
	} {
		if d <= 0 {
			return fmt.Errorf("%s must be a positive duration", name)
		}
	}
	if c.DBMaxConns < 1 || c.SweepBatch < 1 || c.CleanupBatch < 1 {
		return fmt.Errorf("DB_MAX_CONNS, SWEEP_BATCH and CLEANUP_BATCH must be at least 1")
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
	return c.Policy().Check()
}

// Policy is the retention policy the replay windows imply.
func (c Config) Policy() idempotency.Policy {
	return idempotency.Policy{
		Windows: []idempotency.Window{
			{Name: "client_retry", Duration: c.ClientRetryWindow},
			{Name: "message_redelivery", Duration: c.MessageRedeliveryWindow},
			{Name: "manual_compensation", Duration: c.ManualCompensationWindow},
		},
		Margin:          c.RetentionMargin,
		MoneyFloor:      c.MoneyRetentionFloor,
		Retention:       c.Retention,
		MoneyOperations: order.MoneyOperations,
		Operations:      order.Operations,
	}
}

func (c Config) slogLevel() (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return l, fmt.Errorf("LOG_LEVEL must be debug, info, warn or error, not %q", c.LogLevel)
	}
	return l, nil
}
