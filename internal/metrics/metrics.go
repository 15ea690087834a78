// Package metrics holds the service's Prometheus metrics: the five things
// the seed document says to watch (replays, parameter conflicts, stuck
// PROCESSING, record growth, downstream duplicates) plus request latency,
// the message transport's counters and the outbox's lag.
// Every method is safe on a nil *Metrics, which records nothing.
package metrics

import (
	"context"
	"database/sql"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// Metrics is the registry and every collector of the service.
type Metrics struct {
	registry   *prometheus.Registry
	requests   *prometheus.CounterVec
	conflicts  *prometheus.CounterVec
	takeovers  *prometheus.CounterVec
	channel    *prometheus.HistogramVec
	duplicates *prometheus.CounterVec
	http       *prometheus.HistogramVec
	cleaned    *prometheus.CounterVec
	waits      *prometheus.CounterVec
	webhooks   *prometheus.CounterVec
	messages   messages
	tenants    tenants
	logger     *slog.Logger
	shed       prometheus.Counter
}

// New registers every metric. gauges feeds the ones read at scrape time
// (records by state, stuck PROCESSING, table size). Every labelled series
// of operations and moneyOperations starts at zero, so a dashboard or an
// alert sees it before its first event.
func New(gauges GaugeReader, logger *slog.Logger, operations, moneyOperations []string) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		messages: newMessages(),
		tenants:  newTenants(),
		logger:   logger,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderservice_idempotent_requests_total",
			Help: "Idempotent requests by operation and what the idempotency layer did: executed, replayed, key_reused, in_progress, validation_rejected, unavailable, failed.",
		}, []string{"operation", "outcome"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderservice_idempotency_key_conflicts_total",
			Help: "Requests refused with 422 because their key was used with other parameters.",
		}, []string{"operation"}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderservice_idempotency_takeovers_total",
			Help: "Unfinished intents taken over by a new owner, by operation and by whom (retry or sweeper).",
		}, []string{"operation", "by"}),
		channel: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "orderservice_payment_channel_call_duration_seconds",
			Help:    "Calls to the payment channel by kind (charge, refund) and outcome (ok, unavailable, rejected, no_outcome: answered in a status that proves no outcome).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"kind", "outcome"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderservice_payment_channel_duplicates_absorbed_total",
			Help: "Channel answers marked Idempotent-Replayed: duplicates the channel absorbed because we sent a stable key.",
		}, []string{"kind"}),
		http: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "orderservice_http_request_duration_seconds",
			Help:    "HTTP request latency by method, route and status.",
			Buckets: prometheus.DefBuckets,
		}, []string{"method", "route", "status"}),
		cleaned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderservice_idempotency_records_cleaned_total",
			Help: "Expired records removed by the cleanup job; action is deleted or archived (copied to the archive, then deleted).",
		}, []string{"action"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: waitsName,
			Help: "Waits of duplicates for their first attempt's outcome (Prefer: wait), by how each ended: notified, relistened (the LISTEN connection came back), looked (no LISTEN connection: found by polling), not_in_flight (nothing to wait for), gave_up (409).",
		}, []string{"ended"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orderservice_webhooks_received_total",
			Help: "Payment channel webhooks received, by outcome: applied (a pending payment's outcome stored, its order moved), duplicate (a webhook-id delivered before: nothing done), ignored (nothing to move), refused (signature, timestamp or body did not verify: 401).",
		}, []string{"outcome"}),
		shed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "orderservice_http_requests_shed_total",
			Help: "Requests refused with 503 by the admission limit (HTTP_MAX_IN_FLIGHT, HTTP_MAX_QUEUE, HTTP_QUEUE_TIMEOUT) before anything was recorded.",
		}),
	}
	m.registry.MustRegister(m.requests, m.conflicts, m.takeovers, m.channel, m.duplicates, m.http, m.cleaned, m.waits, m.webhooks, m.shed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&recordCollector{gauges: gauges, logger: logger})
	m.registry.MustRegister(m.messages.collectors()...)
	m.registry.MustRegister(m.tenants.collectors()...)
	m.zero(operations, moneyOperations)
	return m
}

// zero creates every series whose label values are known in advance.
func (m *Metrics) zero(operations, moneyOperations []string) {
	for _, op := range operations {
		for _, o := range idempotency.Dispositions {
			m.requests.WithLabelValues(op, string(o))
		}
		m.conflicts.WithLabelValues(op)
	}
	for _, op := range moneyOperations {
		for _, by := range []string{"retry", "sweeper"} {
			m.takeovers.WithLabelValues(op, by)
		}
	}
	for _, kind := range []string{"charge", "refund"} {
		for _, o := range []string{"ok", "unavailable", "rejected", "no_outcome"} {
			m.channel.WithLabelValues(kind, o)
		}
		m.duplicates.WithLabelValues(kind)
	}
	for _, action := range []string{"deleted", "archived"} {
		m.cleaned.WithLabelValues(action)
	}
	for _, w := range idempotency.Wakes {
		m.waits.WithLabelValues(string(w))
	}
	for _, o := range WebhookOutcomes {
		m.webhooks.WithLabelValues(o)
	}
}

// WebhookOutcomes are the outcome labels of orderservice_webhooks_received_total.
var WebhookOutcomes = []string{"applied", "duplicate", "ignored", "refused"}

// Webhook counts one webhook delivery and what came of it.
func (m *Metrics) Webhook(outcome string) {
	if m == nil {
		return
	}
	m.webhooks.WithLabelValues(outcome).Inc()
}

// Handler serves the metrics in the Prometheus text format, or in
// OpenMetrics to a scraper that asks for it.
func (m *Metrics) Handler() http.Handler {
	// OpenMetrics when the scraper asks for it: the format that carries exemplars.
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry, EnableOpenMetrics: true})
}

