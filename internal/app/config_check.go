package app

import (
	"cmp"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/orderservice/orderservice/internal/database"
	"github.com/orderservice/orderservice/internal/httpapi"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/webhook"
)

// validate refuses, in one line naming the setting to change, a
// configuration the service cannot run with. Each group of settings has
// its check; a group's check tests each of its settings alone, then what
// must hold between them and the settings of the groups checked before it.
func (c Config) validate() error {
	for _, check := range []func() error{
		c.checkProcess,   // LOG_LEVEL, SHUTDOWN_TIMEOUT
		c.checkDatabase,  // DATABASE_URL, CHANNEL_DATABASE_URL, DB_*
		c.checkTenants,   // API_KEYS
		c.checkPayment,   // PAYMENT_*, CHANNEL_WEBHOOK_RETRY_WINDOW
		c.checkRecovery,  // IDEMPOTENCY_LEASE, SWEEP_*
		c.checkCleanup,   // CLEANUP_*
		c.checkBroker,    // NATS_*, COMMAND_*, OUTBOX_*
		c.checkHTTP,      // HTTP_*, MAX_WAIT, CORS_ALLOWED_ORIGINS
		c.checkRetention, // REPLAY_WINDOW_*, RETENTION_MARGIN, MONEY_RETENTION_FLOOR, IDEMPOTENCY_RETENTION
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// duration is a duration setting: its variable and its value.
type duration struct {
	name  string
	value time.Duration
}

// positive refuses the first of durations that is not positive.
func positive(durations ...duration) error {
	for _, d := range durations {
		if d.value <= 0 {
			return fmt.Errorf("%s must be a positive duration", d.name)
		}
	}
	return nil
}

// postgresURL refuses a database setting that is not a postgres:// URL.
// pgx's parser, not url.Parse: it knows libpq's multi-host form
// (postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write).
func postgresURL(name, dsn string) error {
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return fmt.Errorf("%s must be a postgres:// URL", name)
	}
	if err := database.CheckURL(dsn); err != nil {
		return fmt.Errorf("%s is not a valid postgres:// URL (one or more host:port, comma separated): %s", name, oneLine(err))
	}
	return nil
}

// atLeastOne refuses a count setting below 1.
func atLeastOne(name string, n int) error {
	if n < 1 {
		return fmt.Errorf("%s must be at least 1", name)
	}
	return nil
}

func (c Config) checkProcess() error {
	if _, err := c.slogLevel(); err != nil {
		return err
	}
	return positive(duration{"SHUTDOWN_TIMEOUT", c.ShutdownTimeout})
}

func (c Config) checkDatabase() error {
	d := c.Database
	if err := postgresURL("DATABASE_URL", d.URL); err != nil {
		return err
	}
	if err := postgresURL("CHANNEL_DATABASE_URL", c.Channel.DatabaseURL); err != nil {
		return err
	}
	if err := positive(duration{"DB_STATEMENT_TIMEOUT", d.StatementTimeout}, duration{"DB_LOCK_TIMEOUT", d.LockTimeout},
		duration{"DB_CONN_MAX_LIFETIME", d.ConnMaxLifetime}, duration{"DB_START_TIMEOUT", d.StartTimeout}); err != nil {
		return err
	}
	if err := atLeastOne("DB_MAX_CONNS", d.MaxConns); err != nil {
		return err
	}
	// A duplicate waiting on the first request's lock must give up (409)
	// before its statement is cancelled (which would read as an outage, 503).
	if d.LockTimeout >= d.StatementTimeout {
		return fmt.Errorf("DB_LOCK_TIMEOUT (%s) must be shorter than DB_STATEMENT_TIMEOUT (%s)", d.LockTimeout, d.StatementTimeout)
	}
	return nil
}

// checkTenants refuses API_KEYS without a tenant, a key shorter than 8
// characters or shared by two tenants, and a tenant name that cannot be a
// subject token.
func (c Config) checkTenants() error {
	if len(c.APIKeys) == 0 {
		return fmt.Errorf("API_KEYS must name at least one tenant=key pair")
	}
	seen := map[string]string{}
	for _, tenant := range c.tenantNames() {
		key := c.APIKeys[tenant]
		if tenant == "" || len(key) < 8 {
			return fmt.Errorf("API_KEYS: tenant %q needs a name and a key of at least 8 characters", tenant)
		}
		if other, dup := seen[key]; dup {
			return fmt.Errorf("API_KEYS: tenants %q and %q share a key", other, tenant)
		}
		seen[key] = tenant
		if err := messaging.CheckTenant(tenant); err != nil {
			return fmt.Errorf("API_KEYS: %w", err)
		}
	}
	return nil
}

func (c Config) checkPayment() error {
	p, ch := c.Payment, c.Channel
	if p.ChannelURL != "" {
		if u, err := url.Parse(p.ChannelURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("PAYMENT_CHANNEL_URL must be an http(s) URL")
		}
	}
	if err := positive(duration{"PAYMENT_CHANNEL_TIMEOUT", p.ChannelTimeout}, duration{"PAYMENT_RETRY_AFTER", p.RetryAfter},
		duration{"PAYMENT_CHANNEL_KEY_WINDOW", p.ChannelKeyWindow}, duration{"PAYMENT_PENDING_CHECK_EVERY", p.PendingCheckEvery},
		duration{"PAYMENT_ASYNC_DELAY", ch.AsyncDelay}, duration{"CHANNEL_WEBHOOK_RETRY_WINDOW", ch.WebhookRetryWindow}); err != nil {
		return err
	}
	if err := atLeastOne("PAYMENT_CHANNEL_MAX_IN_FLIGHT", p.ChannelMaxInFlight); err != nil {
		return err
	}
	if err := webhook.CheckSecrets(p.WebhookSecrets); err != nil {
		return fmt.Errorf("PAYMENT_WEBHOOK_SECRET: %w", err)
	}
	return nil
}

func (c Config) checkRecovery() error {
	r := c.Recovery
	if err := positive(duration{"IDEMPOTENCY_LEASE", r.Lease}, duration{"SWEEP_INTERVAL", r.SweepInterval}); err != nil {
		return err
	}
	if err := atLeastOne("SWEEP_BATCH", r.SweepBatch); err != nil {
		return err
	}
	// An owner must be able to finish a channel call within its lease, or
	// a takeover would race a call that is still running.
	if r.Lease < c.Payment.ChannelTimeout+time.Second {
		return fmt.Errorf("IDEMPOTENCY_LEASE (%s) must exceed PAYMENT_CHANNEL_TIMEOUT (%s) by at least 1s", r.Lease, c.Payment.ChannelTimeout)
	}
	return nil
}

func (c Config) checkCleanup() error {
	if err := positive(duration{"CLEANUP_INTERVAL", c.Cleanup.Interval}); err != nil {
		return err
	}
	if err := atLeastOne("CLEANUP_BATCH", c.Cleanup.Batch); err != nil {
		return err
	}
	if c.Cleanup.Pause < 0 {
		return fmt.Errorf("CLEANUP_PAUSE must not be negative")
	}
	return nil
}

// checkBroker checks the broker's address, the streams the service makes
// on it, and how commands are consumed and events relayed.
func (c Config) checkBroker() error {
	cmds := c.Commands
	if err := positive(duration{"COMMAND_ACK_WAIT", cmds.AckWait}, duration{"COMMAND_BACKOFF", cmds.Backoff},
		duration{"COMMAND_BACKOFF_MAX", cmds.BackoffMax}, duration{"OUTBOX_INTERVAL", c.Outbox.Interval}); err != nil {
		return err
	}
	if err := cmp.Or(atLeastOne("COMMAND_MAX_DELIVER", cmds.MaxDeliver), atLeastOne("COMMAND_WORKERS", cmds.Workers),
		atLeastOne("COMMAND_WAITERS_PER_TENANT", cmds.WaitersPerTenant), atLeastOne("OUTBOX_BATCH", c.Outbox.Batch)); err != nil {
		return err
	}
	if cmds.BackoffMax < cmds.Backoff {
		return fmt.Errorf("COMMAND_BACKOFF_MAX (%s) must not be shorter than COMMAND_BACKOFF (%s)", cmds.BackoffMax, cmds.Backoff)
	}
	if cmds.AckWait < time.Second {
		return fmt.Errorf("COMMAND_ACK_WAIT must be at least 1s")
	}
	if c.NATS.URL != "" {
		for server := range strings.SplitSeq(c.NATS.URL, ",") {
			if u, err := url.Parse(server); err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" {
				return fmt.Errorf("NATS_URL must be nats:// or tls:// URLs, comma-separated (or empty for the embedded server)")
			}
		}
	}
	return c.streamWindows().Check()
}

