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
	// Replicas is NATS_STREAM_REPLICAS: 3 on a three-node cluster, so a
	// node lost loses no command.
	Replicas int
	// AckWait is COMMAND_ACK_WAIT. A result or dead letter is published
	// again when its handler died before the ack, one ack wait later: the
	// duplicate windows of ORDER_RESULTS and the DLQ cover twice that.
	AckWait time.Duration
	// CommandsPerSubject is NATS_MAX_COMMANDS_PER_SUBJECT: the most
	// commands ORDER_COMMANDS keeps on one subject, one tenant's one
	// operation, within its max_age (0: no bound). See StreamConfigs.
	CommandsPerSubject int64
}

// Streams is what the service found (or created) on the broker.
type Streams struct {
	// CommandsMaxAge is how long ORDER_COMMANDS keeps a command: the
	// message redelivery window, whatever the configuration says.
	CommandsMaxAge time.Duration
	// DLQMaxAge is how long a dead letter can wait to be replayed.
	DLQMaxAge time.Duration
	// CommandsPerSubject is ORDER_COMMANDS's bound on one subject's
	// commands, when a publish over it is refused (discard new per
	// subject); 0 when it bounds no tenant's share.
	CommandsPerSubject int64
}

// StreamConfigs are the streams the service creates when they are missing,
// with the windows w. Each is valid for JetStream as it stands: a
// duplicate window longer than a stream's max_age is refused by the
// server, so it is cut to the max_age.
//
// ORDER_COMMANDS bounds each tenant's share of what it stores: at most
// w.CommandsPerSubject commands on one subject (orders.commands.<tenant>.<op>)
// within its max_age, acknowledged ones included. The server refuses the
// publish that would pass the bound (discard new, per subject: the
// publisher gets "maximum messages per subject exceeded"), on that subject
// only, so one tenant's flood is refused to it and to nobody else. The
// stream as a whole has no bound, which would refuse everyone at once.
func StreamConfigs(w StreamWindows) []jetstream.StreamConfig {
	dedup := func(maxAge time.Duration) time.Duration { return min(max(2*time.Minute, 2*w.AckWait), maxAge) }
	commands := jetstream.StreamConfig{Name: CommandsStream, Subjects: []string{CommandPrefix + ">"}, MaxAge: w.Redelivery,
		Description: "Order commands; max_age is the message redelivery window the idempotency records must outlive."}
	if w.CommandsPerSubject > 0 {
		commands.MaxMsgsPerSubject, commands.Discard, commands.DiscardNewPerSubject = w.CommandsPerSubject, jetstream.DiscardNew, true
	}
	configs := []jetstream.StreamConfig{
		commands,
		{Name: DLQStream, Subjects: []string{DLQPrefix + ">"}, MaxAge: w.Compensation, Duplicates: dedup(w.Compensation),
			Description: "Dead-lettered order commands, body and headers unchanged but the broker's Nats-* ones, until `orderservice dlq replay`."},
		{Name: ResultsStream, Subjects: []string{ResultPrefix + ">"}, MaxAge: w.Redelivery, Duplicates: dedup(w.Redelivery),
			Description: "Outcomes of order commands, as HTTP would have answered them; Nats-Msg-Id names the command."},
		{Name: EventsStream, Subjects: []string{EventPrefix + ">"}, MaxAge: w.Redelivery, Duplicates: dedup(w.Redelivery),
			Description: "Order events from the transactional outbox; Nats-Msg-Id is the event id."},
	}
	for i := range configs {
		configs[i].Storage = jetstream.FileStorage
		configs[i].Replicas = max(1, w.Replicas)
	}
	return configs
}

// Check refuses windows no stream can be made with, before any is made.
func (w StreamWindows) Check() error {
	if w.Redelivery < time.Second || w.Compensation < time.Second {
		return fmt.Errorf("the message redelivery (%s) and manual compensation (%s) windows must each be at least 1s: they are the streams' max_age, and 0 would keep commands forever",
			w.Redelivery, w.Compensation)
	}
	if w.Replicas < 0 || w.Replicas > 5 {
		return fmt.Errorf("NATS_STREAM_REPLICAS must be between 1 and 5, not %d", w.Replicas)
	}
	if w.CommandsPerSubject < 0 {
		return fmt.Errorf("NATS_MAX_COMMANDS_PER_SUBJECT must not be negative (0: no bound), not %d", w.CommandsPerSubject)
	}
	return nil
}

// EnsureStreams creates every stream that is missing and reads the max_age
// of the two that replay commands. A stream that exists is left as its
// operator configured it: its max_age is the truth the retention must
// cover, not the configuration. Nothing is created unless every stream can
// be: the windows are checked first.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, w StreamWindows) (Streams, error) {
	var out Streams
	if err := w.Check(); err != nil {
		return out, err
	}
	for _, cfg := range StreamConfigs(w) {
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
		switch got := s.CachedInfo().Config; cfg.Name {
		case CommandsStream:
			out.CommandsMaxAge = got.MaxAge
			if got.DiscardNewPerSubject {
				out.CommandsPerSubject = got.MaxMsgsPerSubject
			}
		case DLQStream:
			out.DLQMaxAge = got.MaxAge
		}
	}
	return out, nil
}

// Horizon is how long after its first publication a command may still be
// run safely: a record is kept at least p.Shortest() after it was written,
// the record of a command's intent may have been written up to the client
// retry window before the command was published (a client retrying an
// HTTP request by message), and the margin covers clocks and work in
// flight. Past it, the record may be gone, and running the command would
// make it a first attempt. Policy.Check makes sure a command is never past
// it while ORDER_COMMANDS can still redeliver it; a dead letter replayed
// late can be.
func Horizon(p idempotency.Policy) time.Duration {
	return p.Shortest() - p.Margin - p.Window("client_retry")
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
