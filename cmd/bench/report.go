package main

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The headings of the report, one per scenario; the smoke test looks for
// each of them.
const (
	title1 = "## 1. Create: the service vs the same transaction directly over pgx"
	title2 = "## 2. What the idempotency layer costs"
	title3 = "## 3. Replay vs first execution"
	title4 = "## 4. Duplicate storm"
	title5 = "## 5. Pay with a slow payment channel"
	title6 = "## 6. Create latency at a constant rate"
	title7 = "## 7. Big tables"
	title8 = "## 8. Overload at three times capacity"
	title9 = "## 9. Creates as JetStream commands vs HTTP, and the outbox's lag"
)

func rate(perSecond int) vegeta.Rate { return vegeta.Rate{Freq: perSecond, Per: time.Second} }

// ms formats a latency in milliseconds with three significant digits.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

func perSecond(v float64) string { return fmt.Sprintf("%.0f/s", v) }

// statuses lists the answers by status code, "0" being a transport error.
func statuses(p point) string {
	codes := make([]string, 0, len(p.Statuses))
	for c := range p.Statuses {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	parts := make([]string, len(codes))
	for i, c := range codes {
		name := c
		if c == "0" {
			name = "no answer"
		}
		parts[i] = fmt.Sprintf("%s ×%d", name, p.Statuses[c])
	}
	return strings.Join(parts, ", ")
}

// unexpected lists what was not answered with status want, with vegeta's
// error texts, or is empty.
func unexpected(p point, want int) string {
	if p.ok(want) == int(p.Requests) {
		return ""
	}
	s := statuses(p)
	if len(p.Errors) > 0 {
		errs := p.Errors
		if len(errs) > 3 {
			errs = errs[:3]
		}
		s += " (" + strings.Join(errs, "; ") + ")"
	}
	return s
}

// others is what a run answered besides 201, 503 and its client timeouts
// (requests with no answer too), with vegeta's error texts.
func others(run overloadRun) string {
	rest := run.Point
	rest.Statuses = maps.Clone(rest.Statuses)
	delete(rest.Statuses, strconv.Itoa(http.StatusCreated))
	delete(rest.Statuses, strconv.Itoa(http.StatusServiceUnavailable))
	if rest.Statuses["0"] -= run.Timeout; rest.Statuses["0"] <= 0 {
		delete(rest.Statuses, "0")
	}
	s := statuses(rest)
	if errs := rest.Errors; len(errs) > 0 {
		s += "; vegeta's errors (timeouts included): " + strings.Join(errs[:min(len(errs), 3)], "; ")
	}
	return s
}

// cpuPerRequest is the CPU one request cost this process and PostgreSQL,
// and the cores that anything else kept busy meanwhile.
func cpuPerRequest(p point) (process, postgres, other string) {
	if !p.CPU.OK || p.Requests == 0 {
		return "n/a", "n/a", "n/a"
	}
	per := func(d time.Duration) string {
		return fmt.Sprintf("%.0f µs", float64(d.Microseconds())/float64(p.Requests))
	}
	return per(p.CPU.Process), per(p.CPU.Postgres), fmt.Sprintf("%.2f", p.CPU.Other.Seconds()/p.CPU.Wall.Seconds())
}

// noisyCores is how much CPU outside the run makes a point suspect.
const noisyCores = 0.25

// noisyPoints names the measurements during which other programs used
// more than noisyCores of the machine.
func noisyPoints(res *results) []string {
	type named struct {
		name string
		pt   point
	}
	var all []named
	for _, l := range res.Levels {
		all = append(all, named{fmt.Sprintf("c=%d service", l.Concurrency), l.Service}, named{fmt.Sprintf("c=%d direct", l.Concurrency), l.Direct},
			named{fmt.Sprintf("c=%d without a record", l.Concurrency), l.Plain}, named{fmt.Sprintf("c=%d claim first", l.Concurrency), l.ClaimFirst})
	}
	all = append(all, named{"first execution", res.First}, named{"replay", res.Replay}, named{"storm", res.Storm.Point},
		named{"pay", res.Pay.Point}, named{"constant rate", res.Steady}, named{"empty tables", res.Growth.Empty},
		named{"big tables", res.Growth.Big}, named{"during cleanup", res.Growth.Cleanup.During},
		named{"overload", res.Overload.Shed.Point}, named{"overload without admission", res.Overload.Unshed.Point})
	for _, l := range res.Overload.Limited {
		all = append(all, named{"overload at " + l.Setting(), l.Point})
	}
	var out []string
	for _, n := range all {
		u := n.pt.CPU
		if u.OK && u.Wall > 0 && u.Other.Seconds()/u.Wall.Seconds() > noisyCores {
			out = append(out, fmt.Sprintf("%s (%.2f cores)", n.name, u.Other.Seconds()/u.Wall.Seconds()))
		}
	}
	return out
}

// report accumulates Markdown lines.
type report struct{ strings.Builder }

func (r *report) p(format string, args ...any) { fmt.Fprintf(r, format+"\n", args...) }

// render writes the whole report as Markdown: the machine, the method and
// one section per scenario, every figure taken from res.
func render(res *results, chartFile string) string {
	var r report
	o, m := res.Opts, res.Machine
	r.p("# Benchmark results")
	r.p("")
	r.p("Written by `make bench` (`cmd/bench`). Every figure below was measured in one run, on one machine,")
	r.p("against a fresh database; the service, the load generator (vegeta) and PostgreSQL shared its CPUs.")
	r.p("")
	r.p("| | |")
	r.p("|---|---|")
	r.p("| CPUs (nproc) | %d × %s |", m.CPUs, orNA(m.CPUModel))
	r.p("| Go | %s |", m.GoVersion)
	r.p("| PostgreSQL | %s |", m.PGVersion)
	r.p("| PostgreSQL settings | %s |", m.PGSettings)
	r.p("| date | %s |", m.Date.Format("2006-01-02 15:04 MST"))
	r.p("| command | %s |", m.Command)
	r.p("| run time | %s |", res.Took.Round(time.Second))
	r.p("| load average (1 min) at the start / at the end (this run's own load included) | %s / %s |", m.LoadBefore, m.LoadAfter)
	r.p("")
	r.p("Method: each point is measured for %s after an unmeasured warm-up of %s; the tables are", o.Duration, o.Warmup)
	checkpoint := " (and a CHECKPOINT taken)"
	if o.Quick {
		checkpoint = ""
	}
	r.p("truncated%s before each warm-up and each measurement, so every point starts", checkpoint)
	r.p("from the same table sizes. *Closed loop* means vegeta keeps exactly *c* requests in flight (rate 0,")
	r.p("`Workers = MaxWorkers = c`). Throughput is successful answers per second from the first request sent")
	r.p("to the last answer received; latencies are exact quantiles of every request of the point. Every")
	r.p("create has its own Idempotency-Key and body, except in scenarios 3 and 4.")
	r.p("")
	if len(o.Only) == 0 {
		r.summary(res)
	}

	if noisy := noisyPoints(res); len(noisy) > 0 {
		r.p("**The machine was not quiet**: something outside this run kept more than %.2f cores busy during", noisyCores)
		r.p("%s. Those figures are pessimistic; rerun on an idle machine to compare them.", strings.Join(noisy, ", "))
		r.p("")
	}

	sections := []struct {
		n      int
		title  string
		render func(*report, *results)
	}{
		{1, title1, func(r *report, res *results) { r.create(res, chartFile) }},
		{2, title2, (*report).overhead},
		{3, title3, (*report).replay},
		{4, title4, (*report).storm},
		{5, title5, (*report).pay},
		{6, title6, (*report).steady},
		{7, title7, (*report).growth},
		{8, title8, (*report).overload},
		{9, title9, (*report).messages},
		{10, titleWait, (*report).wait},
	}
	for _, s := range sections {
		r.p(s.title)
		r.p("")
		ran := o.runs(s.n) || (s.n <= 2 && (o.runs(1) || o.runs(2)))
		if !ran {
			r.p("Not run (`-only`).")
			r.p("")
			continue
		}
		s.render(&r, res)
		r.p("")
	}
	if len(res.Problems) > 0 {
		r.p("## Failed assertions")
		r.p("")
		for _, pr := range res.Problems {
			r.p("- %s", pr)
		}
		r.p("")
	}
	return r.String()
}

func (r *report) create(res *results, chartFile string) {
	r.p("Closed loop, `POST /v1/orders` through HTTP, echo, GORM and the idempotency layer, against *direct*:")
	r.p("the same SQL the service runs (one autocommit SELECT of the key's stored outcome, then a transaction")
	r.p("that inserts the record, SUCCEEDED with the order's JSON, ON CONFLICT DO NOTHING, then the order, its")
	r.p("items in one statement, its history entry and its outbox event) run by an `http.RoundTripper`")
	r.p("over a pgx pool of %d connections (the service's DB_MAX_CONNS) that vegeta uses as its client's", res.Opts.Pool)
	r.p("Transport: no network, no HTTP server. Target: ≥ 60 %%.")
	r.p("")
	r.compare(res, "service", "direct pgx", "service / direct", func(l createLevel) point { return l.Direct }, percent)
	r.p("")
	type path struct {
		name string
		pt   point
	}
	paths := func(l createLevel) []path {
		return []path{{"service", l.Service}, {"direct pgx", l.Direct}, {"without a record (pgx)", l.Plain}, {"claim first (pgx)", l.ClaimFirst}}
	}
	notes := 0
	for _, l := range res.Levels {
		for _, x := range paths(l) {
			if u := unexpected(x.pt, 201); u != "" {
				r.p("- c=%d %s: not every create answered 201: %s", l.Concurrency, x.name, u)
				notes++
			}
		}
	}
	if notes == 0 {
		r.p("Every create of scenarios 1 and 2 was answered 201.")
	}
	r.p("")
	r.p("Where the CPU went, from /proc: *this process* is vegeta plus the service (or the pgx client);")
	r.p("*PostgreSQL* is the backends connected to the benchmark's database; *other load* is the cores that")
	r.p("anything else on the machine kept busy during the point (near 0 on a quiet machine).")
	r.p("")
	r.p("| c | path | this process per request | PostgreSQL per request | other load (cores) |")
	r.p("|--:|---|--:|--:|--:|")
	for _, l := range res.Levels {
		for _, x := range paths(l) {
			proc, pg, other := cpuPerRequest(x.pt)
			r.p("| %d | %s | %s | %s | %s |", l.Concurrency, x.name, proc, pg, other)
		}
	}
	if chartFile != "" {
		r.p("")
		r.p("![Throughput and p50/p99 latency against concurrency](%s)", chartFile)
	}
}

func (r *report) overhead(res *results) {
	r.p("Closed loop over pgx, as in scenario 1: the create with its record against *without a record*, the")
	r.p("same transaction with the read before it and the record's insert left out (the same order, items,")
	r.p("history and outbox rows, the same JSON rendered). The difference is what the idempotency layer costs")
	r.p("the database; what the service adds on top of either is scenario 1's. Target: < 15 %% loss,")
	r.p("PostgreSQL CPU ≤ 1.25×. *Claim first* is the protocol the service ran before `Store.Record`: the same")
	r.p("read, then the record claimed PROCESSING as the transaction's first write and completed by a (HOT)")
	r.p("UPDATE to SUCCEEDED as its last: two writes of the record where there is now one. Every statement is")
	r.p("a round trip: 6 per create without a record (BEGIN, four inserts, COMMIT), 8 with it, 9 claiming first.")
	r.p("")
	r.p("| c | with a record | p99 | without a record | p99 | throughput loss | PostgreSQL CPU per create, with ÷ without | claim first | its loss | its CPU ÷ without |")
	r.p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, l := range res.Levels {
		r.p("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |", l.Concurrency, perSecond(l.Direct.Throughput), ms(l.Direct.P99),
			perSecond(l.Plain.Throughput), ms(l.Plain.P99), loss(l.Direct.Throughput, l.Plain.Throughput),
			ratio(pgPerRequest(l.Direct), pgPerRequest(l.Plain)), perSecond(l.ClaimFirst.Throughput),
			loss(l.ClaimFirst.Throughput, l.Plain.Throughput), ratio(pgPerRequest(l.ClaimFirst), pgPerRequest(l.Plain)))
	}
	r.p("")
	r.p("The same three paths interleaved, which is what the ratios are taken from, with two more: *one round")
	r.p("trip*, the create with its record and the create without one, each sent as one pipelined batch, which")
	r.p("PostgreSQL runs as one implicit transaction (the read before the write included, and no BEGIN or")
	r.p("COMMIT of its own; the record's insert is a plain INSERT, for a taken key must abort the batch). No")
	r.p("service here sends a create so; the pair is the floor, what the record costs the database once round")
	r.p("trips cost nothing: its own read and write. At each concurrency, %d rounds of one %s slice of each", res.Opts.Rounds, res.Opts.Slice)
	r.p("path, their order rotated every round, from one reset, so that whatever else the machine does in a")
	r.p("stretch of time hits them alike (sequential %s points, as above, drift by more than the difference", res.Opts.Duration)
	r.p("measured on this machine); before each slice, the service's outbox relay has published the events of")
	r.p("the one before. Each round gives its ratios over its own slices; the table shows their median and, in")
	r.p("brackets, their range.")
	r.p("")
	r.p("| c | throughput loss | PostgreSQL CPU per create, with ÷ without | claim first: loss | its CPU ÷ without | one round trip each: loss | its CPU ÷ without |")
	r.p("|--:|--:|--:|--:|--:|--:|--:|")
	for _, l := range res.Levels {
		m := l.Mixed
		r.p("| %d | %s | %s | %s | %s | %s | %s |", l.Concurrency, percentSpread(m.Loss), timesSpread(m.CPU), percentSpread(m.ClaimLoss), timesSpread(m.ClaimCPU),
			percentSpread(m.OneTripLoss), timesSpread(m.OneTripCPU))
	}
	r.p("")
	r.p("The WAL one create wrote in the same slices (how far the server's WAL insert position moved during a")
	r.p("slice ÷ its creates; the outbox relay marking the events published is in both). Every commit waits for")
	r.p("its WAL to reach the disk, and on this machine the commits queue behind those flushes, so the record's")
	r.p("share of the WAL is a bound on how cheap it can be made by sending its statements differently:")
	r.p("")
	r.p("| c | with a record | without a record | with ÷ without |")
	r.p("|--:|--:|--:|--:|")
	for _, l := range res.Levels {
		m := l.Mixed
		r.p("| %d | %.0f B (%.0f–%.0f) | %.0f B (%.0f–%.0f) | %s |", l.Concurrency, m.WALWith.Median, m.WALWith.Min, m.WALWith.Max,
			m.WALWithout.Median, m.WALWithout.Min, m.WALWithout.Max, timesSpread(m.WAL))
	}
	r.p("")
	r.p("What one create left in the records table (its size right after the point, which started from an")
	r.p("empty table, ÷ the point's creates):")
	r.p("")
	r.p("| c | one insert: heap per create | indexes per create | claim first: heap per create | indexes per create |")
	r.p("|--:|--:|--:|--:|--:|")
	for _, l := range res.Levels {
		per := func(n int64, p point) string {
			if p.Requests == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.0f B", float64(n)/float64(p.Requests))
		}
		r.p("| %d | %s | %s | %s | %s |", l.Concurrency, per(l.DirectSize.Heap, l.Direct), per(l.DirectSize.Indexes, l.Direct),
			per(l.ClaimFirstSize.Heap, l.ClaimFirst), per(l.ClaimFirstSize.Indexes, l.ClaimFirst))
	}
}

func percentSpread(s spread) string {
	return fmt.Sprintf("%.1f %% (%.1f–%.1f)", 100*s.Median, 100*s.Min, 100*s.Max)
}

func timesSpread(s spread) string { return fmt.Sprintf("%.2f× (%.2f–%.2f)", s.Median, s.Min, s.Max) }

// pgPerRequest is the PostgreSQL CPU one request of p cost.
func pgPerRequest(p point) float64 {
	if !p.CPU.OK || p.Requests == 0 {
		return 0
	}
	return float64(p.CPU.Postgres) / float64(p.Requests)
}

func percentOf(a, b int64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f %%", 100*float64(a)/float64(b))
}

func (r *report) replay(res *results) {
	r.p("Closed loop at c=%d: fresh creates (each its own key), then one create request (same key, same", res.Opts.ReplayConc)
	r.p("body) sent again and again after it succeeded once.")
	r.p("")
	r.p("| path | throughput | p50 | p99 | answers |")
	r.p("|---|--:|--:|--:|---|")
	r.p("| first execution | %s | %s | %s | %s |", perSecond(res.First.Throughput), ms(res.First.P50), ms(res.First.P99), statuses(res.First))
	r.p("| replay | %s | %s | %s | %s; Idempotent-Replayed: true on %d; distinct bodies: %d |", perSecond(res.Replay.Throughput),
		ms(res.Replay.P50), ms(res.Replay.P99), statuses(res.Replay), res.Replay.Replayed, len(res.Replay.Bodies))
	r.p("")
	r.p("Replay / first execution: %s the throughput, %s the p50 latency.",
		ratio(res.Replay.Throughput, res.First.Throughput), ratio(float64(res.Replay.P50), float64(res.First.P50)))
	r.p("")
	r.p("The same replay over pgx, the same key and concurrency: the one autocommit SELECT by primary key the")
	r.p("service now answers it with (`Store.Replay`), and the write transaction it ran before (BEGIN, the claim's")
	r.p("INSERT … ON CONFLICT DO NOTHING, SELECT the record, COMMIT).")
	r.p("")
	r.p("| replay over pgx | throughput | p50 | p99 | PostgreSQL CPU per replay |")
	r.p("|---|--:|--:|--:|--:|")
	for _, x := range []struct {
		name string
		p    point
	}{{"one SELECT", res.DirectReplayRead}, {"write transaction", res.DirectReplayTx}} {
		_, pg, _ := cpuPerRequest(x.p)
		r.p("| %s | %s | %s | %s | %s |", x.name, perSecond(x.p.Throughput), ms(x.p.P50), ms(x.p.P99), pg)
	}
}

func (r *report) storm(res *results) {
	st := res.Storm
	r.p("%d copies of one create (one key, one body) fired at once: %d vegeta workers, rate 0, exactly %d", st.Copies, st.Copies, st.Copies)
	r.p("hits. An unmeasured storm on another key opened the connections first (it drained in %s and was answered", ms(st.WarmupDrain))
	r.p("%s; arrivals spread by a thousand connections opening stand in the admission queue, and the limit may", st.WarmupAnswers)
	r.p("shed some). The measured storm started %s later, once the admission limit's memory of any refusal had", admissionMemory)
	r.p("passed.")
	r.p("")
	sp := st.Point
	r.p("| copies | time to drain | p50 | p99 | max | answers | distinct 201 bodies | orders created |")
	r.p("|--:|--:|--:|--:|--:|---|--:|--:|")
	r.p("| %d | %s | %s | %s | %s | %s | %d | %d |", st.Copies, ms(sp.Drain), ms(sp.P50), ms(sp.P99), ms(sp.Max),
		statuses(sp), len(sp.Bodies), st.Orders)
	r.p("")
	verdict := "exactly 1 order created"
	if st.Orders != 1 {
		verdict = fmt.Sprintf("FAILED: %d orders created, want exactly 1", st.Orders)
	}
	r.p("Storm: %s; records SUCCEEDED %d, still PROCESSING %d.", verdict, st.Succeeded, st.Processing)
}

func (r *report) pay(res *results) {
	py := res.Pay
	r.p("The service restarted with DB_MAX_CONNS=%d; the embedded channel adds %s to every call (reset", py.Pool, py.Latency)
	r.p("afterwards). Closed loop at c=%d, each pay on its own CREATED order (%d prepared by one INSERT),", py.Concurrency, py.Prepared)
	r.p("its own key, `pm_ok`. A service holding a connection across the channel call could not pass")
	r.p("pool / latency = %d / %s = %s.", py.Pool, py.Latency, perSecond(py.Bound()))
	if py.MaxInFlight > 0 && py.MaxInFlight < py.Concurrency {
		r.p("Nor could %d pays at once pass HTTP_MAX_IN_FLIGHT=%d if each held its admission slot through the", py.Concurrency, py.MaxInFlight)
		r.p("channel call; a 503 here is the CPUs and the pool at capacity, which the closed loop sends straight back.")
	}
	r.p("")
	r.p("| c | pool | channel latency | pays | p50 | p99 | pool / latency | pays / (pool / latency) | charges at the channel | answers |")
	r.p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
	r.p("| %d | %d | %s | %s | %s | %s | %s | %s | %d | %s |", py.Concurrency, py.Pool, py.Latency,
		perSecond(py.Point.Throughput), ms(py.Point.P50), ms(py.Point.P99), perSecond(py.Bound()),
		fmt.Sprintf("%.2f×", py.Point.Throughput/py.Bound()), py.Charges, statuses(py.Point))
	r.p("")
	proc, pg, other := cpuPerRequest(py.Point)
	r.p("CPU per pay: %s in this process, %s in PostgreSQL; other load: %s cores.", proc, pg, other)
}

func (r *report) steady(res *results) {
	st := res.Steady
	r.p("Open loop: vegeta sends %d creates per second for %s whatever the answers take (fresh keys).", res.Opts.Rate, res.Opts.RateDuration)
	r.p("")
	r.p("| target rate | sent | requests | p50 | p90 | p99 | max | answers |")
	r.p("|--:|--:|--:|--:|--:|--:|--:|---|")
	r.p("| %d/s | %s | %d | %s | %s | %s | %s | %s |", res.Opts.Rate, fmt.Sprintf("%.1f/s", st.Rate), st.Requests,
		ms(st.P50), ms(st.P90), ms(st.P99), ms(st.Max), statuses(st))
}

func (r *report) messages(res *results) {
	m := res.Messages
	r.p("The same creates (fresh keys) two ways, with the consumer's COMMAND_WORKERS=%d as the concurrency of both:", m.Workers)
	r.p("over HTTP in a closed loop at c=%d for %s, and as %d commands published at once to", m.Workers, res.Opts.Duration, m.Commands)
	r.p("`orders.commands.%s.create` (async, JetStream-acknowledged), timed from the first publish to the last", benchTenant)
	r.p("result on `orders.results.%s.create`. A command costs a stream write, a durable-consumer delivery,", benchTenant)
	r.p("a result published to `ORDER_RESULTS` and an ack on top of the same use case.")
	r.p("")
	r.p("| door | concurrency | creates | throughput | p50 | p99 | orders | answers |")
	r.p("|---|--:|--:|--:|--:|--:|--:|---|")
	r.p("| HTTP | %d | %d | %s | %s | %s | | %s |", m.Workers, m.HTTP.Requests, perSecond(m.HTTP.Throughput), ms(m.HTTP.P50), ms(m.HTTP.P99), statuses(m.HTTP))
	r.p("| JetStream | %d | %d | %s | | | %d | %d × 201 |", m.Workers, m.Commands, perSecond(m.Throughput()), m.Orders, m.Results)
	r.p("")
	if m.HTTP.Throughput > 0 {
		r.p("JetStream commands/s = %s of HTTP creates/s.", percent(m.Throughput(), m.HTTP.Throughput))
		r.p("")
	}
	r.p("Outbox lag during the HTTP run: from each order's creation time (inside its transaction) to the arrival")
	r.p("of its `created` event at a subscriber of `orders.events.%s.created`, relay interval %s, batch %d.", benchTenant,
		res.Opts.outboxInterval, res.Opts.outboxBatch)
	r.p("")
	r.p("| events | p50 | p99 | max |")
	r.p("|--:|--:|--:|--:|")
	r.p("| %d | %s | %s | %s |", m.LagEvents, ms(m.LagP50), ms(m.LagP99), ms(m.LagMax))
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}

// compare writes a table of the service against another path at every
// concurrency: throughput, p50 and p99 of each, and how they relate.
func (r *report) compare(res *results, name, otherName, relation string, other func(createLevel) point, relate func(a, b float64) string) {
	r.p("| c | %s | p50 | p99 | %s | p50 | p99 | %s |", name, otherName, relation)
	r.p("|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, l := range res.Levels {
		o := other(l)
		r.p("| %d | %s | %s | %s | %s | %s | %s | %s |", l.Concurrency,
			perSecond(l.Service.Throughput), ms(l.Service.P50), ms(l.Service.P99),
			perSecond(o.Throughput), ms(o.P50), ms(o.P99), relate(l.Service.Throughput, o.Throughput))
	}
}

func percent(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*a/b, 'f', 0, 64) + " %"
}

