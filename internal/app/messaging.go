package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/idempotency"
	"github.com/orderservice/orderservice/internal/messaging"
	"github.com/orderservice/orderservice/internal/order"
)

// connectNATS starts the embedded NATS server when NATS_URL is empty, and
// connects to whichever server is in use. embedded is nil for an external
// one; without embedded (a command-line tool) it connects to the embedded
// server of the service that runs. A failure names the setting to change.
func connectNATS(cfg Config, embedded bool) (*messaging.Embedded, *nats.Conn, string, error) {
	srv, dial, serverURL, err := natsDialer(cfg, embedded)
	if err != nil {
		return nil, nil, "", err
	}
	nc, err := dial()
	if err != nil {
		if srv != nil {
			srv.Close()
		}
		return nil, nil, "", err
	}
	return srv, nc, serverURL, nil
}

// natsDialer starts the embedded NATS server when NATS_URL is empty (and
// embedded is true), and returns how to connect to whichever server is in
// use: the broker door dials again with it when a connection is closed for
// good. srv is nil for an external server.
func natsDialer(cfg Config, embedded bool) (srv *messaging.Embedded, dial func() (*nats.Conn, error), serverURL string, err error) {
	serverURL = cfg.NATS.URL
	opts := []nats.Option{nats.Name("orderservice"), nats.MaxReconnects(-1), nats.ReconnectWait(500 * time.Millisecond)}
	setting, value := "NATS_URL", redactURL(serverURL)
	check := "check that the broker runs there and lets the service's user in, or leave NATS_URL empty for the embedded server"
	if serverURL == "" {
		setting, value = "NATS_EMBEDDED_ADDR", cfg.NATS.EmbeddedAddr
		if embedded {
			srv, err = messaging.StartEmbedded(cfg.NATS.Embedded(cfg.APIKeys))
			if err != nil {
				return nil, nil, "", embeddedStartError(cfg.NATS, err)
			}
			serverURL = srv.URL()
		} else { // a command-line tool talks to the running service's embedded server
			serverURL = "nats://" + cfg.NATS.EmbeddedAddr
			check = "this command talks to the embedded NATS server of a running service: check that the service runs " +
				"(make run) with the same NATS_EMBEDDED_ADDR, or set NATS_URL to the broker it uses"
		}
		opts = append(opts, nats.UserInfo(messaging.ServiceUser, cfg.NATS.ServicePassword))
	}
	dial = func() (*nats.Conn, error) {
		nc, err := nats.Connect(serverURL, opts...)
		if err != nil {
			return nil, &StartError{Setting: setting, Value: value, Err: fmt.Errorf("connect to NATS: %w", err), Check: check}
		}
		return nc, nil
	}
	return srv, dial, serverURL, nil
}

// embeddedStartError names the setting behind the embedded server's
// failure to start: its address, or its store directory.
func embeddedStartError(c NATSConfig, err error) error {
	if errors.Is(err, messaging.ErrEmbeddedStore) {
		return &StartError{Setting: "NATS_STORE_DIR", Value: c.Embedded(nil).StoreDir, Err: err,
			Check: "check that the directory can be created and written, or set NATS_STORE_DIR to one that can"}
	}
	return &StartError{Setting: "NATS_EMBEDDED_ADDR", Value: c.EmbeddedAddr, Err: err,
		Check: freeAddress("NATS_EMBEDDED_ADDR", " (or NATS_URL to a broker of your own)")}
}

// redactURL is s with its password hidden.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return "(a URL that does not parse)"
}

// brokerPolicy reads the streams the commands replay from (creating them
// when missing) and returns the policy in force: the message redelivery
// window is ORDER_COMMANDS's max_age, whatever the configuration says. It
// refuses, in one line, a retention that would let a record expire while
// the broker can still deliver its command: from ORDER_COMMANDS, or from
// the DLQ by an operator's replay. It warns when ORDER_COMMANDS bounds no
// tenant's share of what it stores (a stream made before the bound, or by
// an operator).
func brokerPolicy(ctx context.Context, cfg Config, js jetstream.JetStream, logger *slog.Logger) (idempotency.Policy, map[string]string, error) {
	streams, err := messaging.EnsureStreams(ctx, js, cfg.streamWindows())
	if err != nil {
		return cfg.Policy(), nil, err
	}
	if streams.CommandsPerSubject == 0 && cfg.NATS.MaxCommandsPerSubject > 0 {
		logger.Warn("stream "+messaging.CommandsStream+" bounds no tenant's share: one tenant's publishing can fill it for all (docs/operations.md#streams)",
			"max_msgs_per_subject", 0, "NATS_MAX_COMMANDS_PER_SUBJECT", cfg.NATS.MaxCommandsPerSubject)
	}
	policy := policyFor(cfg, streams.CommandsMaxAge)
	sources := map[string]string{
		"client_retry":        "REPLAY_WINDOW_CLIENT_RETRY",
		"message_redelivery":  "stream " + messaging.CommandsStream + " max_age",
		"manual_compensation": fmt.Sprintf("REPLAY_WINDOW_MANUAL_COMPENSATION (stream %s max_age %s)", messaging.DLQStream, streams.DLQMaxAge),
	}
	if err := messaging.CheckRetention(policy, messaging.CommandsStream, streams.CommandsMaxAge, order.Operations); err != nil {
		return policy, nil, fmt.Errorf("refusing to start: %w", err)
	}
	if err := messaging.CheckRetention(policy, messaging.DLQStream, streams.DLQMaxAge, order.Operations); err != nil {
		return policy, nil, fmt.Errorf("refusing to start: %w", err)
	}
	if err := policy.Check(); err != nil {
		return policy, nil, fmt.Errorf("refusing to start: %w", err)
	}
	return policy, sources, nil
}

// policyFor is the configured policy with ORDER_COMMANDS's max_age as the
// message redelivery window.
func policyFor(cfg Config, commandsMaxAge time.Duration) idempotency.Policy {
	policy := cfg.Policy()
	for i, w := range policy.Windows {
		if w.Name == "message_redelivery" {
			policy.Windows[i].Duration = commandsMaxAge
		}
	}
	return policy
}

// outboxRetention is how long published events are kept: as long as the
// records of an operation that moves no money, so an event can be sent
// again for as long as any replay source can repeat its intent.
func outboxRetention(p idempotency.Policy) time.Duration { return p.RetentionFor("order.outbox") }
