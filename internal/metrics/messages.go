package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orderservice/orderservice/internal/order"
)

// messageOps are the op labels of the message metrics, exported at zero
// from the start so a rate() has a series before the first command: the
// verb a command's subject names its operation by, or "unknown" for a
// subject that named none.
var messageOps = append(order.Verbs(), "unknown")

// messages are the collectors of the message transport and the outbox.
type messages struct {
	received, acked, redelivered, deadLettered, givenUp, replayed *prometheus.CounterVec
	postponed                                                     *prometheus.CounterVec
	handedBack                                                    *prometheus.CounterVec
	relayed                                                       *prometheus.CounterVec
	// duration is a command's time from its delivery to its answer, by op.
	duration *prometheus.HistogramVec
	// reopened counts the broker door opened again on a new connection.
	reopened prometheus.Counter
}

func newMessages() messages {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"op"})
	}
	m := messages{
		received:     counter("orderservice_messages_received_total", "Command deliveries received from ORDER_COMMANDS, by op."),
		acked:        counter("orderservice_messages_acked_total", "Commands answered on the results subject and acknowledged, by op."),
		redelivered:  counter("orderservice_messages_redelivered_total", "Command deliveries that JetStream had delivered before (a nak, a lost ack or a dead instance), by op."),
		deadLettered: counter("orderservice_messages_dead_lettered_total", "Commands moved to ORDER_COMMANDS_DLQ: malformed, or still failing after COMMAND_MAX_DELIVER deliveries, by op."),
		givenUp: counter("orderservice_messages_dead_letters_given_up_total",
			"Commands terminated because their dead letter could not be stored in ORDER_COMMANDS_DLQ (the DLQ unreachable through every delivery), by op: kept in ORDER_COMMANDS until its max_age, and logged."),
		replayed: counter("orderservice_messages_replayed_total", "Commands answered with a stored outcome (Idempotent-Replayed), by op."),
		postponed: counter("orderservice_messages_postponed_total",
			"Command deliveries that met their intent in flight (409 request_in_progress) and wait for it, spending no delivery, by op."),
		handedBack: counter("orderservice_messages_handed_back_total",
			"Command deliveries that met their intent in flight and were handed back for a later delivery instead of waiting (their intent had a waiter, or their tenant its share of waiters), spending no delivery, by op."),
		relayed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "orderservice_outbox_relay_publishes_total",
			Help: "Outbox events the relay published; result is published, or duplicate when JetStream already had the event id."}, []string{"result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "orderservice_command_duration_seconds",
			Help:    "Commands answered and acknowledged: time from the delivery's receipt to the acknowledgement, by op.",
			Buckets: prometheus.DefBuckets}, []string{"op"}),
		reopened: prometheus.NewCounter(prometheus.CounterOpts{Name: "orderservice_broker_door_reopened_total",
			Help: "Times the broker door was opened again on a new connection, after the broker closed one for good (a protocol error, credentials refused)."}),
	}
	for _, op := range messageOps {
		for _, c := range []*prometheus.CounterVec{m.received, m.acked, m.redelivered, m.deadLettered, m.givenUp, m.replayed, m.postponed, m.handedBack} {
			c.WithLabelValues(op)
		}
		m.duration.WithLabelValues(op)
	}
	m.relayed.WithLabelValues("published")
	m.relayed.WithLabelValues("duplicate")
	return m
}

func (m messages) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.received, m.acked, m.redelivered, m.deadLettered, m.givenUp, m.replayed, m.postponed, m.handedBack, m.relayed, m.duration, m.reopened}
}

// MessageReceived counts one delivery of a command.
func (m *Metrics) MessageReceived(op string, redelivered bool) {
	if m == nil {
		return
	}
	m.messages.received.WithLabelValues(op).Inc()
	if redelivered {
		m.messages.redelivered.WithLabelValues(op).Inc()
	}
}

// MessageAcked counts one command answered and acknowledged and observes
// its duration, with its trace as the exemplar when it is sampled.
func (m *Metrics) MessageAcked(ctx context.Context, op string, replayed bool, took time.Duration) {
	if m == nil {
		return
	}
	m.messages.acked.WithLabelValues(op).Inc()
	observe(ctx, m.messages.duration.WithLabelValues(op), took.Seconds())
	if replayed {
		m.messages.replayed.WithLabelValues(op).Inc()
	}
}

