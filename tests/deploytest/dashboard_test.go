package deploytest

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.yaml.in/yaml/v4"

	"github.com/orderservice/orderservice/lab/lessons"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
	"github.com/orderservice/orderservice/tests/testproc"
)

// dashboardScrapeInterval is how often the test's Prometheus scrapes: the
// lessons last seconds, not the 15s compose scrapes at.
const dashboardScrapeInterval = time.Second

// exemplarsRecordedOn are the histograms internal/metrics gives exemplars
// to (a sampled request's trace id): a latency panel on one of them must
// show some.
var exemplarsRecordedOn = []string{"orderservice_http_request_duration_seconds_bucket",
	"orderservice_command_duration_seconds_bucket", "orderservice_payment_channel_call_duration_seconds_bucket"}

// TestDashboardQueriesReturnDataFromARealPrometheus plays every lesson
// against a service started in-process (a fresh database, the embedded
// channel and NATS) while Debian's Prometheus, run with the compose
// command's flags and deploy/prometheus.yml (its targets and intervals
// changed), scrapes it every second. Then it evaluates every panel's query
// of every dashboard as Grafana would (template variables resolved through
// the label values API, $__rate_interval reckoned from the scrape interval)
// over the run: a query that returns no series, or only NaN, fails and
// names its panel. It also checks what the dashboard relies on besides:
// Prometheus asks for OpenMetrics, the latency panels' exemplars come back
// with a trace_id, legends name labels the series have, and the alert rules
// evaluate without error on the same data. It fails, never skips, without
// the prometheus binary.
func TestDashboardQueriesReturnDataFromARealPrometheus(t *testing.T) {
	promBin := lookPrometheus(t)
	dashboards := loadDashboards(t)
	flags := composePrometheusFlags(t)

	// Every request's trace is sampled, as compose's OTEL_TRACES_SAMPLER
	// says, so the latency buckets carry exemplars; nothing is exported.
	// The provider is this test binary's global one: no other test here
	// starts the service in-process.
	tp := sdktrace.NewTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	dbURL, drop, err := testdb.Create("deploy_dashboard")
	if err != nil {
		t.Fatalf("test database: %v", err)
	}
	t.Cleanup(drop)
	m := apptest.Start(t, dbURL, map[string]string{"PAYMENT_SLOW_DELAY": "1s"})

	// Prometheus scrapes the service through a proxy that notes what it asks
	// for and what it gets.
	scrapes := &scrapeLog{}
	scrapeTarget := scrapes.proxy(t, m.URL())

	prom := startPrometheus(t, promBin, flags, scrapeTarget)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	prom.waitScraped(ctx, t, start)

	// The lessons: every signal the dashboard shows moves.
	var failedChecks []string
	var mu sync.Mutex
	s := lessons.NewSession(lessons.Config{BaseURL: m.URL(), ChannelURL: "http://" + m.ChannelAddr, APIKey: apptest.KeyAcme,
		Tenant: "acme", NATSURL: m.NATSURL, NATSOperator: "orderservice:" + m.Config.NATS.ServicePassword,
		SweepWait: 15 * time.Second, NeighbourAPIKey: apptest.KeyGlobex, NeighbourTenant: "globex"}, func(e lessons.Event) {
		if e.Kind == lessons.KindCheck && !e.OK {
			mu.Lock()
			failedChecks = append(failedChecks, fmt.Sprintf("lesson %d: %s", e.Lesson, e.Text))
			mu.Unlock()
		}
	})
	defer s.Close()
	if err := s.Preflight(ctx); err != nil {
		t.Fatal(err)
	}
	// A lesson that does not pass is told, not failed: lab/lessons's
	// own test holds the lessons, and here they only feed the series the
	// panels read; a panel left without data fails below, by its name.
	lessonsStart := time.Now()
	for _, l := range lessons.All() {
		if l.Pitfall != "" {
			continue // the pitfalls' other half is a naive service nobody scrapes
		}
		if out := s.Play(ctx, l, nil); !out.Passed {
			t.Logf("lesson %d (%s) did not pass: %v", l.Number, l.Title, out.Err)
		}
	}
	if len(failedChecks) > 0 {
		t.Logf("lessons' checks that failed:\n%s", strings.Join(failedChecks, "\n"))
	}
	end := time.Now()
	t.Logf("lessons played in %s", end.Sub(lessonsStart).Round(time.Millisecond))
	// The counters as the lessons left them are scraped.
	prom.waitScraped(ctx, t, end.Add(dashboardScrapeInterval))
	end = time.Now()

	t.Run("Prometheus asks for OpenMetrics, the format that carries exemplars", func(t *testing.T) {
		accept, contentType := scrapes.last()
		if !strings.HasPrefix(accept, "application/openmetrics-text") {
			t.Errorf("Prometheus scrapes with Accept: %q; OpenMetrics must come first or the exemplars are never sent", accept)
		}
		t.Logf("scraped with Accept: %s; answered %s", accept, contentType)
	})

	g := grafanaQuery{start: start, end: end, minInterval: dashboardScrapeInterval}
	for _, d := range dashboards {
		t.Run(d.file, func(t *testing.T) {
			vars := g.resolveVariables(ctx, t, prom.api, d)
			exemplarsSeen := map[string]int{}
			for _, p := range d.queryPanels() {
				for _, tg := range p.Targets {
					what := fmt.Sprintf("panel %q (id %d) target %s", p.name(), p.ID, tg.RefID)
					expr, err := g.interpolate(tg.Expr, vars, p.MaxDataPoints)
					if err != nil {
						t.Errorf("%s: %v", what, err)
						continue
					}
					if err := g.expectData(ctx, prom.api, expr, tg.LegendFormat, g.interval(p.MaxDataPoints)); err != nil {
						t.Errorf("%s draws nothing: %v\n  query: %s", what, err, expr)
					}
					if tg.Exemplar {
						n, err := g.exemplars(ctx, prom.api, expr)
						if err != nil {
							t.Errorf("%s: exemplars: %v\n  query: %s", what, err, expr)
						}
						t.Logf("%s: %d exemplars with a %s", what, n, traceIDLabel)
						for _, h := range exemplarsRecordedOn {
							if mentions(tg.Expr, h) {
								exemplarsSeen[h] += n
							}
						}
					}
				}
			}
			for _, h := range exemplarsRecordedOn {
				if n, shown := exemplarsSeen[h]; shown && n == 0 {
					_, contentType := scrapes.last()
					t.Errorf("no exemplar with a %s came back for the latency panels on %s: either the service exposes none "+
						"(it answered the scrapes with %q; exemplars need OpenMetrics and a sampled trace) or Prometheus "+
						"dropped them (--enable-feature=exemplar-storage)", traceIDLabel, h, contentType)
				}
			}
		})
	}

	t.Run("the alert rules evaluate without error on the same data", func(t *testing.T) {
		var rules struct {
			Groups []struct {
				Rules []struct {
					Name, Type, Health, LastError string
				}
			}
		}
		if err := prom.api.get(ctx, "rules", url.Values{"type": {"alert"}}, &rules); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, group := range rules.Groups {
			for _, r := range group.Rules {
				if r.Type != "alerting" {
					continue
				}
				n++
				if r.Health != "ok" || r.LastError != "" {
					t.Errorf("%s: health %q, error %q", r.Name, r.Health, r.LastError)
				}
			}
		}
		if want := len(loadAlertRules(t)); n != want {
			t.Errorf("Prometheus evaluates %d alert rules, %s has %d", n, alertsFile, want)
		}
	})
}

