package deploytest

import (
	"encoding/json"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"go.yaml.in/yaml/v4"
)

// The observability stack of issue #33: Grafana's provisioning under
// deploy/grafana/, and where compose mounts it.
const (
	grafanaProvisioning      = "deploy/grafana/provisioning"
	grafanaDatasources       = "deploy/grafana/provisioning/datasources/datasources.yml"
	grafanaDashboardProvider = "deploy/grafana/provisioning/dashboards/dashboards.yml"
	grafanaDashboards        = "deploy/grafana/dashboards"
	// grafanaProvisioningInCompose is the image's GF_PATHS_PROVISIONING.
	grafanaProvisioningInCompose = "/etc/grafana/provisioning"
	// traceIDLabel is the exemplar label internal/metrics puts a sampled
	// request's trace id in, and the one Grafana's Prometheus data source
	// links to the trace backend.
	traceIDLabel = "trace_id"
)

// The ports the trace backend and Grafana listen on in their images.
const (
	jaegerUIPort       = 16686
	jaegerOTLPGRPCPort = 4317
	jaegerOTLPHTTPPort = 4318
	grafanaPort        = 3000
	prometheusPort     = 9090
)

func TestComposeRunsTheTraceBackendAndGrafana(t *testing.T) {
	p := loadCompose(t)

	t.Run("jaeger is a pinned all-in-one image with OTLP and the UI published", func(t *testing.T) {
		j := service(t, p, svcJaeger)
		if !pinnedImage(j.Image, "jaegertracing/jaeger", "jaegertracing/all-in-one") {
			t.Errorf("jaeger image = %q, want jaegertracing/jaeger (v2) or jaegertracing/all-in-one at a pinned version", j.Image)
		}
		for _, port := range []uint32{jaegerUIPort, jaegerOTLPGRPCPort, jaegerOTLPHTTPPort} {
			expectPublished(t, j, port)
		}
	})

	t.Run("grafana is the pinned OSS image, publishes 3000 and lets anonymous visitors view", func(t *testing.T) {
		g := service(t, p, svcGrafana)
		if !pinnedImage(g.Image, "grafana/grafana") {
			t.Errorf("grafana image = %q, want grafana/grafana (OSS) at a pinned version", g.Image)
		}
		expectPublished(t, g, grafanaPort)
		env := environment(t, g)
		if env["GF_AUTH_ANONYMOUS_ENABLED"] != "true" || env["GF_AUTH_ANONYMOUS_ORG_ROLE"] != "Viewer" {
			t.Errorf("grafana anonymous access: enabled %q, role %q; want true and Viewer (never Editor or Admin)",
				env["GF_AUTH_ANONYMOUS_ENABLED"], env["GF_AUTH_ANONYMOUS_ORG_ROLE"])
		}
	})

	t.Run("grafana mounts its provisioning and the dashboards read-only from deploy/grafana/", func(t *testing.T) {
		g := service(t, p, svcGrafana)
		for _, want := range []struct{ source, target string }{
			{grafanaProvisioning, grafanaProvisioningInCompose},
			{grafanaDashboards, dashboardsInCompose(t)},
		} {
			src, ok := boundHostPath(g.Volumes, want.target)
			if !ok || src != filepath.Join(absRoot(t), want.source) {
				t.Errorf("grafana sees %s at %s? got %q (volumes %v)", want.source, want.target, src, g.Volumes)
			}
			if fi := mustExist(t, want.source); !fi.IsDir() {
				t.Errorf("%s is not a folder", want.source)
			}
		}
		for _, file := range []string{grafanaDatasources, grafanaDashboardProvider} {
			if fi := mustExist(t, file); !fi.Mode().IsRegular() {
				t.Errorf("%s is not a file", file)
			}
		}
		home := environment(t, g)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
		src, ok := boundHostPath(g.Volumes, home)
		if !ok {
			t.Fatalf("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH %q is in no read-only mount", home)
		}
		if _, err := os.Stat(src); err != nil || filepath.Dir(src) != filepath.Join(absRoot(t), grafanaDashboards) {
			t.Errorf("the home dashboard %s is %s on the host (%v), want a file of %s", home, src, err, grafanaDashboards)
		}
	})

	t.Run("the replicas and the channel send their traces to jaeger's OTLP/HTTP port, each under its name", func(t *testing.T) {
		for name, want := range map[string]string{svcReplica1: "orderservice", svcReplica2: "orderservice", svcChannel: "paymentchannel"} {
			env := environment(t, service(t, p, name))
			u, err := url.Parse(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
			if err != nil || u.Scheme != "http" || u.Host != svcJaeger+":4318" || strings.Trim(u.Path, "/") != "" {
				t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT = %q, want http://%s:%d (OTLP/HTTP; the exporter adds /v1/traces)",
					name, env["OTEL_EXPORTER_OTLP_ENDPOINT"], svcJaeger, jaegerOTLPHTTPPort)
			}
			if got := env["OTEL_SERVICE_NAME"]; got != want {
				t.Errorf("%s: OTEL_SERVICE_NAME = %q, want %q", name, got, want)
			}
			if s, ok := env["OTEL_TRACES_SAMPLER"]; ok && !slices.Contains([]string{"always_on", "always_off", "traceidratio",
				"parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"}, s) {
				t.Errorf("%s: OTEL_TRACES_SAMPLER = %q is no sampler the SDK knows", name, s)
			}
		}
	})

	t.Run("the lab links each answer to its trace in jaeger's published UI", func(t *testing.T) {
		raw := environment(t, service(t, p, svcLab))["LAB_TRACE_URL"]
		u, err := url.Parse(strings.ReplaceAll(raw, "{trace_id}", "0af7651916cd43dd8448eb211c80319c"))
		if err != nil || !strings.Contains(raw, "{trace_id}") || u.Scheme != "http" || u.Hostname() != "localhost" ||
			u.Port() != "16686" || u.Path != "/trace/0af7651916cd43dd8448eb211c80319c" {
			t.Errorf("LAB_TRACE_URL = %q, want http://localhost:%d/trace/{trace_id} (the browser opens it)", raw, jaegerUIPort)
		}
	})

	t.Run("prometheus keeps exemplars and reads the mounted configuration", func(t *testing.T) {
		prom := service(t, p, svcPrometheus)
		if !pinnedImage(prom.Image, "prom/prometheus") {
			t.Errorf("prometheus image = %q, want prom/prometheus at a pinned version", prom.Image)
		}
		if !slices.Contains(prometheusFeatures(prom.Command), "exemplar-storage") {
			t.Errorf("prometheus command %q lacks --enable-feature=exemplar-storage: the trace ids on the latency buckets would be dropped", prom.Command)
		}
		if !slices.Contains(prom.Command, "--config.file="+promConfigInCompose) {
			t.Errorf("prometheus command %q does not read %s, where compose mounts %s", prom.Command, promConfigInCompose, promConfigFile)
		}
		// A command replaces the image's, so its storage flag must be kept.
		if !slices.Contains(prom.Command, "--storage.tsdb.path=/prometheus") {
			t.Errorf("prometheus command %q drops the image's --storage.tsdb.path=/prometheus", prom.Command)
		}
	})
}

