package main

import (
	_ "embed"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// reportText is the report's prose and layout: report.md.tmpl holds every
// sentence and table of docs/benchmarks/results.md, and this file only
// computes and formats the figures it shows.
//
//go:embed report.md.tmpl
var reportText string

var reportTemplate = template.Must(template.New("results.md").Option("missingkey=error").Funcs(template.FuncMap{
	"ms": ms, "perSecond": perSecond, "perSecond1": perSecond1, "count": count, "megabytes": megabytes, "micros": micros, "hundredths": hundredths,
	"percent": percent, "countPercent": countPercent, "percentage": percentage, "percentage1": percentage1, "change": change,
	"loss": loss, "ratio": ratio, "latencyRatio": latencyRatio, "times": times,
	"percentSpread": percentSpread, "timesSpread": timesSpread, "bytesSpread": bytesSpread, "bytesPer": bytesPer,
	"statuses": statuses, "outcomes": outcomes, "unexpected": unexpected, "others": others, "cpuPer": cpuPer, "pgPerRequest": pgPerRequest,
	"yes": yes, "orNA": orNA,
}).Parse(reportText + tenantsText))

// reportData is what the template renders: the run's results, the chart
// beside the report, and the constants its text names. A template reaches
// only exported names, so the fields and methods it uses are exported
// (Summary, Paths, Runs, …) and the rest of the package's are not.
type reportData struct {
	*results
	Chart string // the chart's file name; empty: no chart

	NoisyCores                                                                                       float64
	AdmissionMemory, RecoveryBucket, RecoveryHold, RefusalWindow, Settle, RepinEvery, WALSampleEvery time.Duration
	HealthzRate                                                                                      int
	Tenant                                                                                           string
}

// render writes the whole report as Markdown: the machine, the method and
// one section per scenario, every figure taken from res.
func render(res *results, chartFile string) (string, error) {
	var b strings.Builder
	err := reportTemplate.Execute(&b, reportData{results: res, Chart: chartFile,
		NoisyCores: noisyCores, AdmissionMemory: admissionMemory, RecoveryBucket: recoveryBucket, RecoveryHold: recoveryHold, RefusalWindow: refusalWindow, Settle: settle, RepinEvery: repinEvery,
		WALSampleEvery: walSampleEvery, HealthzRate: healthzRate, Tenant: benchTenant})
	return b.String(), err
}

// summary is issue 15's figures as this run measured them, and whether
// each met the aim.
type summary struct {
	// Levels are the levels of §2 the summary quotes: c ≥ 4.
	Levels []createLevel
	// Pair is the level at scenario 3's concurrency (else the last one),
	// where the Store.Record pair is quoted; nil when none ran.
	Pair *createLevel
	// ReplaySpeedup is replay ÷ first execution, BigTables big ÷ empty, in
	// create throughput.
	ReplaySpeedup, BigTables                                                     float64
	LossMet, CPUMet, ReplayMet, BigTablesMet, ScrapeMet, CleanupMet, OverloadMet bool
}

func (r *results) Summary() summary {
	var s summary
	s.LossMet, s.CPUMet = true, true
	for _, l := range r.Levels {
		if l.Concurrency < 4 {
			continue
		}
		s.Levels = append(s.Levels, l)
		s.LossMet = s.LossMet && l.Mixed.Loss.Median < 0.15
		s.CPUMet = s.CPUMet && l.Mixed.CPU.Median <= 1.25
	}
	s.LossMet, s.CPUMet = s.LossMet && len(s.Levels) > 0, s.CPUMet && len(s.Levels) > 0
	if n := len(r.Levels); n > 0 {
		s.Pair = &r.Levels[n-1]
	}
	for i, l := range r.Levels {
		if l.Concurrency == r.Opts.ReplayConc {
			s.Pair = &r.Levels[i]
		}
	}
	s.ReplaySpeedup = r.Replay.Throughput / max(r.First.Throughput, 1e-9)
	s.ReplayMet = s.ReplaySpeedup >= 4
	g := r.Growth
	s.BigTables = g.Big.Throughput / max(g.Empty.Throughput, 1e-9)
	s.BigTablesMet = s.BigTables >= 0.8
	s.ScrapeMet = g.ScrapeBig < 50*time.Millisecond
	s.CleanupMet = g.Cleanup.PerSecond() >= 20000 && g.Cleanup.P99Up() < 0.25
	shed := r.Overload.Shed
	s.OverloadMet = shed.AcceptedP99 < 250*time.Millisecond && shed.FloorMet() && shed.GoodputShare() >= 0.9 &&
		shed.Timeout == 0 && shed.Recovered && shed.BackToNormal < 5*time.Second && shed.NoRetryAfter == 0
	return s
}

// namedPoint is a point with the name the report gives it.
type namedPoint struct {
	Name  string
	Point point
}

// Paths are scenarios 1 and 2's points at one concurrency, in the order
// the report lists them.
func (l createLevel) Paths() []namedPoint {
	return []namedPoint{{"service", l.Service}, {"direct pgx", l.Direct}, {"without a record (pgx)", l.Plain}, {"claim first (pgx)", l.ClaimFirst}}
}

// notCreated is a point of scenarios 1 and 2 with answers other than 201.
type notCreated struct {
	Concurrency   int
	Path, Answers string
}

// NotCreated lists the points of scenarios 1 and 2 where not every create
// was answered 201.
func (r *results) NotCreated() []notCreated {
	var out []notCreated
	for _, l := range r.Levels {
		for _, p := range l.Paths() {
			if u := unexpected(p.Point, http.StatusCreated); u != "" {
				out = append(out, notCreated{l.Concurrency, p.Name, u})
			}
		}
	}
	return out
}

// noisyCores is how much CPU outside the run makes a point suspect.
const noisyCores = 0.25

// noisyPoint is a measurement during which other programs kept Cores of
// the machine busy.
type noisyPoint struct {
	Name  string
	Cores float64
}

// NoisyPoints names the measurements during which other programs used
// more than noisyCores of the machine.
func (r *results) NoisyPoints() []noisyPoint {
	var all []namedPoint
	for _, l := range r.Levels {
		for _, p := range []namedPoint{{"service", l.Service}, {"direct", l.Direct}, {"without a record", l.Plain}, {"claim first", l.ClaimFirst}} {
			all = append(all, namedPoint{fmt.Sprintf("c=%d %s", l.Concurrency, p.Name), p.Point})
		}
	}
	all = append(all, namedPoint{"first execution", r.First}, namedPoint{"replay", r.Replay}, namedPoint{"storm", r.Storm.Point},
		namedPoint{"pay", r.Pay.Point}, namedPoint{"constant rate", r.Steady}, namedPoint{"empty tables", r.Growth.Empty},
		namedPoint{"big tables", r.Growth.Big}, namedPoint{"during cleanup", r.Growth.Cleanup.During},
		namedPoint{"overload", r.Overload.Shed.Point}, namedPoint{"overload without admission", r.Overload.Unshed.Point})
	for _, l := range r.Overload.Limited {
		all = append(all, namedPoint{"overload at " + l.Setting, l.Point})
	}
	var out []noisyPoint
	for _, n := range all {
		u := n.Point.CPU
		if u.OK && u.Wall > 0 && u.Other.Seconds()/u.Wall.Seconds() > noisyCores {
			out = append(out, noisyPoint{n.Name, u.Other.Seconds() / u.Wall.Seconds()})
		}
	}
	return out
}

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

// perSecond writes a rate; perSecond1 to a tenth.
func perSecond(v float64) string  { return fmt.Sprintf("%.0f/s", v) }
func perSecond1(v float64) string { return fmt.Sprintf("%.1f/s", v) }

// count writes n with a narrow no-break space between thousands
// (10 000 000).
func count(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "\u202f" + s[i:]
	}
	return s
}