// lookPrometheus finds the prometheus server binary or fails the test
// saying how to install it.
func lookPrometheus(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("prometheus")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/prometheus"); serr == nil {
			return "/usr/bin/prometheus"
		}
		t.Fatalf("prometheus is not installed (%v): the dashboard's queries cannot be evaluated. "+
			"Install it with `apt-get update && apt-get install -y prometheus` (Debian's package ships the server and promtool).", err)
	}
	return p
}

// composePrometheusFlags are the compose prometheus service's command
// flags, without those this test sets itself (its configuration file, its
// storage and its listen address): Debian's Prometheus must accept them.
func composePrometheusFlags(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, arg := range service(t, loadCompose(t), svcPrometheus).Command {
		name, _, _ := strings.Cut(arg, "=")
		switch name {
		case "--config.file", "--storage.tsdb.path", "--web.listen-address":
			continue
		}
		out = append(out, arg)
	}
	return out
}

// scrapeLog remembers the last scrape's Accept header and answer.
type scrapeLog struct {
	mu                  sync.Mutex
	accept, contentType string
}

func (l *scrapeLog) last() (accept, contentType string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accept, l.contentType
}

// proxy serves serviceURL through a loopback listener that notes each
// request's Accept header and each answer's Content-Type, and returns its
// host:port.
func (l *scrapeLog) proxy(t *testing.T, serviceURL string) string {
	t.Helper()
	u, err := url.Parse(serviceURL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(r *http.Response) error {
		l.mu.Lock()
		l.contentType = r.Header.Get("Content-Type")
		l.mu.Unlock()
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		l.accept = r.Header.Get("Accept")
		l.mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// prometheusServer is a running Prometheus and its HTTP API.
type prometheusServer struct {
	proc *testproc.Process
	api  promAPI
}

// promAPI reads Prometheus's HTTP API, /api/v1/. (client_golang's
// api/prometheus/v1 would need json-iterator, a module go.mod does not
// have; this test needs five endpoints.)
type promAPI struct{ base string }

// get reads endpoint with params into data, the "data" member of the
// answer, or returns the error the answer gives.
func (a promAPI) get(ctx context.Context, endpoint string, params url.Values, data any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/api/v1/"+endpoint+"?"+params.Encode(), nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	var answer struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.NewDecoder(res.Body).Decode(&answer); err != nil {
		return fmt.Errorf("%s: %d, %w", endpoint, res.StatusCode, err)
	}
	if answer.Status != "success" {
		return fmt.Errorf("%s: %s: %s", endpoint, answer.ErrorType, answer.Error)
	}
	return json.Unmarshal(answer.Data, data)
}

// promTime is a time as the API's parameters take it.
func promTime(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

func (a promAPI) queryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) (model.Matrix, error) {
	var data struct {
		ResultType string       `json:"resultType"`
		Result     model.Matrix `json:"result"`
	}
	err := a.get(ctx, "query_range", url.Values{"query": {expr}, "start": {promTime(start)}, "end": {promTime(end)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}, &data)
	if err == nil && data.ResultType != "matrix" {
		err = fmt.Errorf("a %s, not a matrix", data.ResultType)
	}
	return data.Result, err
}

func (a promAPI) labelValues(ctx context.Context, label string, match []string, start, end time.Time) ([]string, error) {
	var values []string
	err := a.get(ctx, "label/"+label+"/values", url.Values{"match[]": match, "start": {promTime(start)}, "end": {promTime(end)}}, &values)
	return values, err
}

// promExemplars are query_exemplars' answer: exemplars by series.
type promExemplars []struct {
	SeriesLabels model.LabelSet `json:"seriesLabels"`
	Exemplars    []struct {
		Labels model.LabelSet `json:"labels"`
	} `json:"exemplars"`
}

func (a promAPI) queryExemplars(ctx context.Context, expr string, start, end time.Time) (promExemplars, error) {
	var data promExemplars
	err := a.get(ctx, "query_exemplars", url.Values{"query": {expr}, "start": {promTime(start)}, "end": {promTime(end)}}, &data)
	return data, err
}

// promTargets are the active targets of /api/v1/targets.
type promTargets struct {
	Active []struct {
		Health     string    `json:"health"`
		LastScrape time.Time `json:"lastScrape"`
		LastError  string    `json:"lastError"`
	} `json:"activeTargets"`
}

// startPrometheus runs bin with flags on deploy/prometheus.yml, changed
// only where this test must: its one job scrapes target every
// dashboardScrapeInterval, its rule file is found from a temporary folder,
// and it listens on a free loopback port with a storage of its own. It is
// stopped when the test ends, and its log shown if the test failed.
func startPrometheus(t *testing.T, bin string, flags []string, target string) *prometheusServer {
	t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(readConfig(t, promConfigFile)), &cfg); err != nil {
		t.Fatalf("%s: %v", promConfigFile, err)
	}
	global, _ := cfg["global"].(map[string]any)
	if global == nil {
		t.Fatalf("%s has no global section", promConfigFile)
	}
	interval := model.Duration(dashboardScrapeInterval).String()
	global["scrape_interval"], global["evaluation_interval"] = interval, interval
	var rules []any
	for _, rf := range cfg["rule_files"].([]any) {
		rules = append(rules, filepath.Join(absRoot(t), filepath.Dir(promConfigFile), rf.(string)))
	}
	cfg["rule_files"] = rules
	jobs, _ := cfg["scrape_configs"].([]any)
	if len(jobs) != 1 {
		t.Fatalf("%s has %d scrape_configs, want the one job of the replicas", promConfigFile, len(jobs))
	}
	job := jobs[0].(map[string]any)
	if job["job_name"] != "orderservice" {
		t.Fatalf("%s scrapes job %v, want orderservice (the dashboard's up{job=\"orderservice\"})", promConfigFile, job["job_name"])
	}
	job["static_configs"] = []any{map[string]any{"targets": []any{target}}}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}

	addr := testproc.FreeAddr(t)
	args := append([]string{"--config.file=" + cfgPath, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr}, flags...)
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	proc, err := testproc.Launch("prometheus", cmd)
	logFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := proc.Stop(10 * time.Second); err != nil {
			t.Log(err)
			proc.Kill(t)
		}
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("prometheus %s\nits configuration:\n%s\nits log:\n%s", strings.Join(args, " "), b, out)
		}
	})
	if err := proc.WaitOK("http://"+addr+"/-/ready", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return &prometheusServer{proc: proc, api: promAPI{base: "http://" + addr}}
}