// pinnedImage reports whether image is one of repos at a tag that names a
// version (not latest, not none).
func pinnedImage(image string, repos ...string) bool {
	repo, tag, ok := strings.Cut(image, ":")
	return ok && slices.Contains(repos, repo) && tag != "latest" && regexp.MustCompile(`^v?\d+\.\d+`).MatchString(tag)
}

// prometheusFeatures are the --enable-feature values of a command.
func prometheusFeatures(cmd types.ShellCommand) []string {
	var out []string
	for _, arg := range cmd {
		if v, ok := strings.CutPrefix(arg, "--enable-feature="); ok {
			out = append(out, strings.Split(v, ",")...)
		}
	}
	return out
}

// datasource is one entry of datasources.yml.
type datasource struct {
	Name      string         `yaml:"name"`
	UID       string         `yaml:"uid"`
	Type      string         `yaml:"type"`
	URL       string         `yaml:"url"`
	IsDefault bool           `yaml:"isDefault"`
	JSONData  map[string]any `yaml:"jsonData"`
}

// loadDatasources reads the provisioned data sources, by type.
func loadDatasources(t *testing.T) map[string]datasource {
	t.Helper()
	var file struct {
		APIVersion  int          `yaml:"apiVersion"`
		Datasources []datasource `yaml:"datasources"`
	}
	if err := yaml.Unmarshal([]byte(readConfig(t, grafanaDatasources)), &file); err != nil {
		t.Fatalf("%s: %v", grafanaDatasources, err)
	}
	byType := map[string]datasource{}
	for _, ds := range file.Datasources {
		if _, dup := byType[ds.Type]; dup || ds.UID == "" {
			t.Errorf("%s: data source %q: a second one of type %q, or no uid", grafanaDatasources, ds.Name, ds.Type)
		}
		byType[ds.Type] = ds
	}
	if file.APIVersion != 1 || len(byType) != 2 || byType["prometheus"].UID == "" || byType["jaeger"].UID == "" {
		t.Fatalf("%s: want apiVersion 1 and exactly a prometheus and a jaeger data source, got %+v", grafanaDatasources, file)
	}
	return byType
}

