package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/orderservice/orderservice/tests/testproc"
)

// tracingResult is scenario 12: what tracing costs. Three processes of
// the service, one per mode (off, a 1 % sampler, every trace), each
// exporting to an OTLP receiver of its own on loopback; closed-loop
// creates at Concurrency, one slice of each mode per round, Rounds rounds,
// so drift of the machine falls on every mode alike.
type tracingResult struct {
	Concurrency int
	Rounds      int
	Slice       time.Duration
	Modes       []tracingMode
}

// tracingMode is one mode's slices and what its receiver got.
type tracingMode struct {
	Name string
	// Env is what turns the mode on, as the report shows it.
	Env    string
	Slices []point
	// Throughput is the median of the slices' creates per second; P50 and
	// P99 the medians of theirs.
	Throughput float64
	P50, P99   time.Duration
	// Spans and Exports are what the receiver was sent, once the process
	// had stopped (and flushed); Requests the creates answered 201.
	Spans, Exports int64
	Requests       int
}

// SpansPerCreate is the spans received per create answered.
func (m tracingMode) SpansPerCreate() float64 {
	if m.Requests == 0 {
		return 0
	}
	return float64(m.Spans) / float64(m.Requests)
}

func (b *bench) tracingCost(ctx context.Context, res *results) (err error) {
	o := b.opts
	tr := &res.Tracing
	tr.Rounds, tr.Slice = o.Rounds, o.Slice
	tr.Concurrency = slices.Max(o.Concurrency)
	best := 0.0
	for _, l := range res.Levels { // scenario 1's best concurrency, when it ran
		if l.Service.Throughput > best {
			best, tr.Concurrency = l.Service.Throughput, l.Concurrency
		}
	}
	bin, err := b.serviceBinary()
	if err != nil {
		return err
	}
	modes := []struct{ name, sampler, arg string }{
		{"off", "", ""},
		{"on, 1 % sampled", "parentbased_traceidratio", "0.01"},
		{"on, every trace", "parentbased_always_on", ""},
	}
	procs := make([]*serviceProcess, len(modes))
	receivers := make([]*testproc.OTLPReceiver, len(modes))
	defer func() {
		for i := range modes {
			if procs[i] != nil {
				err = errors.Join(err, procs[i].Close())
			}
			if receivers[i] != nil {
				_ = receivers[i].Close()
			}
		}
	}()
	for i, m := range modes {
		if receivers[i], err = testproc.StartOTLPReceiver(); err != nil {
			return err
		}
		extra := map[string]string{}
		mode := tracingMode{Name: m.name, Env: "no OTEL_* variable"}
		if m.sampler != "" {
			extra["OTEL_EXPORTER_OTLP_ENDPOINT"] = receivers[i].URL
			extra["OTEL_TRACES_SAMPLER"] = m.sampler
			mode.Env = "OTEL_TRACES_SAMPLER=" + m.sampler
			if m.arg != "" {
				extra["OTEL_TRACES_SAMPLER_ARG"] = m.arg
				mode.Env += ", OTEL_TRACES_SAMPLER_ARG=" + m.arg
			}
		}
		tr.Modes = append(tr.Modes, mode)
		if procs[i], err = startProcess(bin, b.serviceEnv(o.Pool, extra)); err != nil {
			return err
		}
		if o.Warmup > 0 {
			b.fire(ctx, shot{name: "tracing-warmup", client: b.client, workers: tr.Concurrency,
				targeter: freshCreates(procs[i].url+"/v1/orders", &b.keys), duration: o.Warmup})
		}
	}
	for round := range o.Rounds {
		for i := range modes {
			if err := b.reset(ctx); err != nil {
				return err
			}
			p := b.fire(ctx, shot{name: fmt.Sprintf("tracing-%d-r%d", i, round), client: b.client, workers: tr.Concurrency,
				targeter: freshCreates(procs[i].url+"/v1/orders", &b.keys), duration: o.Slice, service: procs[i].pid()})
			tr.Modes[i].Slices = append(tr.Modes[i].Slices, p)
			tr.Modes[i].Requests += p.ok(http.StatusCreated)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	for i := range modes {
		// Stopping the process flushes the spans it still holds.
		err := procs[i].Close()
		procs[i] = nil
		if err != nil {
			return err
		}
		m := &tr.Modes[i]
		exports, spans := receivers[i].Received()
		m.Exports = int64(exports)
		for _, n := range spans {
			m.Spans += int64(n)
		}
		m.Throughput = median(m.Slices, func(p point) float64 { return p.Throughput })
		m.P50 = time.Duration(median(m.Slices, func(p point) float64 { return float64(p.P50) }))
		m.P99 = time.Duration(median(m.Slices, func(p point) float64 { return float64(p.P99) }))
		b.progress("  tracing %s: %s creates, p50 %s p99 %s, %d spans in %d exports", m.Name, perSecond(m.Throughput), ms(m.P50), ms(m.P99), m.Spans, m.Exports)
	}
	off, sampled, all := tr.Modes[0], tr.Modes[1], tr.Modes[2]
	switch {
	case off.Spans != 0:
		res.fail("tracing off: the receiver got %d spans, want none", off.Spans)
	case all.Requests > 0 && all.SpansPerCreate() < 3:
		res.fail("tracing every trace: %d spans for %d creates, want at least the server, use case and database spans of each", all.Spans, all.Requests)
	case sampled.Spans >= all.Spans:
		res.fail("tracing at 1 %%: %d spans, not fewer than at 100 %% (%d)", sampled.Spans, all.Spans)
	}
	return nil
}

// median is the median of f over points (0 for none).
func median(points []point, f func(point) float64) float64 {
	if len(points) == 0 {
		return 0
	}
	v := make([]float64, len(points))
	for i, p := range points {
		v[i] = f(p)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}