// waitScraped returns once Prometheus has scraped the target successfully
// after since.
func (p *prometheusServer) waitScraped(ctx context.Context, t *testing.T, since time.Time) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var targets promTargets
		if err := p.api.get(ctx, "targets", url.Values{"state": {"active"}}, &targets); err != nil {
			last = err.Error()
			continue
		}
		if len(targets.Active) == 1 {
			a := targets.Active[0]
			if a.Health == "up" && a.LastScrape.After(since) {
				return
			}
			last = fmt.Sprintf("health %s, last scrape %s, error %q", a.Health, a.LastScrape.Format(time.RFC3339Nano), a.LastError)
		} else {
			last = fmt.Sprintf("%d active targets", len(targets.Active))
		}
	}
	t.Fatalf("Prometheus did not scrape the service after %s: %s", since.Format(time.RFC3339Nano), last)
}

// grafanaQuery evaluates a panel's query the way Grafana's Prometheus
// data source does over the time range [start, end], the data source's
// timeInterval (the scrape interval) being minInterval.
type grafanaQuery struct {
	start, end  time.Time
	minInterval time.Duration
}

// defaultMaxDataPoints stands in for a panel's width in pixels, which
// Grafana divides the range by when the panel sets no maxDataPoints.
const defaultMaxDataPoints = 1000

