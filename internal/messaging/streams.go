package messaging

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// StreamWindows are the max_age the service gives streams it creates.
type StreamWindows struct {
	// Redelivery is ORDER_COMMANDS's (and the results' and events') max_age:
	// REPLAY_WINDOW_MESSAGE_REDELIVERY.
	Redelivery time.Duration
	// Compensation is ORDER_COMMANDS_DLQ's max_age:
	// REPLAY_WINDOW_MANUAL_COMPENSATION, how long a dead letter waits for
	// an operator.
	Compensation time.Duration
}

// Streams is what the service found (or created) on the broker.
type Streams struct {
	// CommandsMaxAge is how long ORDER_COMMANDS keeps a command: the
	// message redelivery window, whatever the configuration says.
	CommandsMaxAge time.Duration
	// DLQMaxAge is how long a dead letter can wait to be replayed.
	DLQMaxAge time.Duration
}

// EnsureStreams creates every stream that is missing and reads the max_age
// of the two that replay commands. A stream that exists is left as its
// operator configured it: its max_age is the truth the retention must
// cover, not the configuration.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, w StreamWindows) (Streams, error) {
	configs := []jetstream.StreamConfig{
		{Name: CommandsStream, Subjects: []string{CommandPrefix + ">"}, MaxAge: w.Redelivery,
			Description: "Order commands; max_age is the message redelivery window the idempotency records must outlive."},
		{Name: DLQStream, Subjects: []string{DLQPrefix + ">"}, MaxAge: w.Compensation,
			Description: "Dead-lettered order commands, headers and body unchanged, until `orderservice dlq replay`."},
		{Name: ResultsStream, Subjects: []string{ResultPrefix + ">"}, MaxAge: w.Redelivery,
			Description: "Outcomes of order commands, as HTTP would have answered them."},
		{Name: EventsStream, Subjects: []string{EventPrefix + ">"}, MaxAge: w.Redelivery, Duplicates: 2 * time.Minute,
			Description: "Order events from the transactional outbox; Nats-Msg-Id is the event id."},
	}
	var out Streams
	for _, cfg := range configs {
		cfg.Storage = jetstream.FileStorage
		s, err := js.Stream(ctx, cfg.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			s, err = js.CreateStream(ctx, cfg)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) { // another instance was quicker
				s, err = js.Stream(ctx, cfg.Name)
			}
		}
		if err != nil {
			return out, fmt.Errorf("stream %s: %w", cfg.Name, err)
		}
		switch cfg.Name {
		case CommandsStream:
			out.CommandsMaxAge = s.CachedInfo().Config.MaxAge
		case DLQStream:
			out.DLQMaxAge = s.CachedInfo().Config.MaxAge
		}
	}
	return out, nil
}

// CheckRetention refuses, in one line, a policy under which a record could
// be deleted while stream can still deliver its command (maxAge, plus the
// policy's margin for clocks and in-flight work): that delivery would run
// the intent a second time. A stream without max_age keeps commands
// forever, which no retention covers.
func CheckRetention(p idempotency.Policy, stream string, maxAge time.Duration, ops []string) error {
	if maxAge <= 0 {
		return fmt.Errorf("stream %s keeps messages forever (max_age 0), so no idempotency retention covers its redeliveries: give it a max_age", stream)
	}
	need := maxAge + p.Margin
	for _, op := range ops {
		if r := p.RetentionFor(op); r < need {
			return fmt.Errorf("stream %s keeps messages for %s (max_age) but %s records are kept only %s; they must be kept at least %s (max_age plus the %s margin): lower the stream's max_age or raise IDEMPOTENCY_RETENTION",
				stream, maxAge, op, r, need, p.Margin)
		}
	}
	return nil
}
