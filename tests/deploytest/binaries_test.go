package deploytest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/lab/lessons"
	"github.com/orderservice/orderservice/tests/testdb"
	"github.com/orderservice/orderservice/tests/testproc"
)

// TestBinariesWithComposeConfiguration runs the binaries the image contains,
// built with the Dockerfile's flags, with the environment docker-compose.yml
// gives them. Only what compose itself provides is changed: listen
// addresses become loopback ports, the databases are fresh test ones, and
// the trace backend is a loopback OTLP receiver of the test's.
func TestBinariesWithComposeConfiguration(t *testing.T) {
	p := loadCompose(t)
	bins := buildImageBinaries(t, buildArgs(t, service(t, p, svcReplica1)))

	dbURL, drop, err := testdb.Create("deploy")
	if err != nil {
		t.Fatalf("test database: %v", err)
	}
	t.Cleanup(drop)

	chSvc := service(t, p, svcChannel)
	chEnv := environment(t, chSvc)
	chAddr := testproc.FreeAddr(t)
	chEnv["HTTP_ADDR"] = chAddr
	chEnv["CHANNEL_DATABASE_URL"] = testdb.Fresh(t, "deploy_channel") // created by the channel itself
	chTraces := startOTLPReceiver(t)
	chEnv["OTEL_EXPORTER_OTLP_ENDPOINT"] = chTraces.URL // compose: jaeger
	channel := startProcess(t, svcChannel, bins[chSvc.Entrypoint[0]], chEnv)
	channelURL := "http://" + chAddr
	waitOK(t, channel, channelURL+"/healthz")

	repSvc := service(t, p, svcReplica1)
	env := environment(t, repSvc)
	env["DATABASE_URL"] = dbURL
	env["PAYMENT_CHANNEL_URL"] = channelURL
	env["NATS_URL"] = loopbackNATSURL(t, env["NATS_URL"], startNATSFromConf(t)) // the compose broker, from its own file
	addr := testproc.FreeAddr(t)
	env["HTTP_ADDR"] = addr
	ordersTraces := startOTLPReceiver(t)
	env["OTEL_EXPORTER_OTLP_ENDPOINT"] = ordersTraces.URL
	orders := startProcess(t, svcReplica1, bins["/orderservice"], env) // the image's ENTRYPOINT
	ordersURL := "http://" + addr
	waitOK(t, orders, ordersURL+"/readyz")

	labSvc := service(t, p, svcLab)
	labEnv := environment(t, labSvc)
	labAddr := testproc.FreeAddr(t)
	labEnv["LAB_ADDR"] = labAddr
	labEnv["LAB_SERVICE_URL"] = ordersURL // compose: lb, in front of this replica and its twin
	labEnv["LAB_CHANNEL_URL"] = channelURL
	lab := startProcess(t, svcLab, bins[labSvc.Entrypoint[0]], labEnv)
	labURL := "http://" + labAddr
	waitOK(t, lab, labURL+"/healthz")

	t.Run("the compose healthchecks pass", func(t *testing.T) {
		for svc, hostPort := range map[string]string{svcChannel: chAddr, svcReplica1: addr, svcLab: labAddr} {
			test := service(t, p, svc).HealthCheck.Test // ["CMD", "/healthcheck", URL]
			probe, err := url.Parse(test[2])
			if err != nil {
				t.Fatal(err)
			}
			probe.Host = hostPort
			if code, out := runHealthcheck(t, bins[test[1]], probe.String()); code != 0 {
				t.Errorf("%s healthcheck %s exited %d: %s", svc, probe, code, out)
			}
		}
	})

	t.Run("the healthcheck fails without a 2xx answer", func(t *testing.T) {
		unavailable := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		defer unavailable.Close()
		for name, args := range map[string][]string{
			"503":                {unavailable.URL + "/readyz"},
			"connection refused": {"http://" + testproc.FreeAddr(t) + "/healthz"},
			"two arguments":      {unavailable.URL, unavailable.URL},
		} {
			if code, out := runHealthcheck(t, bins["/healthcheck"], args...); code != 1 {
				t.Errorf("%s: healthcheck exited %d, want 1 (%s)", name, code, out)
			}
		}
	})

	t.Run("an order is created once and paid once", func(t *testing.T) {
		cfg, err := app.LoadConfig(environment(t, repSvc))
		if err != nil {
			t.Fatal(err)
		}
		key := cfg.APIKeys["acme"]
		body := `{"customer_id":"cust-deploy","currency":"EUR","items":[{"sku":"SKU-1","quantity":2,"unit_price":1250}]}`

		created := call(t, http.MethodPost, ordersURL+"/v1/orders", key, "deploy-create-1", body)
		var order struct {
			ID          string `json:"id"`
			Status      string `json:"status"`
			TotalAmount int64  `json:"total_amount"`
		}
		created.expect(t, http.StatusCreated, &order)
		if order.Status != "CREATED" || order.TotalAmount != 2500 {
			t.Fatalf("created order = %+v, want CREATED with total 2500", order)
		}
		if loc := created.header.Get("Location"); loc != "/v1/orders/"+order.ID {
			t.Errorf("Location = %q, want /v1/orders/%s", loc, order.ID)
		}

		replay := call(t, http.MethodPost, ordersURL+"/v1/orders", key, "deploy-create-1", body)
		replay.expect(t, http.StatusCreated, nil)
		if replay.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(replay.body, created.body) {
			t.Errorf("retried create: replayed %q, body %s; want the first body replayed", replay.header.Get("Idempotent-Replayed"), replay.body)
		}

		payURL := ordersURL + "/v1/orders/" + order.ID + "/pay"
		paid := call(t, http.MethodPost, payURL, key, "deploy-pay-1", `{"payment_method":"pm_ok"}`)
		paid.expect(t, http.StatusOK, &order)
		if order.Status != "PAID" {
			t.Fatalf("paid order status = %s, want PAID", order.Status)
		}
		call(t, http.MethodPost, payURL, key, "deploy-pay-1", `{"payment_method":"pm_ok"}`).expect(t, http.StatusOK, nil)

		var stats struct {
			Charges            int64 `json:"charges"`
			Refunds            int64 `json:"refunds"`
			DuplicatesAbsorbed int64 `json:"duplicates_absorbed"`
		}
		call(t, http.MethodGet, channelURL+"/admin/stats", "", "", "").expect(t, http.StatusOK, &stats)
		if stats.Charges != 1 || stats.Refunds != 0 || stats.DuplicatesAbsorbed != 0 {
			t.Errorf("channel stats = %+v, want exactly one charge and nothing else", stats)
		}
	})

	t.Run("the lab serves its page and the lessons, and reads the channel's faults", func(t *testing.T) {
		page := call(t, http.MethodGet, labURL+"/", "", "", "")
		page.expect(t, http.StatusOK, nil)
		if !bytes.Contains(page.body, []byte(`<script type="module" src="app.js">`)) {
			t.Errorf("GET / is not the lab's page: %.200s", page.body)
		}
		var list struct {
			Lessons []struct {
				Number int `json:"number"`
			} `json:"lessons"`
			Service string `json:"service"`
		}
		call(t, http.MethodGet, labURL+"/api/lessons", "", "", "").expect(t, http.StatusOK, &list)
		if want := len(lessons.All()); len(list.Lessons) != want || list.Service != ordersURL {
			t.Errorf("lab lists %d lessons against %q, want %d against %s", len(list.Lessons), list.Service, want, ordersURL)
		}
		var faults map[string]float64
		call(t, http.MethodGet, labURL+"/api/faults", "", "", "").expect(t, http.StatusOK, &faults)
		if _, ok := faults["unavailable_rate"]; !ok {
			t.Errorf("lab's /api/faults = %v, want the channel's faults", faults)
		}
	})

	t.Run("every process exits 0 on SIGTERM", func(t *testing.T) {
		for _, p := range []*testproc.Process{lab, orders, channel} { // dependants first, as compose stops them
			if err := p.Stop(5 * time.Second); err != nil {
				t.Error(err)
			}
		}
	})

	// The spans of the order above, flushed at the latest by the stop.
	t.Run("the replica and the channel export their spans over OTLP, each under its OTEL_SERVICE_NAME", func(t *testing.T) {
		for _, c := range []struct {
			sink *testproc.OTLPReceiver
			env  map[string]string
			svc  string
		}{{ordersTraces, env, svcReplica1}, {chTraces, chEnv, svcChannel}} {
			name := c.env["OTEL_SERVICE_NAME"]
			if exports, spans := c.sink.Received(); spans[name] == 0 {
				t.Errorf("%s: %d OTLP exports reached %s/v1/traces, with spans by service.name %v: none of %q", c.svc, exports, c.sink.URL, spans, name)
			}
		}
	})
}

