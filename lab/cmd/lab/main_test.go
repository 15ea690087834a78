package main

import (
	"io"
	"testing"
)

// TestDefaultsMatchMakeRun pins the defaults to what `make run` serves
// (its embedded NATS on 127.0.0.1:4223 and its service password), so
// `make lab` needs no flags.
func TestDefaultsMatchMakeRun(t *testing.T) {
	cfg, err := parseConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{listen: "localhost:8090"}
	want.BaseURL, want.ChannelURL, want.APIKey = "http://localhost:8080", "http://127.0.0.1:8081", "demo-key-acme"
	if cfg.listen != want.listen || cfg.BaseURL != want.BaseURL || cfg.ChannelURL != want.ChannelURL || cfg.APIKey != want.APIKey || !cfg.Observe ||
		cfg.Tenant != "acme" || cfg.NATSURL != "nats://127.0.0.1:4223" || cfg.NATSOperator != "orderservice:orderservice-dev-secret" {
		t.Errorf("defaults = %+v, want %+v with the lanes observed", cfg, want)
	}
	if cfg.NaiveDatabaseURL != "postgres://postgres:postgres@localhost:5432/naiveorders?sslmode=disable" || cfg.TraceURL != "" {
		t.Errorf("defaults: the naive service's database %q (want database naiveorders on make run's server), trace URL %q (want none)",
			cfg.NaiveDatabaseURL, cfg.TraceURL)
	}

	env := map[string]string{"LAB_ADDR": ":8090", "LAB_SERVICE_URL": "http://lb:8080/", "LAB_CHANNEL_URL": "http://paymentchannel:8081", "LAB_API_KEY": "k",
		"LAB_TENANT": "globex", "LAB_NATS_URL": "nats://nats:4222", "LAB_NATS_OPERATOR": "orderservice:s",
		"LAB_NAIVE_DATABASE_URL": "postgres://postgres:postgres@postgres:5432/naiveorders", "LAB_TRACE_URL": "http://localhost:16686/trace/{trace_id}"}
	cfg, err = parseConfig([]string{"-api-key", "flag-wins"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen != ":8090" || cfg.BaseURL != "http://lb:8080" || cfg.ChannelURL != "http://paymentchannel:8081" || cfg.APIKey != "flag-wins" ||
		cfg.Tenant != "globex" || cfg.NATSURL != "nats://nats:4222" || cfg.NATSOperator != "orderservice:s" ||
		cfg.NaiveDatabaseURL != "postgres://postgres:postgres@postgres:5432/naiveorders" || cfg.TraceURL != "http://localhost:16686/trace/{trace_id}" {
		t.Errorf("from the environment (compose) and a flag: %+v", cfg)
	}
	if got := browsable(":8090"); got != "localhost:8090" {
		t.Errorf("browsable(:8090) = %q", got)
	}
}