// Request counts one idempotent request and what the idempotency layer did
// with it (the outcome label).
func (m *Metrics) Request(operation string, outcome idempotency.Disposition) {
	if m == nil || operation == "" {
		return
	}
	m.requests.WithLabelValues(operation, string(outcome)).Inc()
	if outcome == idempotency.DispositionKeyReused {
		m.conflicts.WithLabelValues(operation).Inc()
	}
}

// HTTP observes one request's latency. A request whose trace is sampled
// leaves its trace id as the bucket's exemplar, so a slow bucket on a
// dashboard opens one of the traces that made it slow.
func (m *Metrics) HTTP(ctx context.Context, method, route string, status int, took time.Duration) {
	if m == nil {
		return
	}
	observe(ctx, m.http.WithLabelValues(method, route, strconv.Itoa(status)), took.Seconds())
}

// observe records v, with ctx's sampled trace as its exemplar.
func observe(ctx context.Context, o prometheus.Observer, v float64) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		if e, ok := o.(prometheus.ExemplarObserver); ok {
			e.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	o.Observe(v)
}

// ChannelCall observes one call to the payment channel and how it ended:
// ok, unavailable, rejected, or no_outcome (the channel answered in a
// status that proves no outcome).
func (m *Metrics) ChannelCall(ctx context.Context, kind string, took time.Duration, outcome string, replayed bool) {
	if m == nil {
		return
	}
	observe(ctx, m.channel.WithLabelValues(kind, outcome), took.Seconds())
	if replayed {
		m.duplicates.WithLabelValues(kind).Inc()
	}
}

// Takeover counts an unfinished intent that got a new owner.
func (m *Metrics) Takeover(operation, by string) {
	if m == nil {
		return
	}
	m.takeovers.WithLabelValues(operation, by).Inc()
}

// Waited counts one wait of a duplicate and how it ended.
func (m *Metrics) Waited(how idempotency.Wake) {
	if m == nil {
		return
	}
	m.waits.WithLabelValues(string(how)).Inc()
}

// Cleaned counts records the cleanup job removed.
func (m *Metrics) Cleaned(deleted, archived int) {
	if m == nil {
		return
	}
	m.cleaned.WithLabelValues("deleted").Add(float64(deleted - archived))
	m.cleaned.WithLabelValues("archived").Add(float64(archived))
}

// GaugeReader reads the idempotency table's gauges; idempotency.Store
// offers one (Gauges) whose cost does not grow with the table.
type GaugeReader func(context.Context) (idempotency.Gauges, error)

// recordCollector reads the idempotency table's gauges at scrape time.
type recordCollector struct {
	gauges GaugeReader
	logger *slog.Logger
}

var (
	recordsDesc = prometheus.NewDesc("orderservice_idempotency_records",
		"Idempotency records by state: PROCESSING and FAILED_RETRYABLE exact, SUCCEEDED and FAILED_FINAL estimated from PostgreSQL's statistics.", []string{"state"}, nil)
	stuckDesc = prometheus.NewDesc("orderservice_idempotency_processing_expired",
		"PROCESSING records whose lease has expired: work a dead owner left, waiting for a takeover.", nil, nil)
	retryingDesc = prometheus.NewDesc("orderservice_idempotency_unfinished_retried",
		"Unfinished records (PROCESSING or FAILED_RETRYABLE) attempted 5 times or more: intents that keep failing and need a look.", nil, nil)
	sizeDesc = prometheus.NewDesc("orderservice_idempotency_table_bytes",
		"Total size of the idempotency_records table with its indexes.", nil, nil)
	archiveDesc = prometheus.NewDesc("orderservice_idempotency_archive_records",
		"Records in the archive of money operations, estimated from PostgreSQL's statistics.", nil, nil)
	inboxDesc = prometheus.NewDesc("orderservice_webhook_inbox_records",
		"Webhook deliveries remembered in the inbox (kept for REPLAY_WINDOW_WEBHOOK plus the margin), estimated from PostgreSQL's statistics.", nil, nil)
)

func (c *recordCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- recordsDesc
	ch <- stuckDesc
	ch <- retryingDesc
	ch <- sizeDesc
	ch <- archiveDesc
	ch <- inboxDesc
}

func (c *recordCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	g, err := c.gauges(ctx)
	if err != nil {
		c.logger.Warn("metrics: could not read idempotency gauges", "err", err)
		return
	}
	for _, state := range []idempotency.State{idempotency.Processing, idempotency.Succeeded, idempotency.FailedRetryable, idempotency.FailedFinal} {
		ch <- prometheus.MustNewConstMetric(recordsDesc, prometheus.GaugeValue, float64(g.Records[state]), string(state))
	}
	ch <- prometheus.MustNewConstMetric(stuckDesc, prometheus.GaugeValue, float64(g.ExpiredProcessing))
	ch <- prometheus.MustNewConstMetric(retryingDesc, prometheus.GaugeValue, float64(g.Retried))
	ch <- prometheus.MustNewConstMetric(sizeDesc, prometheus.GaugeValue, float64(g.TableBytes))
	ch <- prometheus.MustNewConstMetric(archiveDesc, prometheus.GaugeValue, float64(g.Archived))
	ch <- prometheus.MustNewConstMetric(inboxDesc, prometheus.GaugeValue, float64(g.Inbox))
}

// WatchDB exports the connection pool of db (go_sql_*{db_name="orderservice"}):
// connections open, in use and idle against DB_MAX_CONNS, and how often and
// how long a request waited for one, which is where a pool that is too
// small shows first.
func (m *Metrics) WatchDB(db *sql.DB) {
	if m == nil {
		return
	}
	m.registry.MustRegister(collectors.NewDBStatsCollector(db, "orderservice"))
}
