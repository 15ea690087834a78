package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/idempotency"
)

// The report's template renders the sample runs, one with every optional
// part and one that leaves them out, without a missing field, and every
// heading and table header it holds appears in the full one.
func TestTheReportRendersEveryHeadingAndTable(t *testing.T) {
	partial, err := render(sampleRun(false), "")
	if err != nil {
		t.Fatalf("a partial run: %v", err)
	}
	if n := strings.Count(partial, "Not run (`-only`)."); n != 2 {
		t.Errorf("a run of all scenarios but 4 and 6 says %d times that one was not run, want 2:\n%s", n, partial)
	}
	report, err := render(sampleRun(true), "throughput.svg")
	if err != nil {
		t.Fatalf("a full run: %v", err)
	}
	lines := strings.Split(reportText, "\n")
	for i, line := range lines {
		heading := strings.HasPrefix(templateActions.ReplaceAllString(line, ""), "#")
		tableHeader := i+1 < len(lines) && strings.HasPrefix(templateActions.ReplaceAllString(lines[i+1], ""), "|-")
		if (heading || tableHeader) && !renderedFrom(line).MatchString(report) {
			t.Errorf("the report has no line rendered from %q:\n%s", line, report)
		}
	}
	for _, heading := range scenarioHeadings {
		if !strings.Contains(report, "\n"+heading+"\n") {
			t.Errorf("the report has no heading %q", heading)
		}
	}
}

var templateActions = regexp.MustCompile(`\{\{.*?\}\}`)

// renderedFrom matches a line of the report that a line of the template
// renders to: its text as it is, each action anything.
func renderedFrom(templateLine string) *regexp.Regexp {
	parts := templateActions.Split(templateLine, -1)
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`(?m)^` + strings.Join(parts, `.*`) + `$`)
}

