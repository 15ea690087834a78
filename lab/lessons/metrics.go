package lessons

import (
	"bufio"
	"bytes"
	"context"
	"slices"
	"strconv"
	"strings"
)

// metricSnapshot is one scrape of /metrics per service instance: instance
// -> series (name with labels) -> value. Behind a load balancer each scrape
// reaches one replica, so the demo scrapes until an instance answers twice
// and tells them apart by their process start time.
type metricSnapshot map[string]map[string]float64

// instanceSeries identifies the process that answered a scrape.
const instanceSeries = "process_start_time_seconds"

func (s *Session) scrapeMetrics(ctx context.Context) (metricSnapshot, error) {
	snap := metricSnapshot{}
	for range 4 {
		a, err := s.get(ctx, s.cfg.BaseURL+"/metrics", false)
		if err != nil {
			return nil, err
		}
		series := parseMetrics(a.body)
		instance := strconv.FormatFloat(series[instanceSeries], 'f', -1, 64)
		_, seen := snap[instance]
		snap[instance] = series
		if seen {
			break
		}
	}
	return snap, nil
}

// parseMetrics reads the Prometheus text format: one "name{labels} value"
// per line, comments skipped.
func parseMetrics(body []byte) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		// Label values may hold spaces; the value follows the closing brace.
		split := strings.LastIndexByte(line, '}') + 1
		if split == 0 {
			split = strings.IndexByte(line, ' ')
		}
		if split <= 0 {
			continue
		}
		fields := strings.Fields(line[split:])
		if len(fields) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(fields[0], 64); err == nil {
			out[line[:split]] = v
		}
	}
	return out
}

// metricDelta is one series that moved between two snapshots.
type metricDelta struct {
	series        string
	before, after float64
}

// isCounter tells process-local counters (summed over the instances) from
// gauges read from the shared database (the same on every instance).
func isCounter(series string) bool {
	name, _, _ := strings.Cut(series, "{")
	return strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_count")
}

// moved returns the orderservice_* series that changed from before to
// after, over the instances present in both, sorted by name. Histogram
// buckets and sums, and the per-route HTTP latency, are left out as noise.
func moved(before, after metricSnapshot) (deltas []metricDelta, instances int) {
	totals := map[string]*metricDelta{}
	for instance, b := range before {
		a, ok := after[instance]
		if !ok {
			continue
		}
		instances++
		for series, av := range a {
			name, _, _ := strings.Cut(series, "{")
			if !strings.HasPrefix(name, "orderservice_") || strings.HasPrefix(name, "orderservice_http_") ||
				strings.HasSuffix(name, "_bucket") || strings.HasSuffix(name, "_sum") {
				continue
			}
			t := totals[series]
			switch {
			case t == nil:
				totals[series] = &metricDelta{series: series, before: b[series], after: av}
			case isCounter(series):
				t.before += b[series]
				t.after += av
			}
		}
	}
	for _, t := range totals {
		if t.after != t.before {
			deltas = append(deltas, *t)
		}
	}
	slices.SortFunc(deltas, func(x, y metricDelta) int { return strings.Compare(x.series, y.series) })
	return deltas, instances
}

// increase sums the increase of the series named name whose labels include
// every one of labels (each written as `key="value"`).
func increase(deltas []metricDelta, name string, labels ...string) float64 {
	var sum float64
	for _, m := range deltas {
		n, rest, _ := strings.Cut(m.series, "{")
		if n != name {
			continue
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(rest, l)
		}
		if match {
			sum += m.after - m.before
		}
	}
	return sum
}

// signalSeries are the seed's monitoring signals ("watch replays,
// parameter conflicts, PROCESSING timeouts, record growth and downstream
// duplicate rejections"), each as the series /metrics shows it.
var signalSeries = []struct {
	name, series string
	labels       []string
}{
	{"replays", "orderservice_idempotent_requests_total", []string{`outcome="replayed"`}},
	{"key conflicts (422)", "orderservice_idempotency_key_conflicts_total", nil},
	{"in flight (409)", "orderservice_idempotent_requests_total", []string{`outcome="in_progress"`}},
	{"stuck PROCESSING", "orderservice_idempotency_processing_expired", nil},
	// Counted, not read from the table: the records gauge of a finished
	// state is PostgreSQL's estimate, which a lesson's few rows do not move.
	{"intents executed (a record each)", "orderservice_idempotent_requests_total", []string{`outcome="executed"`}},
	{"duplicates absorbed", "orderservice_payment_channel_duplicates_absorbed_total", nil},
}

// signals reads each signal in two snapshots: counters summed over the
// instances both saw, gauges (read from the shared database) from one.
func signals(before, after metricSnapshot) []Signal {
	out := make([]Signal, 0, len(signalSeries))
	for _, sig := range signalSeries {
		out = append(out, Signal{Name: sig.name, Series: sig.series,
			Before: valueOf(before, after, sig.series, sig.labels),
			After:  valueOf(after, before, sig.series, sig.labels)})
	}
	return out
}

// valueOf sums series name (with labels) in snap over the instances that
// other has too; a gauge is the same on every instance, so one counts.
func valueOf(snap, other metricSnapshot, name string, labels []string) float64 {
	var total float64
	for instance, series := range snap {
		if _, ok := other[instance]; !ok {
			continue
		}
		var v float64
		for s, x := range series {
			n, rest, _ := strings.Cut(s, "{")
			if n != name {
				continue
			}
			match := true
			for _, l := range labels {
				match = match && strings.Contains(rest, l)
			}
			if match {
				v += x
			}
		}
		if !isCounter(name) {
			return v
		}
		total += v
	}
	return total
}
