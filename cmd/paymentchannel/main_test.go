package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/webhook"
	"github.com/orderservice/orderservice/tests/testdb"
)

// started is one run of the binary's run function.
type started struct {
	url    string
	cancel context.CancelFunc
	done   chan error
}

// start runs the channel with env until stop, and waits for its listening
// log line.
func start(t *testing.T, env map[string]string) *started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	logs, logWriter := io.Pipe()
	s := &started{cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := run(ctx, []string{"paymentchannel"}, env, logWriter, io.Discard)
		logWriter.CloseWithError(err)
		s.done <- err
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "payment channel listening" {
				addr <- line.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		s.url = "http://" + a
	case err := <-s.done:
		t.Fatalf("run returned before listening: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no listening log line within 20s")
	}
	return s
}

// stop cancels the run, as SIGTERM does, and expects a clean return.
func (s *started) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("run = %v, want nil after shutdown", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not stop within 10s")
	}
}

func send(t *testing.T, method, url, key, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestRun(t *testing.T) {
	t.Run("serves health on the bound address and stops on cancel", func(t *testing.T) {
		s := start(t, map[string]string{"HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "debug",
			"CHANNEL_DATABASE_URL": testdb.Fresh(t, "paymentchannel")})
		if code, _, body := send(t, http.MethodGet, s.url+"/healthz", "", ""); code != http.StatusOK {
			t.Errorf("GET /healthz = %d %s, want 200", code, body)
		}
		s.stop(t)
	})

	t.Run("a channel restarted on its database forgets nothing", func(t *testing.T) {
		env := map[string]string{"HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "info",
			"CHANNEL_DATABASE_URL": testdb.Fresh(t, "paymentchannel")}
		const charge = `{"amount":2500,"currency":"EUR","reference":"order-1","payment_method":"pm_ok"}`
		first := start(t, env)
		code, _, made := send(t, http.MethodPost, first.url+"/v1/charges", "k1", charge)
		if code != http.StatusCreated {
			t.Fatalf("charge = %d %s", code, made)
		}
		first.stop(t)

		second := start(t, env)
		if code, _, found := send(t, http.MethodGet, second.url+"/v1/charges?idempotency_key=k1", "", ""); code != http.StatusOK || found != made {
			t.Errorf("lookup after the restart = %d %s, want 200 %s", code, found, made)
		}
		code, h, again := send(t, http.MethodPost, second.url+"/v1/charges", "k1", charge)
		if code != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" || again != made {
			t.Errorf("retry after the restart = %d replayed=%q %s, want %s replayed", code, h.Get("Idempotent-Replayed"), again, made)
		}
		_, _, stats := send(t, http.MethodGet, second.url+"/admin/stats", "", "")
		var st struct {
			Charges            int64 `json:"charges"`
			Requests           int64 `json:"requests"`
			Lookups            int64 `json:"lookups"`
			DuplicatesAbsorbed int64 `json:"duplicates_absorbed"`
		}
		if err := json.Unmarshal([]byte(stats), &st); err != nil ||
			st.Charges != 1 || st.Requests != 2 || st.Lookups != 1 || st.DuplicatesAbsorbed != 1 {
			t.Errorf("stats after the restart = %s, want 1 charge, 2 requests, 1 lookup, 1 duplicate absorbed", stats)
		}
		second.stop(t)
	})

	t.Run("refuses invalid configuration with the variable named, in one line", func(t *testing.T) {
		for name, env := range map[string]map[string]string{
			"HTTP_ADDR":                    {"HTTP_ADDR": "no-port"},
			"PAYMENT_SLOW_DELAY":           {"PAYMENT_SLOW_DELAY": "two seconds"},
			"LOG_LEVEL":                    {"LOG_LEVEL": "loud"},
			"CHANNEL_DATABASE_URL":         {"CHANNEL_DATABASE_URL": "mysql://x"},
			"PAYMENT_ASYNC_DELAY":          {"PAYMENT_ASYNC_DELAY": "0s"},
			"CHANNEL_WEBHOOK_URL":          {"CHANNEL_WEBHOOK_URL": "ftp://receiver"},
			"CHANNEL_WEBHOOK_RETRY_WINDOW": {"CHANNEL_WEBHOOK_RETRY_WINDOW": "-2h"},
			"PAYMENT_WEBHOOK_SECRET":       {"PAYMENT_WEBHOOK_SECRET": "whsec_dG9vIHNob3J0"},
		} {
			err := run(context.Background(), []string{"paymentchannel"}, env, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%v: run = %v, want an error naming %s", env, err, name)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("%v: error is not one line: %q", env, err)
			}
		}
		for _, bad := range []string{"-1s", "0s"} {
			err := run(context.Background(), []string{"paymentchannel"}, map[string]string{"PAYMENT_SLOW_DELAY": bad}, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), "PAYMENT_SLOW_DELAY") {
				t.Errorf("PAYMENT_SLOW_DELAY=%s: run = %v, want it refused", bad, err)
			}
		}
	})

	t.Run("delivers signed webhooks to CHANNEL_WEBHOOK_URL", func(t *testing.T) {
		const secret = "whsec_Y2hhbm5lbC10ZXN0cy13ZWJob29rLXNlY3JldC0zMmI="
		verified := make(chan error, 10)
		receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			verified <- webhook.Verify([]string{secret}, r.Header, body, time.Now(), time.Minute)
		}))
		defer receiver.Close()
		s := start(t, map[string]string{"HTTP_ADDR": "127.0.0.1:0", "CHANNEL_DATABASE_URL": testdb.Fresh(t, "paymentchannel"),
			"CHANNEL_WEBHOOK_URL": receiver.URL, "PAYMENT_WEBHOOK_SECRET": secret + ",whsec_b3JkZXJzZXJ2aWNlLWRldi13ZWJob29rLXNlY3JldCE="})
		const charge = `{"amount":100,"currency":"EUR","reference":"order-1","payment_method":"pm_ok"}`
		if code, _, body := send(t, http.MethodPost, s.url+"/v1/charges", "k1", charge); code != http.StatusCreated {
			t.Fatalf("charge = %d %s", code, body)
		}
		select {
		case err := <-verified:
			if err != nil {
				t.Errorf("the webhook does not verify with the first secret: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no webhook within 10s")
		}
		s.stop(t)
	})

	t.Run("reports a bind error at start, naming HTTP_ADDR", func(t *testing.T) {
		env := map[string]string{"HTTP_ADDR": "256.0.0.1:0"}
		err := run(context.Background(), []string{"paymentchannel"}, env, io.Discard, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), "HTTP_ADDR=256.0.0.1:0: ") || !strings.Contains(err.Error(), "set HTTP_ADDR") {
			t.Errorf("run = %v, want a listen error naming HTTP_ADDR", err)
		}
	})

	t.Run("reports an unreachable database at start, naming CHANNEL_DATABASE_URL", func(t *testing.T) {
		env := map[string]string{"HTTP_ADDR": "127.0.0.1:0",
			"CHANNEL_DATABASE_URL": "postgres://postgres@127.0.0.1:1/paymentchannel?sslmode=disable&connect_timeout=2"}
		err := run(context.Background(), []string{"paymentchannel"}, env, io.Discard, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), "CHANNEL_DATABASE_URL: ") || !strings.Contains(err.Error(), "payment channel database") {
			t.Errorf("run = %v, want a database error naming CHANNEL_DATABASE_URL", err)
		}
	})
}