func megabytes(n int64) string { return fmt.Sprintf("%d MB", n>>20) }

func micros(ns float64) string { return fmt.Sprintf("%.0f µs", ns/1e3) }

func hundredths(v float64) string { return fmt.Sprintf("%.2f", v) }

// percent is a as a percentage of b.
func percent(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return strconv.FormatFloat(100*a/b, 'f', 0, 64) + " %"
}

// countPercent is the count a as a percentage of the count b.
func countPercent(a, b int) string { return percent(float64(a), float64(b)) }

// percentage writes a fraction as a percentage; percentage1 to a tenth,
// change with its sign (how much higher or lower).
func percentage(v float64) string  { return fmt.Sprintf("%.0f %%", 100*v) }
func percentage1(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }
func change(v float64) string      { return fmt.Sprintf("%+.0f %%", 100*v) }

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
	return times(a / b)
}

func latencyRatio(a, b time.Duration) string { return ratio(float64(a), float64(b)) }

func times(v float64) string { return fmt.Sprintf("%.2f×", v) }

func percentSpread(s spread) string {
	return fmt.Sprintf("%.1f %% (%.1f–%.1f)", 100*s.Median, 100*s.Min, 100*s.Max)
}

func timesSpread(s spread) string { return fmt.Sprintf("%.2f× (%.2f–%.2f)", s.Median, s.Min, s.Max) }

func bytesSpread(s spread) string { return fmt.Sprintf("%.0f B (%.0f–%.0f)", s.Median, s.Min, s.Max) }

// bytesPer is n bytes per request of p.
func bytesPer(n int64, p point) string {
	if p.Requests == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f B", float64(n)/float64(p.Requests))
}

// statuses lists the answers by status code, "0" being a transport error.
func statuses(p point) string {
	codes := slices.Sorted(maps.Keys(p.Statuses))
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

// outcomes lists the answers by what the shot's outcome named them.
func outcomes(p point) string {
	names := slices.Sorted(maps.Keys(p.Outcomes))
	parts := make([]string, len(names))
	for i, name := range names {
		parts[i] = fmt.Sprintf("%s ×%d", name, p.Outcomes[name])
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
		s += " (" + strings.Join(p.Errors[:min(len(p.Errors), 3)], "; ") + ")"
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

// cpuCost is the CPU one request cost this process and PostgreSQL, and the
// cores that anything else kept busy meanwhile.
type cpuCost struct{ Process, Postgres, Other string }

func cpuPer(p point) cpuCost {
	if !p.CPU.OK || p.Requests == 0 {
		return cpuCost{"n/a", "n/a", "n/a"}
	}
	per := func(d time.Duration) string {
		return fmt.Sprintf("%.0f µs", float64(d.Microseconds())/float64(p.Requests))
	}
	return cpuCost{per(p.CPU.Process), per(p.CPU.Postgres), hundredths(p.CPU.Other.Seconds() / p.CPU.Wall.Seconds())}
}

// pgPerRequest is the PostgreSQL CPU one request of p cost.
func pgPerRequest(p point) float64 {
	if !p.CPU.OK || p.Requests == 0 {
		return 0
	}
	return float64(p.CPU.Postgres) / float64(p.Requests)
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}
