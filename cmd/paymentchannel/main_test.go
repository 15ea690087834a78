package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	t.Run("serves health on the bound address and stops on cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		logs, logWriter := io.Pipe()
		env := map[string]string{"HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "debug"}
		done := make(chan error, 1)
		go func() {
			err := run(ctx, []string{"paymentchannel"}, func(k string) string { return env[k] }, logWriter, io.Discard)
			logWriter.CloseWithError(err)
			done <- err
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
		var base string
		select {
		case a := <-addr:
			base = "http://" + a
		case err := <-done:
			t.Fatalf("run returned before listening: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("no listening log line within 5s")
		}

		resp, err := http.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /healthz = %d, want 200", resp.StatusCode)
		}

		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run = %v, want nil after shutdown", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("run did not stop within 5s")
		}
	})

	t.Run("refuses invalid configuration with the variable named", func(t *testing.T) {
		for name, env := range map[string]map[string]string{
			"HTTP_ADDR":          {"HTTP_ADDR": "no-port"},
			"PAYMENT_SLOW_DELAY": {"PAYMENT_SLOW_DELAY": "two seconds"},
			"LOG_LEVEL":          {"LOG_LEVEL": "loud"},
		} {
			err := run(context.Background(), []string{"paymentchannel"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%v: run = %v, want an error naming %s", env, err, name)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("%v: error is not one line: %q", env, err)
			}
		}
		if err := run(context.Background(), []string{"paymentchannel"}, func(k string) string {
			return map[string]string{"PAYMENT_SLOW_DELAY": "-1s"}[k]
		}, io.Discard, io.Discard); err == nil {
			t.Error("a negative PAYMENT_SLOW_DELAY was accepted")
		}
	})

	t.Run("reports a bind error at start", func(t *testing.T) {
		env := map[string]string{"HTTP_ADDR": "256.0.0.1:0"}
		err := run(context.Background(), []string{"paymentchannel"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "listening on") {
			t.Errorf("run = %v, want a listen error", err)
		}
	})
}
