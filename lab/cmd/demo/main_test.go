package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/orderservice/orderservice/lab/lessons"
	"github.com/orderservice/orderservice/tests/apptest"
	"github.com/orderservice/orderservice/tests/testdb"
)

// dbURL is this package's own database, created fresh by TestMain.
var dbURL string

func TestMain(m *testing.M) {
	os.Exit(testdb.Main(func(url string) int { dbURL = url; return m.Run() }, "demo"))
}

// TestDemoPassesAgainstTheRealService plays every scenario against the
// service booted in-process, so the demo cannot rot: a change in behaviour
// that breaks a lesson's story fails here.
func TestDemoPassesAgainstTheRealService(t *testing.T) {
	m := apptest.Start(t, dbURL, apptest.LessonEnv)

	play := func(t *testing.T) string {
		t.Helper()
		// A bound against a hang, with room for a run under the whole
		// suite's load (about 25s idle, over a minute loaded).
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var stdout, stderr bytes.Buffer
		args := []string{"-url", m.URL(), "-channel", "http://" + m.ChannelAddr, "-api-key", apptest.KeyAcme, "-sweep-wait", "15s",
			"-tenant", "acme", "-nats-url", m.NATSURL, "-nats-operator", "orderservice:" + m.Config.NATS.ServicePassword,
			"-naive-database", dbURL, "-neighbour-api-key", apptest.KeyGlobex}
		// NO_COLOR is unset: the output is plain because a buffer is no terminal.
		err := run(ctx, args, func(string) string { return "" }, &stdout, &stderr)
		if err != nil {
			t.Errorf("the demo failed: %v\nstderr: %s\noutput:\n%s", err, stderr.String(), stdout.String())
		}
		if os.Getenv("DEMO_SHOW") != "" {
			t.Log(stdout.String())
		}
		return stdout.String()
	}

	t.Run("every scenario passes", func(t *testing.T) {
		out := play(t)
		summary := out[strings.LastIndex(out, "Summary:"):]
		list := lessons.All()
		for i, s := range list {
			if line := fmt.Sprintf("✓ %d. %s", i+1, s.Title); !strings.Contains(summary, line) {
				t.Errorf("the summary does not mark scenario %d passed; want %q in:\n%s", i+1, line, summary)
			}
		}
		if want := fmt.Sprintf("%d of %d scenarios passed", len(list), len(list)); !strings.Contains(summary, want) {
			t.Errorf("the summary does not say %q:\n%s", want, summary)
		}
		if strings.Contains(out, "✗") {
			t.Errorf("the output marks a failed check:\n%s", out)
		}
		if strings.Contains(out, "\x1b[") {
			t.Errorf("plain output (not a terminal) contains ANSI escapes:\n%q", out)
		}
		// A newcomer meets each name explained before it is used.
		first := strings.Index(out, "\n1. ")
		for _, name := range []string{"R1", "O9", "O10"} {
			if i := strings.Index(out, name); i < 0 || i > first {
				t.Errorf("%s is used before it is explained: the header before lesson 1 says\n%s", name, out[:max(first, 0)])
			}
		}
		// Lesson 11's note does not call its replay "not replayed".
		if strings.Contains(out, "Not replayed: the replay") {
			t.Errorf("lesson 11 still says \"Not replayed: the replay resumed…\":\n%s", out)
		}
		// Lesson 15's table shows the ignored webhooks, and says why.
		if strings.Contains(out, `outcome="ignored"}`) && !strings.Contains(out, `outcome="ignored" +`) {
			t.Errorf("lesson 15 shows webhooks with outcome=\"ignored\" and does not say why:\n%s", out[strings.Index(out, "\n15. "):])
		}
	})

	t.Run("a second run against the same database passes too", func(t *testing.T) {
		play(t) // fresh keys per run: nothing collides with the first run
	})
}

// TestColourOnlyOnATerminal pins the rule: colour on a terminal, plain
// in a pipe or a file, and never with NO_COLOR.
func TestColourOnlyOnATerminal(t *testing.T) {
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want bool
	}{
		{"a buffer is no terminal", nil, nil, false},
		{"forced on", []string{"-color", "always"}, nil, true},
		{"NO_COLOR wins over auto", nil, map[string]string{"NO_COLOR": "1"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			cfg, err := parseConfig(c.args, env(c.env), &out, &out)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.color != c.want {
				t.Errorf("color = %v, want %v", cfg.color, c.want)
			}
		})
	}
}

// TestOnlyTakesNumbersAndRanges: -only 4,16-18 plays 4, 16, 17 and 18.
func TestOnlyTakesNumbersAndRanges(t *testing.T) {
	var out bytes.Buffer
	cfg, err := parseConfig([]string{"-only", "4, 16-18"}, func(string) string { return "" }, &out, &out)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]bool{4: true, 16: true, 17: true, 18: true}; !maps.Equal(cfg.only, want) {
		t.Errorf("-only 4,16-18 = %v, want %v", cfg.only, want)
	}
	for _, bad := range []string{"0", "7-3", "x", "3-"} {
		if _, err := parseConfig([]string{"-only", bad}, func(string) string { return "" }, &out, &out); err == nil {
			t.Errorf("-only %q was taken", bad)
		}
	}
}

// TestDefaultsMatchMakeRun pins the broker defaults to what `make run`
// serves: its embedded NATS on 127.0.0.1:4223, tenant acme of the demo key,
// and the service's NATS user with the default NATS_SERVICE_PASSWORD.
func TestDefaultsMatchMakeRun(t *testing.T) {
	var out bytes.Buffer
	cfg, err := parseConfig(nil, func(string) string { return "" }, &out, &out)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.APIKey != "demo-key-acme" || cfg.Tenant != "acme" || cfg.NATSURL != "nats://127.0.0.1:4223" ||
		cfg.NATSOperator != "orderservice:orderservice-dev-secret" {
		t.Errorf("defaults = key %q, tenant %q, NATS %q, operator %q", cfg.APIKey, cfg.Tenant, cfg.NATSURL, cfg.NATSOperator)
	}
	if cfg.NaiveDatabaseURL != "postgres://postgres:postgres@localhost:5432/naiveorders?sslmode=disable" {
		t.Errorf("the pitfalls' naive service defaults to %q, want database naiveorders on make run's server", cfg.NaiveDatabaseURL)
	}
	env := map[string]string{"DEMO_TENANT": "globex", "DEMO_NATS_URL": "nats://nats:4222", "DEMO_NATS_OPERATOR": "u:p",
		"DEMO_NAIVE_DATABASE_URL": "postgres://db/naive"}
	cfg, err = parseConfig([]string{"-nats-operator", ""}, func(k string) string { return env[k] }, &out, &out)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tenant != "globex" || cfg.NATSURL != "nats://nats:4222" || cfg.NATSOperator != "" || cfg.NaiveDatabaseURL != "postgres://db/naive" {
		t.Errorf("from the environment, the operator emptied by a flag: %+v", cfg.Config)
	}
}