// interval is $__interval: the range over the data points, rounded up to
// a whole second, never below the scrape interval. It is also the step.
func (g grafanaQuery) interval(maxDataPoints int) time.Duration {
	if maxDataPoints <= 0 {
		maxDataPoints = defaultMaxDataPoints
	}
	d := (g.end.Sub(g.start) / time.Duration(maxDataPoints)).Round(time.Second)
	return max(d, g.minInterval)
}

// interpolate replaces the template variables of expr: the dashboard's
// (vars, already formatted for a regex matcher) and Grafana's own.
// $__rate_interval is max($__interval + scrape interval, 4 × scrape
// interval), as Grafana reckons it.
func (g grafanaQuery) interpolate(expr string, vars map[string]string, maxDataPoints int) (string, error) {
	iv := g.interval(maxDataPoints)
	rng := g.end.Sub(g.start).Round(time.Second)
	builtin := map[string]string{
		"__interval":      model.Duration(iv).String(),
		"__interval_ms":   strconv.FormatInt(iv.Milliseconds(), 10),
		"__rate_interval": model.Duration(max(iv+g.minInterval, 4*g.minInterval)).String(),
		"__range":         model.Duration(rng).String(),
		"__range_s":       strconv.FormatInt(int64(rng.Seconds()), 10),
	}
	var unknown []string
	out := templateRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := templateRef.FindStringSubmatch(ref)
		name := m[1] + m[2]
		if v, ok := builtin[name]; ok {
			return v
		}
		if v, ok := vars[name]; ok {
			return v
		}
		unknown = append(unknown, ref)
		return ref
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown template variables %v", unknown)
	}
	return out, nil
}

