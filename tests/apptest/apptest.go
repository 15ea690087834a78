// Package apptest is the tests' kit, imported by tests only: it boots the
// real service for end-to-end tests (the same app.Start that main uses, on
// loopback ports chosen by the kernel, against the test package's own
// database), sends requests as a tenant, and holds the assertions every
// package's tests share (assert.go: problem documents, replays, records,
// the channel's counters). tests/testdb and tests/testproc are its
// database and process halves.
package apptest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/testdb"
)

// Keys of the two demo tenants every test service knows.
const (
	KeyAcme   = "test-key-acme"
	KeyGlobex = "test-key-globex"
)

// Config returns a test configuration: loopback listeners on :0, the
// embedded channel, an embedded NATS server of its own, a short lease and
// sweep so recovery tests run fast. env overrides any variable. Unless env
// names CHANNEL_DATABASE_URL (a restart test passes the same one to both
// starts), the embedded channel gets a fresh database of its own, dropped
// when the test ends, so every service starts with a channel that has
// charged nothing.
func Config(t testing.TB, dbURL string, env map[string]string) app.Config {
	t.Helper()
	base := map[string]string{
		"DATABASE_URL":            dbURL,
		"HTTP_ADDR":               "127.0.0.1:0",
		"CHANNEL_ADDR":            "127.0.0.1:0",
		"API_KEYS":                "acme=" + KeyAcme + ",globex=" + KeyGlobex,
		"IDEMPOTENCY_LEASE":       "3s",
		"PAYMENT_CHANNEL_TIMEOUT": "2s",
		"PAYMENT_RETRY_AFTER":     "1s",
		"SWEEP_INTERVAL":          "200ms",
		"PAYMENT_SLOW_DELAY":      "300ms",
		"SHUTDOWN_TIMEOUT":        "10s",
		"LOG_LEVEL":               "warn",
		"DB_MAX_CONNS":            "10",
		// Each test service runs its own embedded NATS server.
		"NATS_EMBEDDED_ADDR": "127.0.0.1:0",
		"NATS_STORE_DIR":     t.TempDir(),
		"COMMAND_BACKOFF":    "20ms",
		"COMMAND_ACK_WAIT":   "2s",
		// Storms in tests prove exactly-once, not load shedding, on machines
		// of any speed: queue rather than refuse (admission_test sets its own).
		"HTTP_QUEUE_TIMEOUT": "30s",
	}
	for k, v := range env {
		base[k] = v
	}
	if _, set := env["CHANNEL_DATABASE_URL"]; !set && base["PAYMENT_CHANNEL_URL"] == "" {
		base["CHANNEL_DATABASE_URL"] = testdb.Fresh(t, "channel")
	}
	cfg, err := app.LoadConfig(base)
	if err != nil {
		t.Fatalf("test config: %v", err)
	}
	return cfg
}

// LessonEnv is what the tests that play the lessons (the lab's, the
// demo's, the lessons' own) start the service with: pm_slow outlasts the
// moment lesson 4 sends its duplicates, and a channel call has room beyond
// it on a machine loaded by the whole suite (a call past its timeout is an
// unknown outcome, and a lesson's story another one); the lease exceeds
// the call by a second, as the configuration requires.
var LessonEnv = map[string]string{"PAYMENT_SLOW_DELAY": "1s", "PAYMENT_CHANNEL_TIMEOUT": "5s", "IDEMPOTENCY_LEASE": "6s"}

// Start boots the service and closes it when the test ends.
func Start(t testing.TB, dbURL string, env map[string]string) *app.Main {
	t.Helper()
	cfg := Config(t, dbURL, env)
	logger := slog.New(slog.NewJSONHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := app.Start(context.Background(), cfg, logger)
	if err != nil {
		t.Fatalf("start service: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close service: %v", err)
		}
	})
	return m
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Response is an HTTP answer read whole.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into a generic map (or fails the test).
func (r Response) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("response body is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

// Client sends requests as one tenant.
type Client struct {
	BaseURL string
	APIKey  string
	HTTP    *http.Client
}

// NewClient returns a client of m's API for the tenant with apiKey.
func NewClient(m *app.Main, apiKey string) *Client {
	return &Client{BaseURL: m.URL(), APIKey: apiKey, HTTP: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
}

// Do sends method path with an optional Idempotency-Key and JSON body
// (a string or []byte is sent as it is; anything else is marshalled).
func (c *Client) Do(t testing.TB, method, path, key string, body any) Response {
	t.Helper()
	resp, err := c.Send(method, path, key, body, nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// Send is Do without the test: for goroutines, which must not call Fatal.
func (c *Client) Send(method, path, key string, body any, header http.Header) (Response, error) {
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return Response{}, err
		}
		r = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, c.BaseURL+path, r)
	if err != nil {
		return Response{}, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if _, given := header["Authorization"]; c.APIKey != "" && !given {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.HTTP.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return Response{Status: res.StatusCode, Header: res.Header, Body: b}, err
}