// MessageDeadLettered counts one command moved to the DLQ.
func (m *Metrics) MessageDeadLettered(op string) {
	if m == nil {
		return
	}
	m.messages.deadLettered.WithLabelValues(op).Inc()
}

// MessageHandedBack counts one command delivery that met its intent in
// flight and was handed back instead of waiting.
func (m *Metrics) MessageHandedBack(op string) {
	if m == nil {
		return
	}
	m.messages.handedBack.WithLabelValues(op).Inc()
}

// MessagePostponed counts one command delivery that waits for its intent
// in flight.
func (m *Metrics) MessagePostponed(op string) {
	if m == nil {
		return
	}
	m.messages.postponed.WithLabelValues(op).Inc()
}

// DeadLetterGivenUp counts one command whose dead letter could not be
// stored, terminated with an error log.
func (m *Metrics) DeadLetterGivenUp(op string) {
	if m == nil {
		return
	}
	m.messages.givenUp.WithLabelValues(op).Inc()
}

// OutboxPublished counts events the relay published.
func (m *Metrics) OutboxPublished(published, duplicates int) {
	if m == nil {
		return
	}
	m.messages.relayed.WithLabelValues("published").Add(float64(published))
	m.messages.relayed.WithLabelValues("duplicate").Add(float64(duplicates))
}

// WatchOutbox exports orderservice_outbox_lag_seconds, read at scrape time
// from lag: the age of the oldest event not yet published. It grows without
// bound when no relay runs, which is what an alert should watch.
func (m *Metrics) WatchOutbox(lag func(context.Context) (time.Duration, error)) {
	if m == nil {
		return
	}
	m.readAtScrape(prometheus.GaugeOpts{
		Name: "orderservice_outbox_lag_seconds",
		Help: "Age of the oldest outbox event not yet published (0 when all are): commit-to-publish lag; a stuck relay makes it grow.",
	}, "the outbox lag", func(ctx context.Context) (float64, error) {
		d, err := lag(ctx)
		return d.Seconds(), err
	})
}

// WatchDLQ exports orderservice_dlq_depth, read at scrape time from depth:
// the dead letters ORDER_COMMANDS_DLQ holds. It is read from the stream,
// not counted by a process, so every instance reports the same number and
// a restart does not reset it; -1 when the broker cannot be asked.
func (m *Metrics) WatchDLQ(depth func(context.Context) (uint64, error)) {
	if m == nil {
		return
	}
	m.readAtScrape(prometheus.GaugeOpts{
		Name: "orderservice_dlq_depth",
		Help: "Dead-lettered commands waiting in ORDER_COMMANDS_DLQ for an operator (read from the stream; -1 when the broker cannot be asked).",
	}, "the DLQ depth", func(ctx context.Context) (float64, error) {
		n, err := depth(ctx)
		return float64(n), err
	})
}

// readAtScrape exports a gauge read by read at each scrape, within 2s:
// -1, and a warning naming what, when it cannot be read.
func (m *Metrics) readAtScrape(opts prometheus.GaugeOpts, what string, read func(context.Context) (float64, error)) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(opts, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		v, err := read(ctx)
		if err != nil {
			m.logger.Warn("metrics: could not read "+what, "err", err)
			return -1
		}
		return v
	}))
}

// BrokerDoorReopened counts the broker door opened again on a new
// connection.
func (m *Metrics) BrokerDoorReopened() {
	if m == nil {
		return
	}
	m.messages.reopened.Inc()
}

// WatchBroker exports orderservice_broker_door_up, read at scrape time from
// ready: 1 while the broker door is open (connected, the command consumer
// and the outbox relay running on the connection), 0 while it is not
// (commands unanswered, events unpublished: /readyz answers 503).
func (m *Metrics) WatchBroker(ready func() error) {
	if m == nil {
		return
	}
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "orderservice_broker_door_up",
		Help: "1 while the broker door is open: connected to NATS, the command consumer and the outbox relay running; 0 while it is not.",
	}, func() float64 {
		if ready() != nil {
			return 0
		}
		return 1
	}))
}
