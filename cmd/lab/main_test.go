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

	env := map[string]string{"LAB_ADDR": ":8090", "LAB_SERVICE_URL": "http://lb:8080/", "LAB_CHANNEL_URL": "http://paymentchannel:8081", "LAB_API_KEY": "k",
		"LAB_TENANT": "globex", "LAB_NATS_URL": "nats://nats:4222", "LAB_NATS_OPERATOR": "orderservice:s"}
	cfg, err = parseConfig([]string{"-api-key", "flag-wins"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen != ":8090" || cfg.BaseURL != "http://lb:8080" || cfg.ChannelURL != "http://paymentchannel:8081" || cfg.APIKey != "flag-wins" ||
		cfg.Tenant != "globex" || cfg.NATSURL != "nats://nats:4222" || cfg.NATSOperator != "orderservice:s" {
		t.Errorf("from the environment (compose) and a flag: %+v", cfg)
	}
	if got := browsable(":8090"); got != "localhost:8090" {
		t.Errorf("browsable(:8090) = %q", got)
	}
}
