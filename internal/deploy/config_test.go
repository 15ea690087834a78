package deploy

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/internal/app"
)

// channelVariables are the variables cmd/paymentchannel reads (its
// parseConfig); the binaries test proves the channel accepts their values.
var channelVariables = []string{"HTTP_ADDR", "PAYMENT_SLOW_DELAY", "LOG_LEVEL"}

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
				if !known[k] {
					t.Errorf("%s sets %s, which app.Config does not read (typo?)", name, k)
				}
			}
			cfg, err := app.LoadConfig(env)
			if err != nil {
				t.Fatalf("app.LoadConfig rejects the compose environment: %v", err)
			}
			if cfg.PaymentChannelURL == "" {
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

	t.Run("the channel sets only variables it reads", func(t *testing.T) {
		s := service(t, p, svcChannel)
		for k, v := range environment(t, s) {
			if !slices.Contains(channelVariables, k) {
				t.Errorf("paymentchannel sets %s, which it does not read (it reads %v)", k, channelVariables)
			}
			if k == "PAYMENT_SLOW_DELAY" {
				if d, err := time.ParseDuration(v); err != nil || d <= 0 {
					t.Errorf("PAYMENT_SLOW_DELAY = %q, want a positive duration", v)
				}
			}
		}
		if s.StopGracePeriod == nil || time.Duration(*s.StopGracePeriod) <= channelShutdownTimeout {
			t.Errorf("paymentchannel stop_grace_period must exceed its %s shutdown timeout", channelShutdownTimeout)
		}
	})
}

// configVariables are the env tags of app.Config: every variable the
// service reads.
func configVariables(t *testing.T) map[string]bool {
	t.Helper()
	vars := map[string]bool{}
	typ := reflect.TypeFor[app.Config]()
	for f := range typ.Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" {
			vars[name] = true
		}
	}
	if !vars["DATABASE_URL"] || !vars["API_KEYS"] {
		t.Fatalf("app.Config env tags not found: %v", vars)
	}
	return vars
}