// resolveVariables asks Prometheus for every query variable's values,
// as Grafana does to fill its drop-down, and formats the selection for
// the queries: all of them ("All" selected) as a regex alternation, each
// value regex-escaped.
func (g grafanaQuery) resolveVariables(ctx context.Context, t *testing.T, a promAPI, d dashboard) map[string]string {
	t.Helper()
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		m := labelValuesQuery.FindStringSubmatch(v.queryText())
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(...)", v.Name, v.queryText())
			continue
		}
		var match []string
		if m[1] != "" {
			match = []string{m[1]}
		}
		values, err := a.labelValues(ctx, m[2], match, g.start, g.end)
		if err != nil || len(values) == 0 {
			t.Errorf("variable %s: %s has no values (%v): every panel using $%s would be empty", v.Name, v.queryText(), err, v.Name)
			continue
		}
		switch {
		case v.IncludeAll && v.AllValue != "":
			vars[v.Name] = v.AllValue
		case v.IncludeAll || v.Multi:
			escaped := make([]string, len(values))
			for i, val := range values {
				escaped[i] = promRegexEscape(val)
			}
			vars[v.Name] = "(" + strings.Join(escaped, "|") + ")"
		default:
			vars[v.Name] = strings.NewReplacer(`\`, `\\`, `'`, `\\'`).Replace(values[0])
		}
	}
	return vars
}

// promRegexEscape is Grafana's escaping of a multi-value variable's value
// for a regex matcher: a backslash, doubled for the PromQL string, before
// each regex metacharacter.
func promRegexEscape(v string) string {
	var b strings.Builder
	for _, r := range v {
		switch {
		case r == '\\':
			b.WriteString(`\\\\`)
		case strings.ContainsRune(`$^*{}[]'+?.()|`, r):
			b.WriteString(`\\`)
			b.WriteRune(r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// legendLabel finds the labels a legend format names: {{label}}.
var legendLabel = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

// expectData runs expr as a range query with the panel's step and returns
// why it would draw nothing: no series, only NaN, or a legend naming a
// label a series lacks (Grafana would print the braces).
func (g grafanaQuery) expectData(ctx context.Context, a promAPI, expr, legend string, step time.Duration) error {
	matrix, err := a.queryRange(ctx, expr, g.start, g.end, step)
	if err != nil {
		return err
	}
	if len(matrix) == 0 {
		return fmt.Errorf("no series between %s and %s", g.start.Format(time.TimeOnly), g.end.Format(time.TimeOnly))
	}
	numbers := 0
	for _, s := range matrix {
		for _, p := range s.Values {
			if !math.IsNaN(float64(p.Value)) {
				numbers++
			}
		}
		for _, m := range legendLabel.FindAllStringSubmatch(legend, -1) {
			if _, has := s.Metric[model.LabelName(m[1])]; !has {
				return fmt.Errorf("legend %q names %s, which series %s lacks", legend, m[1], s.Metric)
			}
		}
	}
	if numbers == 0 {
		return fmt.Errorf("%d series, every sample NaN (a quantile or a ratio of nothing)", len(matrix))
	}
	return nil
}

// exemplars asks Prometheus for the exemplars of expr's series over the
// range, as Grafana does for a target with exemplar: true, and counts those
// that carry a trace id (32 hex digits in traceIDLabel).
func (g grafanaQuery) exemplars(ctx context.Context, a promAPI, expr string) (int, error) {
	res, err := a.queryExemplars(ctx, expr, g.start, g.end)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range res {
		for _, e := range r.Exemplars {
			if traceID.MatchString(string(e.Labels[traceIDLabel])) {
				n++
			}
		}
	}
	return n, nil
}

var traceID = regexp.MustCompile(`^[0-9a-f]{32}$`)