// checkHTTP checks the order API's door: its waits, admission, browsers,
// the bounds on each phase of a request, and the tenants' limits.
func (c Config) checkHTTP() error {
	h := c.HTTP
	if h.MaxWait < 0 || h.MaxWait >= c.ShutdownTimeout+time.Minute {
		return fmt.Errorf("MAX_WAIT must be between 0 and a minute beyond SHUTDOWN_TIMEOUT, not %s", h.MaxWait)
	}
	for _, o := range h.CORSAllowedOrigins {
		if err := httpapi.CheckOrigin(o); err != nil {
			return fmt.Errorf("CORS_ALLOWED_ORIGINS: %w", err)
		}
	}
	if h.MaxInFlight < 0 || h.MaxQueue < 0 || h.QueueTimeout <= 0 {
		return fmt.Errorf("HTTP_MAX_IN_FLIGHT and HTTP_MAX_QUEUE must not be negative, HTTP_QUEUE_TIMEOUT must be positive")
	}
	if err := c.checkServerTimeouts(); err != nil {
		return err
	}
	return c.checkTenantLimits()
}

// checkRetention refuses replay windows, a margin or an override that
// would let a record expire while a source can still repeat its intent.
func (c Config) checkRetention() error {
	// The inbox must remember a delivery for as long as the channel may
	// send it again, or a late redelivery would be applied as a first one.
	if c.Retention.Windows.Webhook < c.Channel.WebhookRetryWindow {
		return fmt.Errorf("REPLAY_WINDOW_WEBHOOK (%s) is unsafe: the payment channel retries a webhook for CHANNEL_WEBHOOK_RETRY_WINDOW (%s), so its deliveries must be remembered at least that long",
			c.Retention.Windows.Webhook, c.Channel.WebhookRetryWindow)
	}
	return c.Policy().Check()
}
