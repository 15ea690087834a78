package main

import (
	"fmt"
	"strings"
	"time"
)

// summary writes issue 15's table with this run's figures beside the ones
// measured on main before the work (the "now" column, quoted), and
// for each change the before/after pair this run measured.
func (r *report) summary(res *results) {
	r.p("## Summary")
	r.p("")
	r.p("Issue 15's figures: *before* is quoted from the issue (measured on `main` before this work, the")
	r.p("overload with a separate load process); *now* is this run. Each is a ratio against a baseline of this")
	r.p("run; the sections below state how.")
	r.p("")
	r.p("| figure | before | now | aim | met |")
	r.p("|---|---|---|---|---|")
	var losses, cpu, floorLoss, floorCPU []string
	lossOK, cpuOK := true, true
	for _, l := range res.Levels {
		if l.Concurrency < 4 {
			continue
		}
		m := l.Mixed
		losses = append(losses, fmt.Sprintf("c=%d %.0f %%", l.Concurrency, 100*m.Loss.Median))
		lossOK = lossOK && m.Loss.Median < 0.15
		cpu = append(cpu, fmt.Sprintf("c=%d %.2f×", l.Concurrency, m.CPU.Median))
		cpuOK = cpuOK && m.CPU.Median <= 1.25
		floorLoss = append(floorLoss, fmt.Sprintf("%.0f %%", 100*m.OneTripLoss.Median))
		floorCPU = append(floorCPU, fmt.Sprintf("%.2f×", m.OneTripCPU.Median))
	}
	r.p("| idempotency layer cost: throughput loss vs the same rows without a record (§2, interleaved, median) | 29–40 %% | %s (each create in one round trip, the floor: %s) | < 15 %% | %s |",
		strings.Join(losses, ", "), strings.Join(floorLoss, ", "), yes(lossOK && len(losses) > 0))
	r.p("| PostgreSQL CPU per create, with the layer ÷ without (§2, interleaved, median) | ≈ 1.7× | %s (in one round trip: %s) | ≤ 1.25× | %s |",
		strings.Join(cpu, ", "), strings.Join(floorCPU, ", "), yes(cpuOK && len(cpu) > 0))
	rp := res.Replay.Throughput / max(res.First.Throughput, 1e-9)
	r.p("| replay ÷ first execution, throughput at c=%d (§3) | 1.8–3.1× | %.2f× | ≥ 4× | %s |", res.Opts.ReplayConc, rp, yes(rp >= 4))
	g := res.Growth
	gr := g.Big.Throughput / max(g.Empty.Throughput, 1e-9)
	r.p("| create throughput with %s records and %s orders ÷ empty tables (§7) | not measured | %.2f | ≥ 0.8 | %s |", count(g.Records), count(g.Orders), gr, yes(gr >= 0.8))
	r.p("| `/metrics` scrape with %s records (§7) | `count(*)` per state at every scrape (%s here, once) | %s (%s on empty tables) | < 50 ms, independent of table size | %s |",
		count(g.Records), ms(g.OldGauges), ms(g.ScrapeBig), ms(g.ScrapeEmpty), yes(g.ScrapeBig < 50*time.Millisecond))
	cl := g.Cleanup
	cz := g.CleanupCompressed
	r.p("| cleanup: expired records removed per second while creates run (§7) | not measured | %.0f/s, create p99 %+.0f %% (phase by phase: median %+.0f %%, %d of %d windows with a 503 in phases with the job); the job's sessions with wal_compression=%s: %.0f/s, create p99 %+.0f %% (phase by phase: median %+.0f %%) | ≥ 20 000/s, create p99 up < 25 %% | %s |",
		cl.PerSecond(), 100*cl.P99Up(), 100*(cl.Paired.Median-1), cl.RefusedDuring, cl.RefusedIn,
		cz.WALCompression, cz.PerSecond(), 100*cz.P99Up(), 100*(cz.Paired.Median-1), yes(cl.PerSecond() >= 20000 && cl.P99Up() < 0.25))
	ov := res.Overload
	s := ov.Shed
	total := max(len(s.Point.Samples), 1)
	okOverload := s.AcceptedP99 < 250*time.Millisecond && s.RefusedP99 < 10*time.Millisecond && s.Goodput >= 0.9*ov.Capacity &&
		s.Timeout == 0 && s.Recovered && s.BackToNormal < 5*time.Second && s.NoRetryAfter == 0
	r.p("| 3× overload, %s (§8) | p50 2.4 s, p99 10 s, 3.5 %% client timeouts, no request refused | accepted p50 %s, p99 %s; %.0f %% refused with 503 + Retry-After, p99 %s; goodput %s of capacity; %d client timeouts; back to normal %s after | accepted p99 < 250 ms; the excess refused in < 10 ms with 503 + `Retry-After`; goodput ≥ 90 %% of capacity; 0 client timeouts; back to normal < 5 s after | %s |",
		ov.For, ms(s.AcceptedP50), ms(s.AcceptedP99), 100*float64(s.Refused)/float64(total), ms(s.RefusedP99), percent(s.Goodput, ov.Capacity),
		s.Timeout, recovery(s), yes(okOverload))
	r.p("")

	r.p("What each change bought, as a before/after pair from this run:")
	r.p("")
	r.p("| change | pair (same run) | before | after |")
	r.p("|---|---|---|---|")
	if l, ok := level(res, res.Opts.ReplayConc); ok {
		perCreate := func(n int64, p point) string {
			return fmt.Sprintf("%.0f B", float64(n)/float64(max(p.Requests, 1)))
		}
		r.p("| the record written once, in the transaction that executes the intent (`Store.Record`) | the create over pgx at c=%d, interleaved (§2): claimed first and completed last → one insert | %s below without a record, %s its PostgreSQL CPU; %s of heap and %s of index per create | %s below, %s; %s of heap, %s of index |",
			l.Concurrency, percentOf1(l.Mixed.ClaimLoss.Median), timesOf(l.Mixed.ClaimCPU.Median),
			perCreate(l.ClaimFirstSize.Heap, l.ClaimFirst), perCreate(l.ClaimFirstSize.Indexes, l.ClaimFirst),
			percentOf1(l.Mixed.Loss.Median), timesOf(l.Mixed.CPU.Median),
			perCreate(l.DirectSize.Heap, l.Direct), perCreate(l.DirectSize.Indexes, l.Direct))
	}
	r.p("| a replay answered by one read (`Store.Replay`) | one key replayed over pgx at c=%d: write transaction → one SELECT | %s, %s PostgreSQL CPU each | %s, %s |",
		res.Opts.ReplayConc, perSecond(res.DirectReplayTx.Throughput), micros(pgPerRequest(res.DirectReplayTx)),
		perSecond(res.DirectReplayRead.Throughput), micros(pgPerRequest(res.DirectReplayRead)))
	r.p("| gauges from the sweeper's index and the statistics (`Store.Gauges`) | the gauges with %s records: the old SQL → GET /metrics | %s | %s |",
		count(g.Records), ms(g.OldGauges), ms(g.ScrapeBig))
	cb := g.CleanupBefore
	r.p("| the cleanup job's pause between batches (CLEANUP_PAUSE) | the cleanup while creates run (§7): batch %d, pause %s → batch %d, pause %s | %.0f/s, create p99 %+.0f %% | %.0f/s, create p99 %+.0f %% |",
		cb.Batch, cb.Pause, cl.Batch, cl.Pause, cb.PerSecond(), 100*cb.P99Up(), cl.PerSecond(), 100*cl.P99Up())
	u := ov.Unshed
	r.p("| admission limit (HTTP_MAX_IN_FLIGHT …) | 3× overload: HTTP_MAX_IN_FLIGHT=0 → defaults | accepted p99 %s, %d client timeouts, goodput %s, back to normal %s | accepted p99 %s, %d client timeouts, goodput %s, back to normal %s |",
		ms(u.AcceptedP99), u.Timeout, percent(u.Goodput, ov.Capacity), recovery(u),
		ms(s.AcceptedP99), s.Timeout, percent(s.Goodput, ov.Capacity), recovery(s))
	r.p("")
}

func level(res *results, c int) (createLevel, bool) {
	for _, l := range res.Levels {
		if l.Concurrency == c {
			return l, true
		}
	}
	if n := len(res.Levels); n > 0 {
		return res.Levels[n-1], true
	}
	return createLevel{}, false
}

func recovery(run overloadRun) string {
	if !run.Recovered {
		return "not within " + run.BackToNormal.String()
	}
	return run.BackToNormal.String()
}

func percentOf1(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }

func timesOf(v float64) string { return fmt.Sprintf("%.2f×", v) }

func micros(ns float64) string { return fmt.Sprintf("%.0f µs", ns/1e3) }

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}