// buildImageBinaries builds every binary the image contains (or only the
// image paths given), with the Dockerfile's own go build flags, its ARGs
// given args (the build arguments; the others keep their defaults), and
// maps each image path (/orderservice) to the binary built here.
func buildImageBinaries(t *testing.T, args map[string]string, only ...string) map[string]string {
	t.Helper()
	d := parseDockerfile(t)
	dir := t.TempDir()
	bins := map[string]string{}
	byFlags := map[string][]string{} // one go build per flag set shares the compile work
	for imagePath, pkg := range d.imageBinaries(t) {
		if len(only) > 0 && !slices.Contains(only, imagePath) {
			continue
		}
		for _, b := range d.builds {
			if b.pkg == pkg {
				key := strings.Join(d.expand(b.flags, args), "\x00")
				byFlags[key] = append(byFlags[key], pkg)
			}
		}
		bins[imagePath] = filepath.Join(dir, filepath.Base(imagePath)) // go names a module's .../v2 after its last element but the version
	}
	for key, pkgs := range byFlags {
		args := []string{"build"}
		if key != "" {
			args = append(args, strings.Split(key, "\x00")...)
		}
		args = append(append(args, "-o", dir+string(filepath.Separator)), pkgs...)
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	return bins
}

// startProcess runs bin with exactly a compose service's environment, as in
// the container.
func startProcess(t *testing.T, name, bin string, env map[string]string) *testproc.Process {
	t.Helper()
	p, err := testproc.Start(t, name, bin, testproc.Env(env))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitOK polls url until it answers 200, failing if the process exits.
func waitOK(t *testing.T, p *testproc.Process, url string) {
	t.Helper()
	if err := p.WaitOK(url, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// runHealthcheck runs the probe binary and returns its exit code and output.
func runHealthcheck(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("run %s: %v", bin, err)
	}
	return cmd.ProcessState.ExitCode(), strings.TrimSpace(string(out))
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// call sends one request; apiKey and idempotencyKey are omitted when empty.
func call(t *testing.T, method, url, apiKey, idempotencyKey, body string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	if idempotencyKey != "" {
		req.Header.Set("Idempotency-Key", idempotencyKey)
	}
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// expect fails the test unless the status is want, then decodes into v.
func (r response) expect(t *testing.T, want int, v any) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d: %s", r.status, want, r.body)
	}
	if v != nil {
		if err := json.Unmarshal(r.body, v); err != nil {
			t.Fatalf("decode %s: %v", r.body, err)
		}
	}
}

func startOTLPReceiver(t *testing.T) *testproc.OTLPReceiver {
	t.Helper()
	r, err := testproc.StartOTLPReceiver()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}