// sampleRun is a run's results filled in by hand. full sets every optional
// part of the report (failed assertions, creates not answered 201, other
// overload settings, refusals without Retry-After, …); otherwise it is a
// quick run of every scenario but 4 and 6 that takes the other side of the
// template's conditions, each of which reaches fields only when it holds.
func sampleRun(full bool) *results {
	ms := time.Millisecond
	ok := func(n int) map[string]int { return map[string]int{"201": n} }
	o := options{Duration: 10 * time.Second, Warmup: 2 * time.Second, Concurrency: []int{1, 4, 16, 64}, Rounds: 7, Slice: 1500 * ms, Pool: 20,
		ReplayConc: 16, Storm: 1000, PayConc: 64, PayPool: 10, PayLatency: 50 * ms, Rate: 100, RateDuration: 10 * time.Second, Commands: 10000,
		WaitDuplicates: 1000, Webhooks: 2000, WebhookConc: 16, OverloadFor: 20 * time.Second, OverloadLimits: []int{16, 64}, OverloadPools: []int{8}}
	if !full {
		o.Quick = true
		o.Only = map[int]bool{2: true, 3: true, 5: true, 7: true, 8: true, 9: true, 10: true, 11: true, 12: true, 13: true, 14: true}
	}
	res := &results{Opts: o, Machine: machine{CPUs: 2, CPUModel: "AMD EPYC", GoVersion: "go1.26.8", PGVersion: "PostgreSQL 15", PGSettings: "fsync=on",
		Date: time.Date(2026, 12, 2, 8, 54, 0, 0, time.UTC), Command: "`make bench`", LoadBefore: "0.53", LoadAfter: "7.23"}, Took: 19*time.Minute + 20*time.Second}
	if full {
		res.Problems = []string{"storm: 2 orders", "pay: 3 charges"}
	}
	sp := func(m, lo, hi float64) spread { return spread{Median: m, Min: lo, Max: hi} }
	for i, c := range o.Concurrency {
		f := float64(i + 1)
		l := createLevel{Concurrency: c,
			Service:    samplePoint(300*f, 2*ms, 6*ms, uint64(3000*f), ok(int(3000*f))),
			Direct:     samplePoint(600*f, 1*ms, 4*ms, uint64(6000*f), ok(int(6000*f))),
			Plain:      samplePoint(800*f, 1*ms, 3*ms, uint64(8000*f), ok(int(8000*f))),
			ClaimFirst: samplePoint(500*f, 1*ms, 5*ms, uint64(5000*f), ok(int(5000*f))),
			DirectSize: tableSize{Heap: 4_000_000 * int64(f), Indexes: 500_000}, ClaimFirstSize: tableSize{Heap: 3_800_000 * int64(f), Indexes: 480_000},
			Mixed: interleaved{Loss: sp(0.2, 0.1, 0.3), CPU: sp(1.3, 1.2, 1.4), ClaimLoss: sp(0.34, 0.15, 0.38), ClaimCPU: sp(1.62, 1.3, 1.7),
				OneTripLoss: sp(0.09, 0.04, 0.12), OneTripCPU: sp(1.15, 1.06, 1.22), WALWith: sp(4486, 4442, 4748), WALWithout: sp(3582, 3546, 3601), WAL: sp(1.25, 1.24, 1.32)}}
		if full && c == 64 {
			l.Service.Statuses = map[string]int{"201": 8697, "503": 25411}
			l.Service.CPU.OK = false
		}
		res.Levels = append(res.Levels, l)
	}
	res.First = samplePoint(922, 15*ms, 53*ms, 9220, ok(9220))
	res.Replay = samplePoint(7932, 1460*time.Microsecond, 6*ms, 79333, ok(79333))
	res.DirectReplayRead = samplePoint(17127, 120*time.Microsecond, 2900*time.Microsecond, 171270, ok(171270))
	res.DirectReplayTx = samplePoint(5895, 1360*time.Microsecond, 8860*time.Microsecond, 58950, ok(58950))
	res.Storm = stormResult{Copies: 1000, Point: samplePoint(0, 185*ms, 204*ms, 1000, map[string]int{"201": 601, "503": 399}), Orders: 1, Succeeded: 1,
		WarmupDrain: 285 * ms, WarmupAnswers: "201 ×32, 503 ×968"}
	if !full {
		res.Storm.Orders = 2
	}
	res.Pay = payResult{Concurrency: 64, Pool: 10, Latency: 50 * ms, MaxInFlight: 32, Point: samplePoint(190, 254*ms, 757*ms, 2550, map[string]int{"200": 1940, "503": 610}),
		Charges: 1940, Paid: 1940, Prepared: 16960}
	if !full {
		res.Pay.MaxInFlight = 0
		res.Pay.Point.CPU.Other = 4 * time.Second
	}
	res.Steady = samplePoint(100, 3430*time.Microsecond, 10*ms, 1000, ok(1000))
	cleanup := func(name string, batch int, pause time.Duration, wal string) cleanupRun {
		return cleanupRun{Name: name, Batch: batch, Pause: pause, WALCompression: wal, WAL: 140 << 20, Cleaned: idempotency.CleanupResult{Deleted: 131000, Archived: 32750},
			Took: 10 * time.Second, Quiet: samplePoint(296, 3*ms, 123*ms, 2961, ok(2961)), During: samplePoint(296, 4*ms, 53*ms, 2961, ok(2961)),
			RefusedIn: 3, RefusedDuring: 1, Paired: sp(1.11, 0.15, 4.02), Checkpoints: 1, CheckpointSync: 3 * ms, WALWaitRefused: 0.5, WALWaitOther: 0.35}
	}
	res.Growth = growthResult{Records: 10_000_000, Orders: 2_000_000, Expired: 1_000_000, Generated: 5*time.Minute + 33*time.Second, TableBytes: 7389 << 20,
		Empty: samplePoint(752, 17*ms, 67*ms, 7520, ok(7520)), Big: samplePoint(594, 23*ms, 77*ms, 5940, ok(5940)),
		ScrapeEmpty: 4970 * time.Microsecond, ScrapeBig: 4360 * time.Microsecond, OldGauges: 11086 * ms, Scrapes: 9, CleanupRate: 296, Phase: time.Second, Phases: 20,
		CleanupBefore: cleanup("before", 500, 15*ms, ""), Cleanup: cleanup("the service's", 500, 5*ms, ""),
		CleanupCompressed: cleanup("the service's, wal_compression=lz4", 500, 5*ms, "lz4")}
	if !full {
		res.Growth.Cleanup.RefusedIn = 0
	}
	run := func(setting string, accepted, refused, timeouts, other int) overloadRun {
		return overloadRun{Setting: setting, Point: samplePoint(0, 0, 0, uint64(accepted+refused+timeouts+other), map[string]int{"201": accepted, "503": refused, "0": timeouts, "500": other}),
			Accepted: accepted, Refused: refused, Timeout: timeouts, Other: other, AcceptedP50: 49 * ms, AcceptedP99: 143 * ms, RefusedP50: 5 * ms, RefusedP99: 39 * ms,
			RefusedMax: 118 * ms, Goodput: 630, Capacity: 701, Capacities: []float64{688, 725, 690, 699, 703}, Rounds: 4, Slice: 5 * time.Second, BackToNormal: 250 * ms, Recovered: true, Healthz: samplePoint(50, 5*ms, 32*ms, 1000, map[string]int{"200": 1000})}
	}
	res.Overload = overloadResult{Capacity: 725, CapacityAt: 4, InProcess: 881, Factor: 3, Rate: 2175, For: 20 * time.Second, Rounds: 4, NormalRate: 362,
		Normal: samplePoint(362, 50*ms, 156*ms, 3620, ok(3620)), Shed: run("admission limit (defaults)", 12698, 30802, 0, 0),
		Unshed:        run("no admission control", 3641, 0, 34385, 3),
		ClientTimeout: 10 * time.Second, Limits: "HTTP_MAX_IN_FLIGHT=32, HTTP_MAX_QUEUE=1024, HTTP_QUEUE_TIMEOUT=100ms"}
	res.Overload.Unshed.Recovered = false
	res.Overload.Unshed.Healthz.Statuses = map[string]int{"200": 990, "0": 10}
	if full {
		for _, l := range []struct{ name, value string }{{"HTTP_MAX_IN_FLIGHT", "16"}, {"DB_MAX_CONNS", "8"}} {
			lr := run(l.name+"="+l.value, 13911, 29590, 0, 0)
			lr.NoRetryAfter = 2
			res.Overload.Limited = append(res.Overload.Limited, lr)
		}
	} else {
		res.Overload.InProcess = 0
	}
	res.Messages = messageResult{Workers: 16, Commands: 10000, HTTP: samplePoint(854, 15*ms, 74*ms, 8550, ok(8550)), Drain: 11377 * ms, Results: 10000, Orders: 10000,
		LagP50: 91 * ms, LagP99: 240 * ms, LagMax: 331 * ms, LagEvents: 8550, OutboxInterval: 100 * ms, OutboxBatch: 200}
	if !full {
		res.Messages.HTTP.Throughput = 0
	}
	res.Wait = waitResult{Duplicates: 1000, SlowDelay: 6 * time.Second, FirstTook: 6616 * ms, P50: 323 * ms, P99: 536 * ms, Last: 536 * ms, Replayed: 1000,
		Other: map[string]int{}, BusyPeak: 2, AllWaiting: true, Pool: 20, Charges: 1, Ended: map[idempotency.Wake]int{idempotency.Wakes[0]: 1000}}
	if !full {
		res.Wait.Other = map[string]int{"409": 3, "error": 1}
		res.Wait.Ended = nil
	}
	phase := func(want string, throughput float64, p50, p99 time.Duration, lookups, wal int64) webhookPhase {
		p := samplePoint(throughput, p50, p99, 2000, map[string]int{"200": 2000})
		p.Outcomes, p.Drain = map[string]int{want: 2000}, time.Duration(2000/throughput*float64(time.Second))
		return webhookPhase{Want: want, Point: p, Lookups: lookups, WAL: wal}
	}
	res.Webhooks = webhookResult{Deliveries: 2000, Concurrency: 16, AsyncDelay: 50 * ms, Paid: 2000,
		First: phase("applied", 310, 48*ms, 120*ms, 2000, 9_400_000), Duplicate: phase("duplicate", 2900, 5*ms, 14*ms, 0, 40_000)}
	if !full {
		res.Webhooks.Duplicate.Point.Outcomes = map[string]int{"duplicate": 1998, "applied": 2}
		res.Webhooks.Duplicate.Lookups = 2
		res.Webhooks.Paid = 1999
	}
	mode := func(name, env string, throughput float64, spans int64) tracingMode {
		p := samplePoint(throughput, 3*ms, 8*ms, 1000, map[string]int{"201": 1000})
		return tracingMode{Name: name, Env: env, Slices: []point{p, p}, Throughput: throughput, P50: 3 * ms, P99: 8 * ms,
			Spans: spans, Exports: spans / 100, Requests: 2000}
	}
	res.Turns = turnsResult{Backlog: 50000, Creates: 200, Workers: 16, Alone: latencies{P50: 9 * ms, P99: 21 * ms, Max: 30 * ms},
		Behind: latencies{P50: 40 * ms, P99: 120 * ms, Max: 180 * ms}, BacklogFirst: 47000, BacklogLast: 41000, Drain: 60 * time.Second, Answered: 50000, Orders: 50000}
	res.Tracing = tracingResult{Concurrency: 16, Rounds: 7, Slice: 1500 * ms, Modes: []tracingMode{
		mode("off", "no OTEL_* variable", 1230, 0),
		mode("on, 1 % sampled", "OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0.01", 1220, 260),
		mode("on, every trace", "OTEL_TRACES_SAMPLER=parentbased_always_on", 1085, 26000)}}
	res.Tenants = sampleTenants(full)
	return res
}

// samplePoint is a point of requests requests, each of which cost this
// process 600 µs and PostgreSQL 900 µs of CPU.
func samplePoint(throughput float64, p50, p99 time.Duration, requests uint64, statuses map[string]int) point {
	return point{Requests: requests, Throughput: throughput, Rate: throughput * 1.01, P50: p50, P90: (p50 + p99) / 2, P99: p99, Max: p99 * 2,
		Drain: 10 * time.Second, Statuses: statuses, Errors: []string{"e1", "e2", "e3", "e4"}, Replayed: int(requests), Bodies: map[[32]byte]int{{1}: int(requests)},
		CPU:     cpuUse{Wall: 10 * time.Second, Process: time.Duration(requests) * 600 * time.Microsecond, Postgres: time.Duration(requests) * 900 * time.Microsecond, Other: time.Second, OK: true},
		Samples: make([]sample, requests)}
}
