package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQuickRun runs the whole program in its smallest mode against a fresh
// database and the real service, as `make bench` does, and checks that the
// report covers every scenario and that the storm made exactly one order.
// It needs PostgreSQL (TEST_DATABASE_URL or the local server) and fails,
// never skips, without it.
func TestQuickRun(t *testing.T) {
	out := t.TempDir()
	// The run may take what the test binary's -timeout leaves (make test
	// gives each package 8 minutes; a loaded machine needs most of them),
	// less a margin to report a run cut short.
	deadline := time.Now().Add(5 * time.Minute)
	if d, ok := t.Deadline(); ok {
		deadline = d.Add(-20 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var stdout, stderr bytes.Buffer
	start := time.Now()
	err := run(ctx, []string{"-quick", "-out", out}, noEnv, &stdout, &stderr)
	t.Logf("bench -quick took %s", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("bench -quick: %v\nstderr:\n%s\nstdout:\n%s", err, stderr.String(), stdout.String())
	}
	report := stdout.String()

	t.Run("reports every scenario", func(t *testing.T) {
		for _, title := range scenarioHeadings {
			if !strings.Contains(report, title+"\n") {
				t.Errorf("the report has no section %q", title)
			}
		}
		if strings.Contains(report, "Not run") {
			t.Errorf("a scenario was not run:\n%s", report)
		}
		quick, err := parseOptions([]string{"-quick"}, noEnv, &stderr)
		if err != nil {
			t.Fatal(err)
		}
		rows := []string{"\n| first execution | ", "\n| replay | ", fmt.Sprintf("\n| %d | ", quick.Storm),
			fmt.Sprintf("\n| %d | %d | %s | ", quick.PayConc, quick.PayPool, quick.PayLatency), fmt.Sprintf("\n| %d/s | ", quick.Rate),
			"\n| JetStream | ", fmt.Sprintf("\n| first (`applied` wanted) | %d | applied ×%d | ", quick.Webhooks, quick.Webhooks),
			fmt.Sprintf("\n| duplicate (`duplicate` wanted) | %d | duplicate ×%d | ", quick.Webhooks, quick.Webhooks)}
		for _, c := range quick.Concurrency {
			rows = append(rows, fmt.Sprintf("\n| %d | ", c))
		}
		for _, row := range rows {
			if !strings.Contains(report, row) {
				t.Errorf("the report has no row starting %q:\n%s", strings.TrimSpace(row), report)
			}
		}
	})

	t.Run("the storm created exactly one order", func(t *testing.T) {
		if !strings.Contains(report, "Storm: exactly 1 order created") {
			t.Errorf("the report does not state exactly 1 order:\n%s", report)
		}
	})

	t.Run("the layer, the big tables and the overload are measured", func(t *testing.T) {
		if strings.Contains(report, "not all 200") {
			t.Errorf("GET /healthz did not answer 200 every time during an overload:\n%s", report)
		}
		for _, want := range []string{"| throughput loss |", "| claim first |", "| one round trip each: loss |", "| with a record | without a record | with ÷ without |", "| one SELECT | ",
			"Big ÷ empty: ", "| during cleanup | ", "| the service's, wal_compression=lz4: batch ", "| windows of 100ms with a 503 |", "| admission limit (defaults) | ", "| DB_MAX_CONNS=8 | ", "| no admission control | ",
			"| `/healthz` meanwhile: p50 |", "## Summary\n"} {
			if !strings.Contains(report, want) {
				t.Errorf("the report lacks %q:\n%s", want, report)
			}
		}
	})

	t.Run("writes the report and the chart", func(t *testing.T) {
		md, err := os.ReadFile(filepath.Join(out, "results.md"))
		if err != nil {
			t.Fatal(err)
		}
		if string(md) != report {
			t.Errorf("results.md differs from the printed report")
		}
		svg, err := os.ReadFile(filepath.Join(out, "throughput.svg"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(svg, []byte("<svg ")) || !bytes.HasSuffix(bytes.TrimSpace(svg), []byte("</svg>")) {
			t.Errorf("throughput.svg is not an SVG document: %.200s", svg)
		}
	})
}

func TestOptions(t *testing.T) {
	t.Run("quick shrinks what it is not told", func(t *testing.T) {
		o, err := parseOptions([]string{"-quick", "-storm", "70"}, noEnv, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if o.Storm != 70 || len(o.Concurrency) != 2 || o.Duration >= time.Second {
			t.Errorf("got storm %d, concurrency %v, duration %s", o.Storm, o.Concurrency, o.Duration)
		}
	})
	t.Run("a quick run writes outside the tree unless told where", func(t *testing.T) {
		o, _ := parseOptions([]string{"-quick"}, noEnv, &bytes.Buffer{})
		if o.Out == "docs/benchmarks" || !strings.HasPrefix(o.Out, os.TempDir()) {
			t.Errorf("-quick writes to %q, want a directory under %s", o.Out, os.TempDir())
		}
		if o, _ := parseOptions([]string{"-quick", "-out", "here"}, noEnv, &bytes.Buffer{}); o.Out != "here" {
			t.Errorf("-quick -out here writes to %q", o.Out)
		}
		if o, _ := parseOptions(nil, noEnv, &bytes.Buffer{}); o.Out != "docs/benchmarks" {
			t.Errorf("a full run writes to %q, want docs/benchmarks", o.Out)
		}
	})
	t.Run("refuses a zero concurrency", func(t *testing.T) {
		if _, err := parseOptions([]string{"-c", "1,0"}, noEnv, &bytes.Buffer{}); err == nil {
			t.Error("-c 1,0 was accepted")
		}
	})
}

func noEnv(string) string { return "" }

// scenarioHeadings head the report's sections, one per scenario; other
// documents link to them by number.
var scenarioHeadings = []string{
	"## 1. Create: the service vs the same transaction directly over pgx",
	"## 2. What the idempotency layer costs",
	"## 3. Replay vs first execution",
	"## 4. Duplicate storm",
	"## 5. Pay with a slow payment channel",
	"## 6. Create latency at a constant rate",
	"## 7. Big tables",
	"## 8. Overload at three times capacity",
	"## 9. Creates as JetStream commands vs HTTP, and the outbox's lag",
	"## 10. Duplicates waiting for the first result (Prefer: wait)",
	"## 11. Webhooks: a first delivery against a duplicate",
	"## 12. What tracing costs",
	"## 13. A quiet tenant's create behind another tenant's backlog",
	"## 14. Each tenant its share: a quiet tenant beside a flood, and a bounded client",
}

// The overload table counts client timeouts apart, so what it lists as a
// run's other answers leaves them out.
func TestOthersLeaveTheClientTimeoutsOut(t *testing.T) {
	run := overloadRun{Point: point{Statuses: map[string]int{"201": 5, "503": 3, "0": 10, "500": 2},
		Errors: []string{"socket: too many open files", "Client.Timeout exceeded"}}, Timeout: 4}
	want := "no answer ×6, 500 ×2; vegeta's errors (timeouts included): socket: too many open files; Client.Timeout exceeded"
	if got := others(run); got != want {
		t.Errorf("others = %q, want %q", got, want)
	}
	if run.Point.Statuses["0"] != 10 {
		t.Errorf("others changed the run's own counts: %v", run.Point.Statuses)
	}
	if got := others(overloadRun{Point: point{Statuses: map[string]int{"201": 5, "0": 4}}, Timeout: 4}); got != "" {
		t.Errorf("others of a run whose only unanswered requests timed out = %q, want nothing", got)
	}
}

// A window of the big tables' cleanup counts as refused when a create sent
// in it got a 503, and the WAL waits are split between those windows and
// the others; the load's first phase counts for neither.
func TestWALWaitsAreSplitByTheWindowsWithARefusal(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	counted := at(1000)
	samples := []sample{
		{At: at(500), Code: 503},  // phase 0: not counted
		{At: at(1050), Code: 503}, // window 10
		{At: at(1090), Code: 503}, // window 10 again
		{At: at(1150), Code: 201},
		{At: at(1420), Code: 503}, // window 14
	}
	refused := refusedWindows(samples, start, counted)
	if len(refused) != 2 || !refused[10] || !refused[14] {
		t.Fatalf("refused windows = %v, want 10 and 14", refused)
	}
	wal := []walSample{
		{at: at(510), waitingWAL: 9, active: 9},  // phase 0: not counted
		{at: at(1010), waitingWAL: 3, active: 4}, // window 10
		{at: at(1430), waitingWAL: 1, active: 1}, // window 14
		{at: at(1200), waitingWAL: 1, active: 4}, // elsewhere
		{at: at(1300), waitingWAL: 0, active: 0}, // nobody active
	}
	in, elsewhere := walShares(wal, refused, start, counted)
	if in != 0.8 || elsewhere != 0.25 {
		t.Errorf("WAL waits = %v in the refused windows and %v elsewhere, want 0.8 and 0.25", in, elsewhere)
	}
}

// The service is back to normal where a whole hold of normal pieces
// begins; a slow piece after it is a hiccup, counted, not a later
// recovery; a load with no such hold has not recovered.
func TestBackToNormalIsWhereAHoldOfNormalPiecesBegins(t *testing.T) {
	start := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	limit := 20 * time.Millisecond
	// load builds a load of 250ms pieces, one answer each: 201 in time
	// unless the piece's letter says slow (s) or refused (r).
	load := func(pieces string) point {
		var p point
		for i, c := range pieces {
			s := sample{At: start.Add(time.Duration(i) * recoveryBucket), Code: 201, Latency: time.Millisecond}
			switch c {
			case 's':
				s.Latency = 2 * limit
			case 'r':
				s.Code = 503
			}
			p.Samples = append(p.Samples, s)
		}
		return p
	}
	for _, c := range []struct {
		pieces    string
		want      time.Duration
		recovered bool
		slowAfter int
	}{
		{"ssr.............", 750 * time.Millisecond, true, 0},
		{"s.........s.....", 250 * time.Millisecond, true, 1},
		{"................", 0, true, 0},
		{"s........s......", 250 * time.Millisecond, true, 1},
		{"ss......s........", 2250 * time.Millisecond, true, 0},
		{"s......s......s.", 4 * time.Second, false, 0},
	} {
		got, recovered, slowAfter := backToNormal(slowBuckets(load(c.pieces), start, limit))
		if got != c.want || recovered != c.recovered || slowAfter != c.slowAfter {
			t.Errorf("%s: back to normal %s (recovered %v, %d slow after), want %s (%v, %d)",
				c.pieces, got, recovered, slowAfter, c.want, c.recovered, c.slowAfter)
		}
	}
}

// The phase-by-phase ratio pairs each phase with the cleanup job with the
// phase without it right after, and leaves phase 0 out.
func TestThePhaseByPhaseP99PairsEachCleanupPhaseWithTheNext(t *testing.T) {
	start := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	phase := time.Second
	in := func(p int, latency time.Duration) sample {
		return sample{At: start.Add(time.Duration(p)*phase + phase/2), Latency: latency, Code: 201}
	}
	samples := []sample{
		{At: start.Add(-time.Millisecond), Latency: time.Hour}, // before the start
		in(0, time.Hour), // phase 0: while the load opens its connections
		in(1, 20*time.Millisecond), in(2, 10*time.Millisecond),
		in(3, 30*time.Millisecond), in(4, 10*time.Millisecond),
		in(5, time.Minute), // phase 5 has no phase 6 within 4 phases: not paired
	}
	got := pairedP99(samples, start, phase, 4)
	if want := (spread{Median: 2.5, Min: 2, Max: 3}); got != want {
		t.Errorf("pairedP99 = %+v, want %+v", got, want)
	}
}

// A service process that exits before /readyz answers is an error at
// once, with what it printed, not a minute's wait.
func TestAServiceProcessThatExitsBeforeItIsReadyIsAnError(t *testing.T) {
	script := filepath.Join(t.TempDir(), "orderservice")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho cannot reach the database\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	p, err := startProcess(script, map[string]string{})
	if err == nil {
		p.Close()
		t.Fatal("startProcess returned no error for a process that exited at once")
	}
	if !strings.Contains(err.Error(), "exited before") || !strings.Contains(err.Error(), "cannot reach the database") {
		t.Errorf("error = %v, want it to say the service exited, with its output", err)
	}
	t.Logf("refused after %s: %v", time.Since(began).Round(time.Millisecond), err)
}

// The probe's p99 bound holds the true p99 of what it sampled about 95 %
// of the time, where its p99 alone falls below the truth about half the
// time: two samplings of one distribution, judged by their p99s alone,
// would call one of them slower every other run. Samplings of 2 000 from
// an exponential distribution (true p99 = ln 100 × the mean).
func TestTheProbesP99BoundHoldsTheTrueP99NineteenTimesInTwenty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	truth := time.Duration(math.Log(100) * float64(time.Millisecond))
	const trials = 2000
	held, above := 0, 0
	for range trials {
		s := make([]time.Duration, 2000)
		for i := range s {
			s[i] = time.Duration(rng.ExpFloat64() * float64(time.Millisecond))
		}
		slices.Sort(s)
		held += btoi(quantileHigh(s, 0.99) >= truth)
		above += btoi(quantile(s, 0.99) >= truth)
	}
	if f := float64(held) / trials; f < 0.945 || f > 0.975 {
		t.Errorf("the bound held the true p99 in %.1f %% of samplings, want 95 %% or a little more", 100*f)
	}
	if f := float64(above) / trials; f < 0.4 || f > 0.6 {
		t.Errorf("the sampled p99 alone was at or above the true p99 in %.1f %% of samplings, want about half", 100*f)
	}
	// 1..2000 ms: the bound is the 1988th (at least 13 of 2 000 above the true p99: 96 %).
	s := make([]time.Duration, 2000)
	for i := range s {
		s[i] = time.Duration(i+1) * time.Millisecond
	}
	if got := quantileHigh(s, 0.99); got != 1988*time.Millisecond {
		t.Errorf("bound of 1..2000 ms = %s, want 1.988s", got)
	}
	// 100 samples (a quick run's probe) allow no bound: the largest.
	if got := quantileHigh(s[:100], 0.99); got != 100*time.Millisecond {
		t.Errorf("bound of 1..100 ms = %s, want the largest, 100ms", got)
	}
}
