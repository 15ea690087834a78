package mockchannel

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/orderservice/orderservice/internal/webhook"
)

// Config is every setting of the standalone channel (cmd/paymentchannel),
// read once from the environment; docs/configuration.md lists them,
// generated from this struct. The order service's embedded channel takes
// its settings from the service's own configuration instead.
type Config struct {
	// Addr is where the channel listens.
	Addr string `env:"HTTP_ADDR" envDefault:":8081"`
	// SlowDelay is how long `pm_slow` charges and refunds take.
	SlowDelay time.Duration `env:"PAYMENT_SLOW_DELAY" envDefault:"2s"`
	// LogLevel is `debug`, `info`, `warn` or `error`.
	LogLevel string `env:"LOG_LEVEL" envDefault:"info"`
	// DatabaseURL is the channel's own database, created if missing.
	DatabaseURL string `env:"CHANNEL_DATABASE_URL" envDefault:"postgres://postgres:postgres@localhost:5432/paymentchannel?sslmode=disable"`
	// AsyncDelay is how long `pm_async_ok`, `pm_async_declined` and
	// `pm_requires_action` charges, and refunds of `pm_refund_pending`
	// charges, wait before they succeed or are declined.
	AsyncDelay time.Duration `env:"PAYMENT_ASYNC_DELAY" envDefault:"2s"`
	// WebhookURL receives the channel's webhooks (the order service's
	// `/webhooks/payment-channel`); empty records the events without
	// delivering them.
	WebhookURL string `env:"CHANNEL_WEBHOOK_URL"`
	// WebhookRetryWindow is how long the channel retries a webhook, with
	// backoff, before it gives up on it.
	WebhookRetryWindow time.Duration `env:"CHANNEL_WEBHOOK_RETRY_WINDOW" envDefault:"72h"`
	// WebhookSecrets sign the webhooks (Standard Webhooks: `whsec_` and
	// base64, comma separated as the order service reads them); the channel
	// signs with the first.
	WebhookSecrets []string `env:"PAYMENT_WEBHOOK_SECRET" envDefault:"whsec_b3JkZXJzZXJ2aWNlLWRldi13ZWJob29rLXNlY3JldCE="`
	// KeyWindow is how long an idempotency key deduplicates: past it a POST
	// with the key makes a new charge, while a lookup by the key still
	// finds the last one. The order service must not trust a longer window
	// (its PAYMENT_CHANNEL_KEY_WINDOW).
	KeyWindow time.Duration `env:"CHANNEL_KEY_WINDOW" envDefault:"24h"`
}

// LoadConfig parses and validates the configuration in environ; an error
// names the variable at fault, in one line.
func LoadConfig(environ map[string]string) (Config, error) {
	var cfg Config
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ}); err != nil {
		return cfg, configError(err)
	}
	return cfg, cfg.validate()
}

func (c Config) validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("HTTP_ADDR %q is not host:port", c.Addr)
	}
	if c.SlowDelay <= 0 {
		return fmt.Errorf("PAYMENT_SLOW_DELAY must be a positive duration such as 2s, not %s", c.SlowDelay)
	}
	if _, ok := logLevels[c.LogLevel]; !ok {
		return fmt.Errorf("LOG_LEVEL must be debug, info, warn or error, not %q", c.LogLevel)
	}
	if u, err := url.Parse(c.DatabaseURL); err != nil || !strings.HasPrefix(u.Scheme, "postgres") {
		return errors.New("CHANNEL_DATABASE_URL must be a postgres:// URL")
	}
	if c.AsyncDelay <= 0 {
		return fmt.Errorf("PAYMENT_ASYNC_DELAY must be a positive duration such as 2s, not %s", c.AsyncDelay)
	}
	if c.WebhookURL != "" {
		if u, err := url.Parse(c.WebhookURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("CHANNEL_WEBHOOK_URL %q must be an http:// or https:// URL", c.WebhookURL)
		}
	}
	if c.WebhookRetryWindow <= 0 {
		return fmt.Errorf("CHANNEL_WEBHOOK_RETRY_WINDOW must be a positive duration such as 72h, not %s", c.WebhookRetryWindow)
	}
	if c.KeyWindow <= 0 {
		return fmt.Errorf("CHANNEL_KEY_WINDOW must be a positive duration such as 24h, not %s", c.KeyWindow)
	}
	if err := webhook.CheckSecrets(c.WebhookSecrets); err != nil {
		return fmt.Errorf("PAYMENT_WEBHOOK_SECRET: %w", err)
	}
	return nil
}

var logLevels = map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}

// Level is LogLevel as a slog level.
func (c Config) Level() slog.Level { return logLevels[c.LogLevel] }

// Options are the channel's options, signing with the first secret.
func (c Config) Options(logger *slog.Logger) Options {
	return Options{SlowDelay: c.SlowDelay, AsyncDelay: c.AsyncDelay, WebhookURL: c.WebhookURL,
		WebhookSecret: c.WebhookSecrets[0], WebhookRetryWindow: c.WebhookRetryWindow, KeyWindow: c.KeyWindow, Logger: logger}
}

// configError rewrites env's errors, which name struct fields, to name the
// variables instead.
func configError(err error) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return errors.New(strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	msgs := make([]string, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			if f, ok := reflect.TypeFor[Config]().FieldByName(pe.Name); ok {
				name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
				msgs = append(msgs, fmt.Sprintf("%s: %v", name, pe.Err))
				continue
			}
		}
		msgs = append(msgs, e.Error())
	}
	return errors.New(strings.ReplaceAll(strings.Join(msgs, "; "), "\n", " "))
}
