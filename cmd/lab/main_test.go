package main

import (
	"io"
	"testing"
)

// TestDefaultsMatchMakeRun pins the defaults to what `make run` serves, so
// `make lab` needs no flags.
func TestDefaultsMatchMakeRun(t *testing.T) {
	cfg, err := parseConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := config{listen: "localhost:8090"}
	want.BaseURL, want.ChannelURL, want.APIKey = "http://localhost:8080", "http://127.0.0.1:8081", "demo-key-acme"
	if cfg.listen != want.listen || cfg.BaseURL != want.BaseURL || cfg.ChannelURL != want.ChannelURL || cfg.APIKey != want.APIKey || !cfg.Observe {
		t.Errorf("defaults = %+v, want %+v with the lanes observed", cfg, want)
	}

	env := map[string]string{"LAB_ADDR": ":8090", "LAB_SERVICE_URL": "http://lb:8080/", "LAB_CHANNEL_URL": "http://paymentchannel:8081", "LAB_API_KEY": "k"}
	cfg, err = parseConfig([]string{"-api-key", "flag-wins"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen != ":8090" || cfg.BaseURL != "http://lb:8080" || cfg.ChannelURL != "http://paymentchannel:8081" || cfg.APIKey != "flag-wins" {
		t.Errorf("from the environment (compose) and a flag: %+v", cfg)
	}
	if got := browsable(":8090"); got != "localhost:8090" {
		t.Errorf("browsable(:8090) = %q", got)
	}
}