// dashboardsInCompose is where the dashboards provider reads its files in
// the grafana container.
func dashboardsInCompose(t *testing.T) string {
	t.Helper()
	var file struct {
		APIVersion int `yaml:"apiVersion"`
		Providers  []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	if err := yaml.Unmarshal([]byte(readConfig(t, grafanaDashboardProvider)), &file); err != nil {
		t.Fatalf("%s: %v", grafanaDashboardProvider, err)
	}
	if file.APIVersion != 1 || len(file.Providers) != 1 || file.Providers[0].Type != "file" || !path.IsAbs(file.Providers[0].Options.Path) {
		t.Fatalf("%s: want one file provider with an absolute options.path, got %+v", grafanaDashboardProvider, file)
	}
	return file.Providers[0].Options.Path
}

func TestGrafanaDataSourcesPointAtTheComposeServices(t *testing.T) {
	p := loadCompose(t)
	ds := loadDatasources(t)
	prom, jaeger := ds["prometheus"], ds["jaeger"]

	for _, c := range []struct {
		ds      datasource
		service string
		port    int
	}{{prom, svcPrometheus, prometheusPort}, {jaeger, svcJaeger, jaegerUIPort}} {
		service(t, p, c.service) // exists
		u, err := url.Parse(c.ds.URL)
		if err != nil || u.Scheme != "http" || u.Hostname() != c.service || u.Port() != strconv.Itoa(c.port) {
			t.Errorf("data source %s: url %q, want http://%s:%d", c.ds.Name, c.ds.URL, c.service, c.port)
		}
	}
	if !prom.IsDefault {
		t.Errorf("the Prometheus data source is not the default one")
	}

	// $__rate_interval is reckoned from the data source's scrape interval:
	// it must be Prometheus's.
	var promCfg struct {
		Global struct {
			ScrapeInterval string `yaml:"scrape_interval"`
		} `yaml:"global"`
	}
	if err := yaml.Unmarshal([]byte(readConfig(t, promConfigFile)), &promCfg); err != nil {
		t.Fatal(err)
	}
	if got := prom.JSONData["timeInterval"]; got != promCfg.Global.ScrapeInterval {
		t.Errorf("Prometheus data source timeInterval = %v, want %s's scrape_interval %q", got, promConfigFile, promCfg.Global.ScrapeInterval)
	}

	// An exemplar's trace_id opens the trace in the Jaeger data source.
	dests, _ := prom.JSONData["exemplarTraceIdDestinations"].([]any)
	found := false
	for _, d := range dests {
		m, _ := d.(map[string]any)
		found = found || (m["name"] == traceIDLabel && m["datasourceUid"] == jaeger.UID)
	}
	if !found {
		t.Errorf("Prometheus data source exemplarTraceIdDestinations = %v, want {name: %s, datasourceUid: %s}", dests, traceIDLabel, jaeger.UID)
	}
}

// dashboard is a Grafana dashboard JSON, as far as these tests read it.
type dashboard struct {
	file       string
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []templateVariable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int           `json:"id"`
	Type        string        `json:"type"`
	Title       string        `json:"title"`
	Description string        `json:"description"`
	Datasource  *datasourceID `json:"datasource"`
	Targets     []target      `json:"targets"`
	Panels      []panel       `json:"panels"` // a collapsed row's
	GridPos     struct {
		H, W, X, Y int
	} `json:"gridPos"`
	MaxDataPoints int `json:"maxDataPoints"`
	// row is the title of the row the panel is under ("" above the first).
	row string
}

type target struct {
	RefID        string        `json:"refId"`
	Expr         string        `json:"expr"`
	LegendFormat string        `json:"legendFormat"`
	Exemplar     bool          `json:"exemplar"`
	Format       string        `json:"format"`
	Datasource   *datasourceID `json:"datasource"`
}

type datasourceID struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type templateVariable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Datasource *datasourceID   `json:"datasource"`
	Query      json.RawMessage `json:"query"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
}

// queryText is a query variable's query, given as a string or as
// {"query": "..."}.
func (v templateVariable) queryText() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var q struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.Query, &q)
	return q.Query
}

// loadDashboards reads every dashboard file the provider serves.
func loadDashboards(t *testing.T) []dashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, grafanaDashboards, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboard in %s (%v)", grafanaDashboards, err)
	}
	var out []dashboard
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := dashboard{file: filepath.Base(f)}
		dec := json.NewDecoder(strings.NewReader(string(b)))
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, d)
	}
	return out
}

// queryPanels are the dashboard's panels that query, collapsed rows'
// included, each knowing its row.
func (d dashboard) queryPanels() []panel {
	var out []panel
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Title
			for _, c := range p.Panels {
				c.row = row
				out = append(out, c)
			}
			continue
		}
		p.row = row
		out = append(out, p)
	}
	return out
}

// name is how a failure names the panel.
func (p panel) name() string {
	if p.row == "" {
		return strings.TrimSpace(p.Title)
	}
	return p.row + " / " + p.Title
}

// issueSignals are what issue #33 asks the dashboard to show, each with
// the series that show it.
var issueSignals = map[string][]string{
	"replays":                           {"orderservice_idempotent_requests_total", "orderservice_messages_replayed_total"},
	"key conflicts":                     {"orderservice_idempotency_key_conflicts_total"},
	"PROCESSING timeouts":               {"orderservice_idempotency_processing_expired", "orderservice_idempotency_takeovers_total"},
	"record growth":                     {"orderservice_idempotency_records", "orderservice_idempotency_table_bytes"},
	"downstream duplicate rejections":   {"orderservice_payment_channel_duplicates_absorbed_total"},
	"RED per route":                     {"orderservice_http_request_duration_seconds_count", "orderservice_http_request_duration_seconds_bucket"},
	"rate and errors per command":       {"orderservice_messages_received_total", "orderservice_messages_redelivered_total", "orderservice_messages_dead_lettered_total"},
	"duration per command":              {"orderservice_command_duration_seconds_bucket"},
	"the database pool":                 {"go_sql_in_use_connections", "go_sql_max_open_connections", "go_sql_wait_duration_seconds_total"},
	"shedding":                          {"orderservice_http_requests_shed_total"},
	"refusals by tenant (issue #49)":    {"orderservice_http_refused_total", "orderservice_http_tenant_requests_total"},
	"outbox lag":                        {"orderservice_outbox_lag_seconds"},
	"DLQ depth":                         {"orderservice_dlq_depth"},
	"webhook outcomes":                  {"orderservice_webhooks_received_total"},
	"the channel's latency and outcome": {"orderservice_payment_channel_call_duration_seconds_bucket"},
}

// mentions reports whether expr names the series metric (a whole name, not
// a prefix of a longer one).
func mentions(expr, metric string) bool {
	return regexp.MustCompile(`(^|[^A-Za-z0-9_:])` + regexp.QuoteMeta(metric) + `($|[^A-Za-z0-9_:])`).MatchString(expr)
}

// templateRef finds the variables an expression uses: $name, ${name} and
// ${name:format}.
var templateRef = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)`)

