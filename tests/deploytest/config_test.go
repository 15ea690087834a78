package deploytest

import (
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/internal/payment/mockchannel"
)

// channelShutdownTimeout is cmd/paymentchannel's shutdownTimeout.
const channelShutdownTimeout = 10 * time.Second

func TestComposeEnvironmentIsWhatTheServiceReads(t *testing.T) {
	p := loadCompose(t)
	known := configVariables(t)

	for _, name := range replicas {
		t.Run(name+" sets only variables the service reads, with valid values", func(t *testing.T) {
			s := service(t, p, name)
			env := environment(t, s)
			for k := range env {
				if !known[k] && !otelVariables[k] {
					t.Errorf("%s sets %s, which neither app.Config nor the OpenTelemetry SDK reads (typo?)", name, k)
				}
			}
			cfg, err := app.LoadConfig(env)
			if err != nil {
				t.Fatalf("app.LoadConfig rejects the compose environment: %v", err)
			}
			if cfg.Payment.ChannelURL == "" {
				t.Errorf("PAYMENT_CHANNEL_URL is empty: each replica would run its own in-process channel")
			}
			if cfg.APIKeys["acme"] != "demo-key-acme" || cfg.APIKeys["globex"] != "demo-key-globex" || len(cfg.APIKeys) != 2 {
				t.Errorf("API keys = %v, want the two demo tenants", cfg.APIKeys)
			}
			if s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) <= cfg.ShutdownTimeout {
				t.Errorf("stop_grace_period must exceed SHUTDOWN_TIMEOUT (%s), or Docker kills requests still draining", cfg.ShutdownTimeout)
			}
		})
	}

	t.Run("the channel sets only variables it reads, with valid values", func(t *testing.T) {
		s := service(t, p, svcChannel)
		env := environment(t, s)
		read := envVariables(t, reflect.TypeFor[mockchannel.Config]())
		for k := range env {
			if !read[k] && !otelVariables[k] {
				t.Errorf("paymentchannel sets %s, which neither mockchannel.Config nor the OpenTelemetry SDK reads (mockchannel.Config reads %v)", k, slices.Sorted(maps.Keys(read)))
			}
		}
		cfg, err := mockchannel.LoadConfig(env)
		if err != nil {
			t.Errorf("mockchannel.LoadConfig rejects the compose environment: %v", err)
		}
		// The replicas resend a key only while the channel remembers it.
		for _, name := range replicas {
			replica, err := app.LoadConfig(environment(t, service(t, p, name)))
			if err == nil && replica.Payment.ChannelKeyWindow > cfg.KeyWindow {
				t.Errorf("%s trusts the channel with a key for %s (PAYMENT_CHANNEL_KEY_WINDOW), but the channel remembers it %s (CHANNEL_KEY_WINDOW)",
					name, replica.Payment.ChannelKeyWindow, cfg.KeyWindow)
			}
		}
		if s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) <= channelShutdownTimeout {
			t.Errorf("paymentchannel stop_grace_period must exceed its %s shutdown timeout", channelShutdownTimeout)
		}
	})
}

// otelVariables are the standard OpenTelemetry variables the service and
// the channel leave to the SDK and its OTLP/HTTP exporter (internal/tracing
// turns tracing on from them); no configuration struct has their tags.
var otelVariables = map[string]bool{
	"OTEL_SDK_DISABLED":                  true,
	"OTEL_SERVICE_NAME":                  true,
	"OTEL_RESOURCE_ATTRIBUTES":           true,
	"OTEL_TRACES_EXPORTER":               true,
	"OTEL_TRACES_SAMPLER":                true,
	"OTEL_TRACES_SAMPLER_ARG":            true,
	"OTEL_EXPORTER_OTLP_ENDPOINT":        true,
	"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": true,
	"OTEL_EXPORTER_OTLP_HEADERS":         true,
	"OTEL_EXPORTER_OTLP_TIMEOUT":         true,
	"OTEL_EXPORTER_OTLP_COMPRESSION":     true,
	"OTEL_BSP_SCHEDULE_DELAY":            true,
	"OTEL_BSP_EXPORT_TIMEOUT":            true,
	"OTEL_BSP_MAX_QUEUE_SIZE":            true,
	"OTEL_BSP_MAX_EXPORT_BATCH_SIZE":     true,
}

// configVariables are the env tags of app.Config: every variable the
// service reads.
func configVariables(t *testing.T) map[string]bool {
	t.Helper()
	vars := envVariables(t, reflect.TypeFor[app.Config]())
	// CLEANUP_BATCH is a group's BATCH under its envPrefix CLEANUP_.
	if !vars["DATABASE_URL"] || !vars["API_KEYS"] || !vars["CLEANUP_BATCH"] {
		t.Fatalf("app.Config env tags not found: %v", vars)
	}
	return vars
}

// envVariables are the variables a configuration struct reads, as the env
// library names them: each group's envPrefix before its fields' env tags.
func envVariables(t *testing.T, typ reflect.Type) map[string]bool {
	t.Helper()
	params, err := env.GetFieldParams(reflect.New(typ).Interface())
	if err != nil {
		t.Fatalf("%s: %v", typ, err)
	}
	vars := map[string]bool{}
	for _, p := range params {
		vars[p.Key] = true
	}
	if len(vars) == 0 {
		t.Fatalf("%s has no env tags", typ)
	}
	return vars
}