// loss is how much less throughput a has than b, in percent.
func loss(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*(1-a/b), 'f', 1, 64) + " %"
}

func ratio(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func (r *report) growth(res *results) {
	g := res.Growth
	r.p("Generated in SQL (`generate_series`, three statements on three connections, then ANALYZE and a")
	r.p("CHECKPOINT), in this run's database: %s finished records (a quarter `order.pay`; the oldest tenth,", count(g.Records))
	r.p("written first, expired, as in a table whose records were written in the order of time; each with a")
	r.p("450-byte response) and %s orders with two items and a create event each, under another", count(g.Orders))
	r.p("tenant than the load's. That took **%s**; the records table is %d MB with its indexes.", g.Generated.Round(time.Second), g.TableBytes>>20)
	r.p("")
	r.p("| tables | creates (closed loop, c=%d) | p50 | p99 | GET /metrics (median of %d) |", res.Opts.ReplayConc, g.Scrapes)
	r.p("|---|--:|--:|--:|--:|")
	r.p("| empty | %s | %s | %s | %s |", perSecond(g.Empty.Throughput), ms(g.Empty.P50), ms(g.Empty.P99), ms(g.ScrapeEmpty))
	r.p("| %s records, %s orders | %s | %s | %s | %s |", count(g.Records), count(g.Orders), perSecond(g.Big.Throughput), ms(g.Big.P50), ms(g.Big.P99), ms(g.ScrapeBig))
	r.p("")
	r.p("Big ÷ empty: %s the create throughput. The five statements the metrics ran at every scrape before", ratio(g.Big.Throughput, g.Empty.Throughput))
	r.p("(`count(*)` by state and two more scans) took **%s** once on the big table; their collector gave up", ms(g.OldGauges))
	r.p("after 2 s. `Store.Gauges` counts the unfinished records through the sweeper's index and estimates")
	r.p("the finished ones from PostgreSQL's statistics.")
	r.p("")
	r.p("Cleanup: creates came at a constant %d/s (half the big-table throughput) for %d phases of %s after", g.CleanupRate, g.Phases, g.Phase)
	r.p("one more in which the load opened its connections (not counted); in every other phase the service's own job")
	r.p("(`idempotency.Cleaner`) ran against the %s expired records, each setting after a CHECKPOINT: first with the", count(g.Expired))
	r.p("settings it had before (CLEANUP_BATCH=%d, CLEANUP_PAUSE=%s), then, on the records left, with the", g.CleanupBefore.Batch, g.CleanupBefore.Pause)
	r.p("service's (CLEANUP_BATCH=%d, CLEANUP_PAUSE=%s), both on the service's pool, and last with the service's again, the job on two", g.Cleanup.Batch, g.Cleanup.Pause)
	r.p("connections of its own whose sessions set `wal_compression=%s` (the server's setting is in the table at the", g.CleanupCompressed.WALCompression)
	r.p("top; a DBA sets it with ALTER SYSTEM, or for a role with ALTER ROLE … SET): deleting from a page not touched since the")
	r.p("last checkpoint logs the whole page, and the pages of expired records are old. Each create counts in the")
	r.p("phase it was sent in, so the rows of one setting are measured over the same stretch of time. *Removed per")
	r.p("second* is over the time the job ran; each setting starts behind the rows the ones before it deleted,")
	r.p("which can only slow it. *WAL* is what the whole cluster wrote during the setting's phases, creates included.")
	r.p("")
	r.p("*Phase by phase* divides the p99 of each phase with the job by that of the phase without it right after,")
	r.p("as §2 interleaves its paths: the median and range of those %d ratios. A stall that hits one phase moves one", g.Phases/2)
	r.p("ratio there, where it moves the p99 of a whole half.")
	r.p("")
	r.p("| cleanup job | creates at %d/s | p50 | p99 | answers | records removed | of them archived | removed per second | WAL | create p99 during ÷ without | phase by phase |", g.CleanupRate)
	r.p("|---|---|--:|--:|---|--:|--:|--:|--:|--:|--:|")
	settings := []struct {
		name string
		run  cleanupRun
	}{{"before", g.CleanupBefore}, {"the service's", g.Cleanup}, {"the service's, wal_compression=" + g.CleanupCompressed.WALCompression, g.CleanupCompressed}}
	for _, c := range settings {
		setting := fmt.Sprintf("%s: batch %d, pause %s", c.name, c.run.Batch, c.run.Pause)
		r.p("| %s | without cleanup | %s | %s | %s | | | | | | |", setting, ms(c.run.Quiet.P50), ms(c.run.Quiet.P99), statuses(c.run.Quiet))
		r.p("| %s | during cleanup | %s | %s | %s | %d | %d | %.0f/s | %d MB | %s | %s |", setting, ms(c.run.During.P50), ms(c.run.During.P99), statuses(c.run.During),
			c.run.Cleaned.Deleted, c.run.Cleaned.Archived, c.run.PerSecond(), c.run.WAL>>20, ratio(float64(c.run.During.P99), float64(c.run.Quiet.P99)), timesSpread(c.run.Paired))
	}
	r.p("")
	r.p("A 503 at half the throughput is a create that found every admission slot taken for longer than the")
	r.p("queue allows (HTTP_QUEUE_TIMEOUT, or a quarter of it once the queue stands): the requests in flight had")
	r.p("stopped finishing. *When* the 503s came says what stopped them: counted in windows of %s by send time,", refusalWindow)
	r.p("beside the checkpoints PostgreSQL completed meanwhile (pg_stat_bgwriter; its settings are in the table at")
	r.p("the top, and deleting from a page not touched since the last checkpoint logs the whole page) and the")
	r.p("share of the service's active sessions that were waiting for the WAL to be written or flushed, a commit")
	r.p("waiting for its fsync (wait events WALWrite and WALSync, pg_stat_activity sampled every %s):", walSampleEvery)
	r.p("")
	r.p("| cleanup job | 503s | windows of %s with a 503 | of them in phases with the job | checkpoints completed | their sync phases | active sessions waiting for the WAL: windows with a 503 | the others |", refusalWindow)
	r.p("|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, c := range settings {
		refusedWAL := "–"
		if c.run.RefusedIn > 0 {
			refusedWAL = fmt.Sprintf("%.0f %%", 100*c.run.WALWaitRefused)
		}
		r.p("| %s: batch %d, pause %s | %d | %d of %d | %d | %d | %s | %s | %.0f %% |", c.name, c.run.Batch, c.run.Pause,
			c.run.Quiet.ok(http.StatusServiceUnavailable)+c.run.During.ok(http.StatusServiceUnavailable),
			c.run.RefusedIn, int(time.Duration(g.Phases)*g.Phase/refusalWindow), c.run.RefusedDuring, c.run.Checkpoints, ms(c.run.CheckpointSync),
			refusedWAL, 100*c.run.WALWaitOther)
	}
	r.p("")
}

func (r *report) overload(res *results) {
	ov := res.Overload
	r.p("The service runs here in a process of its own: the binary `go build ./cmd/orderservice` makes, with the bench's")
	r.p("configuration, so that the thousands of requests a second vegeta starts, and its garbage collection, do not")
	r.p("share the service's Go scheduler. (They still share the machine's cores, with PostgreSQL.)")
	r.p("")
	r.p("Open loop (vegeta sends whatever the answers take) at %d× the capacity: the most creates per second", ov.Factor)
	if ov.InProcess > 0 {
		r.p("that process answered 201 in a closed loop at scenario 1's best concurrency (%s, at c=%d; %s in process in scenario 1).", perSecond(ov.Capacity), ov.CapacityAt, perSecond(ov.InProcess))
	} else {
		r.p("that process answered 201 in closed loops at any of c=%s (%s, at c=%d).", (*intList)(&res.Opts.Concurrency), perSecond(ov.Capacity), ov.CapacityAt)
	}
	r.p("%d creates/s for %s, fresh keys,", ov.Rate, ov.For)
	r.p("a client timeout of %s. Right when", ov.ClientTimeout)
	r.p("the overload stops sending, a normal load of %d/s (half the capacity) starts; *back to normal* is", ov.NormalRate)
	r.p("the end of the last %s of it (by send time) with an answer other than 201 or a p90 above twice the", recoveryBucket)
	r.p("p99 of the same load before any overload (%s). *Goodput* is accepted answers per second from the first", ms(ov.Normal.P99))
	r.p("request sent to the last answer received. Once with the service's admission defaults (%s),", ov.Limits)
	if len(ov.Limited) > 0 {
		settings := make([]string, len(ov.Limited))
		for i, l := range ov.Limited {
			settings[i] = l.Setting()
		}
		r.p("once restarted with each of %s (the rest as the defaults),", strings.Join(settings, ", "))
	}
	r.p("once restarted with HTTP_MAX_IN_FLIGHT=0 (no admission control, as before).")
	r.p("")
	r.p("| service | accepted (201) | p50 | p99 | refused (503) | refused p50 | p99 | max | client timeouts | other | goodput ÷ capacity | back to normal | `/healthz` meanwhile: p50 | p99 |")
	r.p("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	type row struct {
		name string
		run  overloadRun
	}
	rows := []row{{"admission limit (defaults)", ov.Shed}}
	for _, l := range ov.Limited {
		rows = append(rows, row{l.Setting(), l.overloadRun})
	}
	rows = append(rows, row{"no admission control", ov.Unshed})
	for _, x := range rows {
		back := x.run.BackToNormal.String()
		if !x.run.Recovered {
			back = "> " + back
		}
		healthzP50, healthzP99 := ms(x.run.Healthz.P50), ms(x.run.Healthz.P99)
		if h := x.run.Healthz; h.Statuses["200"] != int(h.Requests) {
			healthzP50, healthzP99 = "not all 200", fmt.Sprint(h.Statuses)
		}
		r.p("| %s | %d | %s | %s | %d | %s | %s | %s | %d (%s) | %d | %s | %s | %s | %s |", x.name, x.run.Accepted, ms(x.run.AcceptedP50), ms(x.run.AcceptedP99),
			x.run.Refused, ms(x.run.RefusedP50), ms(x.run.RefusedP99), ms(x.run.RefusedMax), x.run.Timeout,
			percentOf(int64(x.run.Timeout), int64(len(x.run.Point.Samples))), x.run.Other, percent(x.run.Goodput, ov.Capacity), back,
			healthzP50, healthzP99)
	}
	r.p("")
	for _, x := range rows {
		if x.run.Other > 0 {
			r.p("The %d other answers of *%s* (not 201, not 503, not a client timeout): %s.", x.run.Other, x.name, others(x.run))
			r.p("")
		}
	}
	noRetryAfter := ov.Shed.NoRetryAfter
	for _, l := range ov.Limited {
		noRetryAfter += l.NoRetryAfter
	}
	if noRetryAfter == 0 {
		r.p("Every 503 carried Retry-After.")
	} else {
		r.p("%d refusals came without Retry-After.", noRetryAfter)
	}
	r.p("")
	r.p("*`/healthz` meanwhile* is GET /healthz at %d/s through the overload: no admission, no database, the cheapest", healthzRate)
	r.p("answer the service gives. A refusal itself costs microseconds; where the refused quantiles are close to")
	r.p("`/healthz`'s, the rest of their time is what any answer waits for on this machine under the overload (a CPU")
	r.p("shared with PostgreSQL and the load generator), not the admission limit.")
	if len(ov.Limited) > 0 {
		r.p("")
		r.p("The other settings show what each trades. A request admitted beyond what the CPUs and")
		r.p("the database pool (DB_MAX_CONNS=%d) run at once only waits inside the process, for a connection or a", res.Opts.Pool)
		r.p("CPU, and every runnable request delays the next refusal too: a larger HTTP_MAX_IN_FLIGHT lets that wait in, a")
		r.p("smaller one keeps it out at the price of less room for bursts. DB_MAX_CONNS bounds how many PostgreSQL")
		r.p("backends run at once, on the cores the service's answers share here. Pays and waiting duplicates need no room")
		r.p("of their own: they give their slot back while they wait for the channel or for the first attempt (§5")
		r.p("runs %d pays at once).", res.Opts.PayConc)
	}
}

// count writes n with thin spaces between thousands (10 000 000).
func count(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + " " + s[i:]
	}
	return s
}