func TestDashboardIsWellFormedAndShowsWhatTheIssueAsks(t *testing.T) {
	ds := loadDatasources(t)
	promUID := ds["prometheus"].UID
	for _, d := range loadDashboards(t) {
		t.Run(d.file, func(t *testing.T) {
			if d.UID == "" || d.Title == "" {
				t.Errorf("uid %q, title %q: both are needed (links and the provider key on the uid)", d.UID, d.Title)
			}
			vars := map[string]bool{}
			for _, v := range d.Templating.List {
				vars[v.Name] = true
				if v.Type != "query" || v.Datasource == nil || v.Datasource.UID != promUID || !labelValuesQuery.MatchString(v.queryText()) {
					t.Errorf("variable %s: want a label_values(...) query on the Prometheus data source (%s), got type %q, %v, %q",
						v.Name, promUID, v.Type, v.Datasource, v.queryText())
				}
			}
			ids := map[int]bool{}
			for _, p := range d.Panels {
				if ids[p.ID] || p.ID == 0 {
					t.Errorf("panel %q: id %d is zero or taken", p.Title, p.ID)
				}
				ids[p.ID] = true
				if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H <= 0 {
					t.Errorf("panel %q: gridPos %+v does not fit the 24 columns", p.Title, p.GridPos)
				}
			}
			var exprs []string
			for _, p := range d.queryPanels() {
				if p.Datasource == nil || p.Datasource.UID != promUID || len(p.Targets) == 0 {
					t.Errorf("panel %q: want targets on the Prometheus data source %q, got %v with %d targets", p.name(), promUID, p.Datasource, len(p.Targets))
				}
				if strings.TrimSpace(p.Description) == "" {
					t.Errorf("panel %q has no description: say what it watches", p.name())
				}
				refs := map[string]bool{}
				for _, tg := range p.Targets {
					if tg.RefID == "" || refs[tg.RefID] || strings.TrimSpace(tg.Expr) == "" {
						t.Errorf("panel %q: target %q has no expr, or its refId is empty or taken", p.name(), tg.RefID)
					}
					refs[tg.RefID] = true
					if tg.Datasource != nil && tg.Datasource.UID != promUID {
						t.Errorf("panel %q target %s: data source %v, want %s", p.name(), tg.RefID, tg.Datasource, promUID)
					}
					for _, m := range templateRef.FindAllStringSubmatch(tg.Expr, -1) {
						if name := m[1] + m[2]; !vars[name] && !grafanaBuiltins[name] {
							t.Errorf("panel %q target %s: $%s is neither a dashboard variable nor one of Grafana's", p.name(), tg.RefID, name)
						}
					}
					// A latency panel shows its exemplars: a slow bucket opens a trace.
					if bucket := strings.Contains(tg.Expr, "_bucket"); bucket != tg.Exemplar {
						t.Errorf("panel %q target %s: exemplar = %v, want it on exactly the latency histograms' queries (_bucket)", p.name(), tg.RefID, tg.Exemplar)
					}
					exprs = append(exprs, tg.Expr)
				}
			}
			for signal, series := range issueSignals {
				for _, s := range series {
					if !slices.ContainsFunc(exprs, func(e string) bool { return mentions(e, s) }) {
						t.Errorf("no panel shows %s (%s): issue #33 asks for it", signal, s)
					}
				}
			}
		})
	}
}

// labelValuesQuery is a query variable Grafana's Prometheus data source
// answers from the label values API: label_values(selector, label) or
// label_values(label).
var labelValuesQuery = regexp.MustCompile(`^label_values\((?:(.+),\s*)?(\w+)\)$`)

// grafanaBuiltins are the variables Grafana itself sets in a query.
var grafanaBuiltins = map[string]bool{"__interval": true, "__interval_ms": true, "__rate_interval": true, "__range": true, "__range_s": true}
